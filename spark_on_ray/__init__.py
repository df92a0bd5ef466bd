"""Offset and epoch analytics with PySpark running on Ray through RayDP."""
