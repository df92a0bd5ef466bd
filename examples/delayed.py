"""Delayed delivery (docs/client.md, "Delayed delivery"): reminders sent now for later; a consumer
gets each at or after its time, whatever fails over in between.

    python examples/delayed.py --cluster demo

(tests/test_docs_client.py keeps the guide's copy equal to the marked part below; tests/client/
test_examples.py runs it against an in-memory cluster and tests/cluster/test_client_groups_e2e.py
against a real one.)
"""

import argparse


def main(cluster: str) -> None:
    # example:begin
    import time

    import ray
    from rocketray.client import Admin, Consumer, Producer

    ray.init(address="auto")
    Admin(cluster).create_topic("reminders", queues=4)
    with Producer(cluster) as producer:
        due = time.time() + 1.5
        producer.send("reminders", b"cart 17 abandoned", delay_s=1)        # in a second
        producer.send("reminders", b"invoice 9 unpaid", deliver_at_ms=int(due * 1000))   # at a time

    late, seen = [], set()
    with Consumer(cluster, group="nagging", topics=["reminders"]) as consumer:
        deadline = time.monotonic() + 60
        while len(seen) < 2 and time.monotonic() < deadline:
            for m in consumer.poll(timeout_s=1.0):
                if m.msg_id in seen:                   # at least once: a failover may deliver one twice
                    continue
                seen.add(m.msg_id)
                late.append(time.time() * 1000 - m.deliver_at_ms)
                print(f"{m.body.decode()}: {'on time' if late[-1] >= 0 else 'early'}")
            consumer.commit()
    print(f"received {len(seen)} reminders, none early: {min(late) >= 0}")
    # example:end


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", default="demo", help="the name given to `rocketray start --name`")
    main(p.parse_args().cluster)
