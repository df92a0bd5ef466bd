"""One member of a consumer group: reads a topic, records what it handled, commits.

Start several with the same --group and they share the topic's queues; start another group and it
reads every message again, independently. Each handled message is appended to --out as a JSON line
{"msg_id", "queue_id", "queue_offset"}, each acknowledged commit as {"commit": [[topic, queue, offset]]}.

    python examples/consumer_group.py --cluster demo --group billing --topic orders --out billing-1.jsonl
"""

import argparse
import json
import signal
import time

import ray

from rocketray.client import CommitFailed, Consumer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", default="demo")
    p.add_argument("--group", required=True)
    p.add_argument("--topic", default="orders")
    p.add_argument("--out", required=True)
    p.add_argument("--idle-exit-s", type=float, default=0, help="exit after this long without a message (0: never)")
    args = p.parse_args()

    ray.init(address="auto")
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))   # finish the poll, leave the group
    last_message = time.monotonic()
    with Consumer(args.cluster, group=args.group, topics=[args.topic]) as consumer, open(args.out, "a") as out:
        while not stopping and (not args.idle_exit_s or time.monotonic() - last_message < args.idle_exit_s):
            messages = consumer.poll(timeout_s=0.5)
            for m in messages:
                out.write(json.dumps({"msg_id": m.msg_id, "queue_id": m.queue_id, "queue_offset": m.queue_offset}) + "\n")
            if messages:
                last_message = time.monotonic()
                out.flush()                                   # handled before committed
                try:
                    committed = consumer.commit()
                except CommitFailed as exc:                    # retriable: the next commit covers it
                    print(f"commit failed, will retry: {exc}")
                    continue
                out.write(json.dumps({"commit": [[t, q, o] for (t, q), o in sorted(committed.items())]}) + "\n")
                out.flush()


if __name__ == "__main__":
    main()
