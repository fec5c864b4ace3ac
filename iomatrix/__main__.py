from iomatrix.cli.app import main

main()
