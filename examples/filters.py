"""Tag filters (docs/client.md, "Filtering by tag"): a group that reads only the paid and refunded
orders of a topic; the brokers leave the other messages out, and the group's commits pass them.

    python examples/filters.py --cluster demo

(tests/test_docs_client.py keeps the guide's copy equal to the marked part below; tests/client/
test_examples.py runs it against an in-memory cluster and tests/cluster/test_client_groups_e2e.py
against a real one.)
"""

import argparse


def main(cluster: str) -> None:
    # example:begin
    import collections

    import ray
    from rocketray.client import Admin, Consumer, Producer

    ray.init(address="auto")
    Admin(cluster).create_topic("order-events", queues=4)
    with Producer(cluster) as producer:
        for i, state in enumerate(["created", "paid", "refunded", "created"] * 25):
            producer.send("order-events", f"order {i} {state}".encode(), key=f"order-{i}", tags=state)

    # only paid and refunded orders leave the brokers; a list of topics (or "*") reads every message
    with Consumer(cluster, group="payments", topics={"order-events": "paid || refunded"}) as consumer:
        tags = collections.Counter()
        while (messages := consumer.poll(timeout_s=2.0)):
            tags.update(m.tags for m in messages)
            consumer.commit()
        consumer.commit()                              # also past unwanted messages the last poll passed
        print(f"payments received {dict(sorted(tags.items()))}, lag {consumer.metrics().lag}")
    # example:end


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", default="demo", help="the name given to `rocketray start --name`")
    main(p.parse_args().cluster)
