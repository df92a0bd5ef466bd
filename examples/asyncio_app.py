"""The client in an asyncio program (docs/client.md, "asyncio"): awaited sends, an `async for` over a
group's messages, and a commit of exactly what was received.

    python examples/asyncio_app.py --cluster demo

(tests/test_docs_client.py keeps the guide's copy equal to the marked part below; tests/client/
test_examples.py runs it against an in-memory cluster and tests/cluster/test_client_groups_e2e.py
against a real one.)
"""

import argparse


def main(cluster: str) -> None:
    # example:begin
    import asyncio

    import ray
    from rocketray.client.aio import AsyncConsumer, AsyncProducer

    ray.init(address="auto")

    async def produce():
        async with AsyncProducer(cluster) as producer:
            sends = [producer.send("orders", f"async order {i}".encode(), key=f"customer-{i % 10}") for i in range(100)]
            return {r.msg_id for r in await asyncio.gather(*sends)}      # all acknowledged

    async def consume(expected):
        received = set()
        async with AsyncConsumer(cluster, group="async-billing", topics=["orders"]) as consumer:
            async for m in consumer:
                received.add(m.msg_id)                 # handle(m) here
                if expected <= received:
                    break
            await consumer.commit()                    # up to the last message received
        return received

    async def run():
        sent = await produce()
        await asyncio.wait_for(consume(sent), timeout=120)
        print(f"async-billing received all {len(sent)} sent")

    asyncio.run(run())
    # example:end


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", default="demo", help="the name given to `rocketray start --name`")
    main(p.parse_args().cluster)
