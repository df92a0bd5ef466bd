"""The user guide's first example (docs/client.md): a topic, a producer, a consumer group.

Run it against a cluster started with `rocketray start --name demo` on a running Ray:

    ray start --head
    rocketray start --name demo --groups 2
    python examples/quickstart.py --cluster demo

(tests/test_docs_client.py keeps docs/client.md's example equal to the marked part below, and
tests/cluster/test_client_groups_e2e.py runs this file against a real cluster.)
"""

import argparse


def main(cluster: str) -> None:
    # example:begin
    import ray
    from rocketray.client import Admin, Consumer, Producer, SendStatus

    ray.init(address="auto")                                   # the cluster's Ray
    Admin(cluster).create_topic("orders", queues=8)            # idempotent

    sent = set()
    with Producer(cluster) as producer:
        r = producer.send("orders", b"order 17 paid", key="order-17", tags="paid", properties={"shop": "berlin"})
        assert r.status is SendStatus.SEND_OK                  # acknowledged: every in-sync replica has it
        sent.add(r.msg_id)
        futures = [producer.send_async("orders", f"order {i}".encode(), key=f"order-{i}") for i in range(100)]
        producer.flush()                                       # waits for every send_async so far
        sent.update(f.result().msg_id for f in futures)

    received = set()
    with Consumer(cluster, group="billing", topics=["orders"]) as consumer:
        while not sent <= received:
            for m in consumer.poll(timeout_s=1.0):
                received.add(m.msg_id)                         # handle(m.body) here
            consumer.commit()                                  # what poll returned is done
    print(f"group billing received all {len(sent)} and committed")
    # example:end


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", default="demo", help="the name given to `rocketray start --name`")
    main(p.parse_args().cluster)
