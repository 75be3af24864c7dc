"""``python -m services``: see `services.serve`."""

from services.serve import main

if __name__ == "__main__":
    main()
