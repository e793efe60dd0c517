from fuse_cli.launch import main

main()
