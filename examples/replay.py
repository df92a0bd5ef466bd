"""Replay and reset (docs/client.md, "Replay"): a group that reads every queue from its first message,
a replay of one queue from an offset, and moving the stopped group back to its first messages.

    python examples/replay.py --cluster demo

(tests/test_docs_client.py keeps the guide's copy equal to the marked part below; tests/client/
test_examples.py runs it against an in-memory cluster and tests/cluster/test_client_groups_e2e.py
against a real one.)
"""

import argparse


def main(cluster: str) -> None:
    # example:begin
    import ray
    from rocketray.client import Admin, Consumer

    ray.init(address="auto")

    class FromTheFirstMessage:                         # a RebalanceListener
        consumer = None

        def on_assigned(self, queues):
            self.consumer.seek_to_beginning(*queues)   # not the group's committed offset

        def on_revoked(self, queues):
            pass

    listener = FromTheFirstMessage()
    with Consumer(cluster, group="audit-replay", topics=["orders"], listener=listener) as consumer:
        listener.consumer = consumer
        first = {}
        while (messages := consumer.poll(timeout_s=2.0)):
            for m in messages:
                first.setdefault(m.queue, m.queue_offset)
        print(f"read every queue from its start: {sorted((str(q), o) for q, o in first.items())}")
        queue = min(first)
        consumer.seek(queue.topic, queue.queue_id, first[queue])      # replay one queue
        again = [m.queue_offset for m in consumer.poll(timeout_s=2.0) if m.queue == queue]
        print(f"{queue} again from offset {again[0]}")
        consumer.commit()

    # the group is stopped now: move it back to every queue's first message
    for change in Admin(cluster).reset_offsets("audit-replay", "orders", "earliest"):
        print(f"{change.queue}: {change.before} -> {change.after}")
    with Consumer(cluster, group="audit-replay", topics=["orders"]) as consumer:   # starts at the reset
        again = 0
        while (messages := consumer.poll(timeout_s=2.0)):
            again += len(messages)
        consumer.commit()
    print(f"a new member of the group read {again} messages again")
    # example:end


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", default="demo", help="the name given to `rocketray start --name`")
    main(p.parse_args().cluster)
