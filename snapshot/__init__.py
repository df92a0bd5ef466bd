"""Controller snapshots after RIP-59: file format, retention, fallback."""
