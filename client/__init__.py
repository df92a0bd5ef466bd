"""rocketray's client library: what applications import.

    import ray
    from rocketray.client import Admin, Producer, Consumer, SendStatus

    ray.init(address="auto")
    Admin("demo").create_topic("orders", queues=8)
    with Producer("demo") as p:
        r = p.send("orders", b"...", key="order-17", tags="paid", properties={"k": "v"})
        assert r.status is SendStatus.SEND_OK
        fut = p.send_async("orders", b"...")
        p.flush()
    with Consumer("demo", group="billing", topics=["orders"]) as c:
        for m in c.poll(timeout_s=1.0):
            handle(m.body)
        c.commit()

``rocketray.client.aio`` has the same for asyncio (``AsyncProducer``, ``AsyncConsumer``). The user
guide is docs/client.md: each call, the errors and what to do with them, the guarantees.
"""

from rocketray.client.admin import Admin
from rocketray.client.config import ClientConfig
from rocketray.client.consumer import Consumer
from rocketray.client.errors import (AdminError, BufferFull, ClientClosed, ClientError, ClusterNotFound, CommitFailed,
                                     FlushTimeout, InvalidMessage, InvalidRequest, SendFailed, SendUnknown,
                                     TopicNotFound)
from rocketray.client.metrics import ConsumerMetrics, ProducerMetrics
from rocketray.client.producer import Producer
from rocketray.client.types import (OffsetChange, QueueProgress, QueueRoute, RebalanceListener, ReceivedMessage,
                                    SendResult, SendStatus, TopicQueue, TopicRoute)

__all__ = [
    "Admin", "Producer", "Consumer", "SendStatus", "SendResult", "ReceivedMessage", "TopicRoute", "QueueRoute",
    "QueueProgress", "TopicQueue", "RebalanceListener", "OffsetChange", "ProducerMetrics", "ConsumerMetrics",
    "ClientConfig", "ClientError", "ClusterNotFound", "TopicNotFound", "InvalidMessage", "InvalidRequest",
    "SendFailed", "SendUnknown", "CommitFailed", "ClientClosed", "AdminError", "BufferFull", "FlushTimeout",
]
