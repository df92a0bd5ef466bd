"""Chaos runners that drive a real cluster: workloads, nemeses through proxies, verdicts."""
