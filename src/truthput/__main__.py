from truthput.cli import main

main()
