"""An application's producer and consumer counters on a Prometheus page (docs/client.md, "Metrics"),
from the base install (no Ray). Given the operator's client configuration file (see outside_ray.py):

    python examples/metrics.py orders-app.rocketray.toml --port 9464

(tests/test_docs_client.py keeps docs/client.md's copy equal to the marked part below;
tests/client/test_examples.py runs it against an in-memory cluster.)
"""

import argparse


def main(config_path: str, port: int) -> None:
    # example:begin
    import urllib.request

    from rocketray.client import Bootstrap, Consumer, Producer
    from rocketray.client.metrics_export import serve_prometheus

    cluster = Bootstrap.from_file(config_path)
    with Producer(cluster) as producer, Consumer(cluster, group="billing", topics=["orders"]) as consumer, \
            serve_prometheus(port, producer, consumer) as page:     # host="0.0.0.0": scraped from elsewhere
        producer.send("orders", b"order 19 paid", key="order-19")
        for m in consumer.poll(timeout_s=5.0):
            print(f"{m.topic}/{m.queue_id}@{m.queue_offset}: {m.body!r}")
        consumer.commit()
        with urllib.request.urlopen(page.url) as answer:           # what Prometheus reads at page.url
            for line in answer.read().decode().splitlines():
                if line.startswith(("rocketray_client_producer_sent_total", "rocketray_client_consumer_lag")):
                    print(line)
    # example:end


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", help="the client configuration file `rocketray admin user create --client-config` wrote")
    p.add_argument("--port", type=int, default=9464, help="the port of the metrics page (0: any free one)")
    args = p.parse_args()
    main(args.config, args.port)
