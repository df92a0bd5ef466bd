"""rocketray's client library: what applications import.

    from rocketray.client import Admin, Bootstrap, Producer, Consumer, SendStatus

    cluster = Bootstrap.from_file("orders-app.rocketray.toml")   # outside Ray: brokers, CA, a user
    # (a Ray driver, an operator, may name the cluster instead: cluster = "demo", after ray.init)
    Admin(cluster).create_topic("orders", queues=8)
    with Producer(cluster) as p:
        r = p.send("orders", b"...", key="order-17", tags="paid", properties={"k": "v"})
        assert r.status is SendStatus.SEND_OK
        fut = p.send_async("orders", b"...")
        p.flush()
    with Consumer(cluster, group="billing", topics=["orders"]) as c:
        for m in c.poll(timeout_s=1.0):
            handle(m.body)          # or, when it fails: c.nack(m) (delivered again later, then %DLQ%billing)
        c.commit()

``rocketray.client.aio`` has the same for asyncio (``AsyncProducer``, ``AsyncConsumer``). The user
guide is docs/client.md: each call, the errors and what to do with them, the guarantees.
"""

from rocketray.client.admin import Admin
from rocketray.client.bootstrap import Bootstrap
from rocketray.client.config import ClientConfig
from rocketray.client.consumer import Consumer
from rocketray.client.errors import (AccessDenied, AdminError, AuthenticationFailed, BufferFull, ClientClosed, ClientError, ClusterNotFound, CommitFailed,
                                     FlushTimeout, InvalidMessage, InvalidRequest, SendFailed, SendUnknown,
                                     TopicNotFound)
from rocketray.client.metrics import ConsumerMetrics, ProducerMetrics
from rocketray.client.producer import Producer
from rocketray.client.types import (OffsetChange, QueueProgress, QueueRoute, RebalanceListener, ReceivedMessage,
                                    RetryStats, SendResult, SendStatus, TopicQueue, TopicRoute)

__all__ = [
    "Admin", "Bootstrap", "Producer", "Consumer", "SendStatus", "SendResult", "ReceivedMessage", "TopicRoute",
    "QueueRoute", "QueueProgress", "TopicQueue", "RebalanceListener", "OffsetChange", "ProducerMetrics",
    "ConsumerMetrics", "ClientConfig", "ClientError", "ClusterNotFound", "TopicNotFound", "InvalidMessage",
    "InvalidRequest", "SendFailed", "SendUnknown", "CommitFailed", "ClientClosed", "AdminError", "BufferFull",
    "FlushTimeout", "AccessDenied", "AuthenticationFailed", "RetryStats",
]
