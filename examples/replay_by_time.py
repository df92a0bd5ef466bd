"""Replay by time (docs/client.md, "Replay"): a group that reads every queue from the first message
stored in the last hour, and a stopped group moved to a point in time.

    python examples/replay_by_time.py --cluster demo

(tests/test_docs_client.py keeps the guide's copy equal to the marked part below; tests/client/
test_examples.py runs it against an in-memory cluster and tests/cluster/test_client_groups_e2e.py
against a real one.)
"""

import argparse


def main(cluster: str) -> None:
    # example:begin
    import datetime
    import time

    import ray
    from rocketray.client import Admin, Consumer

    ray.init(address="auto")
    an_hour_ago_ms = int(time.time() * 1000) - 3_600_000

    class FromAnHourAgo:                               # a RebalanceListener
        consumer = None

        def on_assigned(self, queues):                 # each queue's first message stored since then
            self.consumer.seek_to_time(an_hour_ago_ms, *queues)

        def on_revoked(self, queues):
            pass

    listener = FromAnHourAgo()
    with Consumer(cluster, group="audit-last-hour", topics=["orders"], listener=listener) as consumer:
        listener.consumer = consumer
        stored = []
        while (messages := consumer.poll(timeout_s=2.0)):
            stored.extend(m.store_timestamp_ms for m in messages)
        print(f"{len(stored)} messages stored in the last hour, none before {an_hour_ago_ms}: "
              f"{min(stored) >= an_hour_ago_ms}")

    # the group is stopped now: move it to what was stored in the last five minutes
    since = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    for change in Admin(cluster).reset_offsets("audit-last-hour", "orders", since):
        print(f"{change.queue}: {change.before} -> {change.after}")
    # example:end


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", default="demo", help="the name given to `rocketray start --name`")
    main(p.parse_args().cluster)
