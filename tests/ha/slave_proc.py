"""A slave replica in its own process, for kill -9 tests.

    python slave_proc.py STORE_DIR MASTER_HOST:PORT BROKER_ID EPOCH SEGMENT_SIZE [MODE]

MODE ``kill-in-truncate`` SIGKILLs this process inside ``store.truncate`` right after the commit
log was cut (before consume queues, checkpoint and epoch file are updated): a crash in the
middle of a handshake truncation. MODE ``throttle`` spends 2 ms per appended 16 KiB (however many packets one append
holds), so a 12 MiB stream takes over a second and a test can kill it mid-way without racing it.
"""

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))

from rocketray.ha.service import HAService  # noqa: E402
from rocketray.links import MemberLinks  # noqa: E402
from rocketray.tls import MemberCredentials  # noqa: E402
from ha_helpers import fast_config, open_store  # noqa: E402


async def main() -> None:
    root, address, broker_id, epoch, segment_size = sys.argv[1:6]
    mode = sys.argv[6] if len(sys.argv) > 6 else ""
    store = open_store(Path(root), int(segment_size))
    if mode == "kill-in-truncate":
        cut = store.commitlog.cut

        def cut_then_die(offset):
            cut(offset)
            os.kill(os.getpid(), signal.SIGKILL)
        store.commitlog.cut = cut_then_die
    elif mode == "throttle":
        append_raw = store.append_raw

        def slow_append(offset, data):
            time.sleep(0.002 * max(1, len(data) // (16 * 1024)))  # per 16 KiB, however batched
            return append_raw(offset, data)
        store.append_raw = slow_append
    credentials = MemberCredentials.from_json(json.loads(sys.stdin.readline()))   # never argv
    ha = HAService(store, int(broker_id), fast_config(ha_transfer_batch_size=16 * 1024), links=MemberLinks(credentials))
    await ha.start("127.0.0.1", 0)
    await ha.change_to_slave(address, int(epoch))
    print("started", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()          # SIGTERM: clean shutdown (flush + checkpoint)
    await ha.close()
    store.close()


asyncio.run(main())
