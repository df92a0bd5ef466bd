"""The producing and killing half of test_client_groups_e2e.py, run as its own process (Ray 2.60 reads
RAY_AUTH_MODE when it is imported, so a driver of a `ray start` cluster is started with it set).

Produces through ``rocketray.client.Producer`` until --stop-file exists; after 300 acknowledged sends
SIGKILLs the consumer --kill-pid, then kills each broker group's master in turn, waiting for writes
to resume after each. Prints one JSON line: the acknowledged msg_ids and the SendUnknown count.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading

import ray

from rocketray.actors.cluster import connect
from rocketray.client import Producer, SendUnknown
from rocketray.waiting import wait_for


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cluster", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--kill-pid", type=int, required=True)
    args = p.parse_args()
    ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
    cluster = connect(args.cluster)
    acked: set[str] = set()
    unknown = [0]
    stop = threading.Event()

    def produce() -> None:
        with Producer(args.cluster) as producer:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    acked.add(producer.send(args.topic, f"payment {i}".encode(), key=f"account-{i % 50}").msg_id)
                except SendUnknown:
                    unknown[0] += 1

    sender = threading.Thread(target=produce, daemon=True)
    sender.start()
    wait_for(lambda: len(acked) >= 300, 120, "300 acknowledged sends before the first kill")
    os.kill(args.kill_pid, signal.SIGKILL)                          # a consumer crash: no leave, no commit
    kills = []
    for group in cluster.spec.groups:                               # each broker group's master
        master = cluster.wait_for_master(group, 60)
        before = len(acked)
        cluster.kill_broker(group, master, wait_restart=False)
        kills.append([group, master])
        wait_for(lambda: len(acked) >= before + 200, 120, f"writes to resume after killing {group}'s master")
    stop.set()
    sender.join(120)
    assert not sender.is_alive(), "the producer did not stop"
    print(json.dumps({"acked": sorted(acked), "unknown": unknown[0], "kills": kills}))


if __name__ == "__main__":
    main()
