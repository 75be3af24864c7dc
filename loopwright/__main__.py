from loopwright.cli import main

main()
