"""The controller: replicated metadata of every broker group, master election, heartbeats."""
