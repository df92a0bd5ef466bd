"""Producing reliably (docs/client.md, "A production producer"): batched sends with a done callback,
a full buffer waited out, and what to do with a send that failed or whose fate is unknown.

    python examples/produce.py --cluster demo --count 1000

(tests/test_docs_client.py keeps the guide's copy equal to the marked part below; tests/client/
test_examples.py runs it against an in-memory cluster and tests/cluster/test_client_groups_e2e.py
against a real one.)
"""

import argparse


def main(cluster: str, count: int = 1000) -> None:
    # example:begin
    import functools

    import ray
    from rocketray.client import Admin, BufferFull, Producer, SendFailed, SendUnknown

    ray.init(address="auto")
    Admin(cluster).create_topic("orders", queues=8)

    resend = []                                        # nothing was written: safe to send again
    maybe_stored = []                                  # may be stored: consumers de-duplicate by msg_id

    def on_done(body, future):                         # runs on the producer's callback thread
        error = future.exception()
        if isinstance(error, SendFailed):
            resend.append(body)
        elif isinstance(error, SendUnknown):
            maybe_stored.append(error.msg_id)

    with Producer(cluster, linger_ms=5) as producer:
        for i in range(count):
            body = f"order {i}".encode()
            while True:
                try:
                    future = producer.send_async("orders", body, key=f"customer-{i % 50}")
                    break
                except BufferFull:                     # the cluster did not keep up for max_block_ms
                    producer.flush(timeout_s=30)
            future.add_done_callback(functools.partial(on_done, body))
        producer.flush()                               # every send finished and its callback ran
        for body in resend:
            producer.send("orders", body)              # raises if it fails again
        m = producer.metrics()
    print(f"sent {m.sent}, failed {m.failed}, unknown {m.unknown} ({len(maybe_stored)} ids kept), "
          f"puts retried {m.retries}")
    # example:end


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", default="demo", help="the name given to `rocketray start --name`")
    p.add_argument("--count", type=int, default=1000)
    a = p.parse_args()
    main(a.cluster, a.count)
