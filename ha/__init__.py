"""AutoSwitch replication between the replicas of a group over TCP."""
