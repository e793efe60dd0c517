from fuse_cli.cli import main

main()
