"""The ``rocketray`` command line: ``main`` dispatches to one module per subcommand under ``commands/``."""
