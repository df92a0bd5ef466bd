"""An application outside Ray (docs/client.md, "Outside Ray"): a user credential file and the base
install (`pip install rocketray`, no Ray, no Spark). The operator made the file and the user's rules:

    rocketray admin user create orders-app --name demo --client-config orders-app.rocketray.toml
    rocketray admin acl create --name demo -u orders-app -r Topic:orders -a Pub,Sub -d allow
    rocketray admin acl create --name demo -u orders-app -r Group:billing -a Sub -d allow
    python examples/outside_ray.py orders-app.rocketray.toml

(tests/test_docs_client.py keeps docs/client.md's copy equal to the marked part below;
tests/cluster/test_outside_ray.py runs the same calls from a venv without Ray against a real cluster.)
"""

import argparse


def main(config_path: str) -> None:
    # example:begin
    from rocketray.client import AccessDenied, Bootstrap, Consumer, Producer

    cluster = Bootstrap.from_file(config_path)                 # brokers, the cluster's CA, the user
    with Producer(cluster) as producer:
        producer.send("orders", b"order 18 paid", key="order-18")
    try:
        with Consumer(cluster, group="billing", topics=["orders"]) as consumer:
            for m in consumer.poll(timeout_s=5.0):
                print(f"{m.topic}/{m.queue_id}@{m.queue_offset}: {m.body!r}")
            consumer.commit()
    except AccessDenied as exc:                                # the user's ACL: not retriable
        print(f"an operator must allow {exc.action} on {exc.resource}")
    # example:end


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", help="the client configuration file `rocketray admin user create --client-config` wrote")
    main(p.parse_args().config)
