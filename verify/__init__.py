"""Ray-free verification: run histories, checkers, linearizability, models, nemesis schedules."""
