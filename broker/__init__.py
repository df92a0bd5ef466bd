"""One replica: the message store and its controller-facing logic."""
