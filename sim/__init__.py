"""The deterministic simulator: seeded world, virtual time, simulated disk and network, running the real cores."""
