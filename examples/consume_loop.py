"""A production consume loop (docs/client.md): a clean shutdown on SIGTERM, a commit before queues
move to another member, a failed commit retried by the next one, and duplicates dropped by msg_id.

    python examples/consume_loop.py --cluster demo --group billing

(tests/test_docs_client.py keeps the guide's copy equal to the marked part below; tests/client/
test_examples.py runs it against an in-memory cluster and tests/cluster/test_client_groups_e2e.py
against a real one.)
"""

import argparse


def main(cluster: str, group: str = "billing", idle_exit_s: float = 0.0) -> int:
    # example:begin
    import collections
    import signal
    import time

    import ray
    from rocketray.client import CommitFailed, Consumer

    ray.init(address="auto")
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))   # finish this batch, then leave

    class CommitBeforeHandOver:                        # a RebalanceListener
        consumer = None

        def on_revoked(self, queues):                  # inside poll, before the queues leave
            try:
                self.consumer.commit(timeout_s=10)
            except CommitFailed as exc:                # another member re-reads what was not committed
                print(f"commit before hand-over failed: {exc}")

        def on_assigned(self, queues):
            print(f"now reading {', '.join(map(str, queues))}")

    seen = collections.OrderedDict()                   # recent msg ids: a redelivered message is skipped
    handled = 0
    listener = CommitBeforeHandOver()
    last_message = time.monotonic()
    with Consumer(cluster, group=group, topics=["orders"], listener=listener) as consumer:
        listener.consumer = consumer
        while not stopping and not (idle_exit_s and time.monotonic() - last_message > idle_exit_s):
            messages = consumer.poll(timeout_s=1.0)
            for m in messages:
                if m.msg_id in seen:
                    continue
                seen[m.msg_id] = True
                if len(seen) > 100_000:
                    seen.popitem(last=False)
                handled += 1                           # handle(m) here: store, call a service, ...
            if messages:
                last_message = time.monotonic()
                try:
                    consumer.commit()
                except CommitFailed as exc:
                    if not exc.retriable:
                        raise                          # an offset the broker refused: a bug
                    # the next commit() covers these queues too
    print(f"handled {handled} messages")
    # example:end
    return handled


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", default="demo", help="the name given to `rocketray start --name`")
    p.add_argument("--group", default="billing")
    p.add_argument("--idle-exit-s", type=float, default=0, help="exit after this long without a message (0: never)")
    a = p.parse_args()
    main(a.cluster, a.group, a.idle_exit_s)
