"""Formats that cross a process or a disk, on the bottom floor (docs/architecture.md): they import
nothing of rocketray's subpackages, and every other package may import them."""
