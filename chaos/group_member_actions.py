"""What a consumer-group member of the chaos run does besides polling and committing: nacks and seeks.

Theory of operation. A :class:`MemberPlan` (one per group, from the run's seed) says how a member
treats what it polls. **Nacks**: a message is nacked when :func:`nacks` says so, a pure function of
the seed, the group, the payload and the delivery count: a few payloads are *poison* (nacked at
every delivery, so they reach the dead-letter topic at the ``max_deliveries``-th), and a few more are
nacked at their first delivery only (their retry copy is then handled). Each ``nack`` call is one
``nack`` row (``ok`` with where the copy went, else ``failed``/``unknown``); a nack that raised is
tried again before the next poll (the message is not committed past until one succeeds, and
``nack`` may be repeated safely), while the member still owns its queue (a new owner reads it again
from the committed offset). **Seeks**: after a poll, with the plan's probability (from the member's
own seeded generator), the member seeks one owned queue of the run's topic back by up to
``SEEK_BACK`` messages (a replay, below the group's committed offset too) and records a ``seek``
row numbered with that poll. Neither happens while the run drains (failed nacks are still retried,
or the drain could not commit past them). Row formats: ``rocketray.verify.group_actions``.
"""

from __future__ import annotations

import logging
import random
import zlib
from dataclasses import dataclass
from typing import Callable, Sequence

from rocketray.chaos.replica_reader import now_ms
from rocketray.client import ClientError, Consumer, ReceivedMessage, SendFailed, TopicQueue
from rocketray.verify.outcome import Outcome

log = logging.getLogger("rocketray.chaos.groups")

__all__ = ["MemberPlan", "nacks", "MemberActions", "MAX_DELIVERIES", "SEEK_BACK"]

#: Deliveries before a nacked message goes to the dead-letter topic (the members' ``max_deliveries``).
MAX_DELIVERIES = 3
#: How far back a seek goes at most (messages).
SEEK_BACK = 20


@dataclass(frozen=True, slots=True)
class MemberPlan:
    """How the members of one group treat what they poll."""

    seed: int
    expression: str = "*"          #: the group's subscription to the run's topic
    nack_permille: int = 20        #: payloads nacked at their first delivery, per thousand
    poison_permille: int = 5       #: payloads nacked at every delivery (dead letters), per thousand
    seek_chance: float = 0.02      #: chance that a member seeks after a poll
    max_deliveries: int = MAX_DELIVERIES


def nacks(plan: MemberPlan, group: str, payload_id: object, delivery_count: int) -> bool:
    """Whether a member of ``group`` nacks this delivery of ``payload_id`` (pure: seed, group, payload)."""
    draw = zlib.crc32(f"{plan.seed}/{group}/{payload_id}".encode()) % 1000
    return draw < plan.poison_permille or (delivery_count == 1 and draw < plan.poison_permille + plan.nack_permille)


class MemberActions:
    """One member's nacks and seeks (module docstring); ``record`` appends a history row."""

    def __init__(self, plan: MemberPlan, consumer_group: str, topic: str, process: str,
                 record: Callable[[dict], None], rng: random.Random) -> None:
        self.plan = plan
        self.consumer_group = consumer_group
        self.topic = topic
        self.process = process
        self.record = record
        self.rng = rng
        self.failed: list[ReceivedMessage] = []   #: nacks that raised, to try again

    def after_poll(self, consumer: Consumer, messages: Sequence[ReceivedMessage], poll: int, draining: bool) -> None:
        owned = set(consumer.assignment())
        retry, self.failed = [m for m in self.failed if m.queue in owned], []
        todo = retry + ([] if draining else [m for m in messages
                                             if nacks(self.plan, self.consumer_group, m.properties.get("pid"),
                                                      m.delivery_count)])
        for m in todo:
            self._nack(consumer, m)
        if not draining and self.rng.random() < self.plan.seek_chance:
            self._seek(consumer, poll, owned)

    def _nack(self, consumer: Consumer, m: ReceivedMessage) -> None:
        row = {"f": "nack", "process": self.process, "consumer_group": self.consumer_group, "topic": m.topic,
               "queue_id": m.queue_id, "queue_offset": m.queue_offset, "payload_id": m.properties.get("pid"),
               "msg_id": m.msg_id, "origin_msg_id": m.origin_msg_id, "delivery_count": m.delivery_count}
        try:
            result = consumer.nack(m)
        except Exception as exc:  # noqa: BLE001 - not stored (or not known to be): nack it again later
            log.info("consumer %s: nack of %s failed: %s", self.process, m.msg_id, exc)
            self.failed.append(m)
            outcome = Outcome.FAILED if isinstance(exc, SendFailed) else Outcome.UNKNOWN
            self.record({**row, "outcome": outcome, "copy_topic": None, "copy_queue_id": None, "copy_msg_id": None,
                         "time_ms": now_ms()})
            return
        self.record({**row, "outcome": Outcome.OK, "copy_topic": result.topic, "copy_queue_id": result.queue_id,
                     "copy_msg_id": result.msg_id, "time_ms": now_ms()})

    def _seek(self, consumer: Consumer, poll: int, owned: set[TopicQueue]) -> None:
        """Seek one owned queue of the run's topic back by 1..SEEK_BACK messages; a ``seek`` row."""
        mine = sorted(q for q in owned if q.topic == self.topic)
        if not mine:
            return
        q = self.rng.choice(mine)
        try:
            position = consumer.position(q.topic, q.queue_id)
            if not position:
                return
            offset = max(0, position - self.rng.randint(1, SEEK_BACK))
            consumer.seek(q.topic, q.queue_id, offset)
        except ClientError as exc:     # e.g. the queue left in a rebalance meanwhile
            log.info("consumer %s: seek of %s not done: %s", self.process, q, exc)
            return
        self.record({"f": "seek", "process": self.process, "consumer_group": self.consumer_group, "topic": q.topic,
                     "queue_id": q.queue_id, "offset": offset, "from_offset": position, "poll": poll,
                     "time_ms": now_ms()})
