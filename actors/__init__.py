"""Ray actors, cluster bootstrap, clients, chaos, CLI and driver glue (everything that touches Ray)."""
