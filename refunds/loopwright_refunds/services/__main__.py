"""``python -m loopwright_refunds.services``: see `services.serve`."""

from loopwright_refunds.services.serve import main

if __name__ == "__main__":
    main()
