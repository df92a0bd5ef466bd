"""Chaos: nemesis schedules, run histories, checkers and the live chaos runners."""
