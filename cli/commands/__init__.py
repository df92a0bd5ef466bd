"""One module per ``rocketray`` subcommand; see cli/main.py."""
