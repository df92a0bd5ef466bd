"""Retries and the dead-letter queue (docs/client.md, "Retries and the dead-letter queue"): a message
the handler cannot process is nacked, delivered again after the group's retry delays, and after
``max_deliveries`` lands in the group's dead-letter topic, which an operator reads and replays.

    python examples/retries.py --cluster demo

(tests/test_docs_client.py keeps the guide's copy equal to the marked part below; tests/client/
test_examples.py runs it against an in-memory cluster.)
"""

import argparse


def main(cluster: str) -> None:
    # example:begin
    import time

    import ray
    from rocketray.client import Admin, Consumer, Producer

    ray.init(address="auto")
    Admin(cluster).create_topic("orders", queues=8)                # idempotent
    with Producer(cluster) as producer:
        poison = producer.send("orders", b"order 0 paid in a currency we do not know").msg_id

    def handle(m):
        if (m.origin_msg_id or m.msg_id) == poison:                # a copy names the message it copies
            raise ValueError("unknown currency")

    dead = None
    deadline = time.monotonic() + 300
    with Consumer(cluster, group="invoicing", topics=["orders"], max_deliveries=3) as consumer:
        while dead is None and time.monotonic() < deadline:
            for m in consumer.poll(timeout_s=1.0):
                try:
                    handle(m)
                except ValueError as exc:
                    copy = consumer.nack(m)                        # returns once the copy is stored
                    print(f"delivery {m.delivery_count} failed ({exc}): copy in {copy.topic}")
                    if copy.topic.startswith("%DLQ%"):
                        dead = copy
            consumer.commit()                                      # never past a message whose copy is not stored

    # an operator reads the dead letters like any topic and, once the handler is fixed, replays them
    with Consumer(cluster, group="invoicing-dlq", topics=["%DLQ%invoicing"]) as letters, Producer(cluster) as producer:
        for m in letters.poll(timeout_s=5.0):
            print(f"dead letter of {m.origin_topic}/{m.origin_queue_id} offset {m.origin_queue_offset}: {m.body!r}")
            producer.send(m.origin_topic, m.body, key=m.key, tags=m.tags, properties=m.properties)
        letters.commit()
    stats = Admin(cluster).retry_stats("invoicing")
    print(f"invoicing: {stats.retried} retried, {stats.retry_pending} pending, {stats.dead_letters} dead-lettered")
    # example:end


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", default="demo", help="the name given to `rocketray start --name`")
    main(p.parse_args().cluster)
