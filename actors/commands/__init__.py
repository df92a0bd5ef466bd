"""One module per ``rocketray`` subcommand; see actors/cli.py."""
