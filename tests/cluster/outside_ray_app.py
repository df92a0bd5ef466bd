"""An application outside Ray, as tests/cluster/test_outside_ray.py runs it: a venv holding only the
base install (no Ray, no Spark, no pysyncobj), a client configuration file with a user credential.

    python outside_ray_app.py CONFIG_FILE MEMBER_PORTS_JSON

Produces 200 messages to ``orders`` and reads them back as group ``billing``; tries a topic its ACL
does not allow; tries the members' ports (Raft, session, HA) with what it holds. Prints one JSON line.
"""

from __future__ import annotations

import json
import socket
import ssl
import sys


def try_member_port(host: str, port: int, context: ssl.SSLContext) -> str:
    """What the port did with this application: it holds the CA, not a member certificate."""
    try:
        with socket.create_connection((host, port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname=host) as tls:
                tls.sendall(b"hello")
                data = tls.recv(100)
                return "closed" if not data else f"answered {data[:20]!r}"
    except (ssl.SSLError, ConnectionError, OSError) as exc:
        return f"refused: {type(exc).__name__}"


def main(config_path: str, member_ports: str) -> None:
    modules_before = set(sys.modules)
    from rocketray.client import AccessDenied, Bootstrap, Consumer, Producer

    cluster = Bootstrap.from_file(config_path)
    out: dict = {}
    with Producer(cluster) as p:
        acked = [p.send("orders", f"m-{i}".encode(), key=str(i)).status.name for i in range(200)]
        out["acked"] = acked.count("SEND_OK")
        try:
            p.send("secret", b"nope")
            out["secret"] = "sent"
        except AccessDenied as exc:
            out["secret"] = f"AccessDenied: {exc}"
    seen: set[bytes] = set()
    with Consumer(cluster, group="billing", topics=["orders"]) as c:
        for _ in range(200):
            seen.update(m.body for m in c.poll(timeout_s=1.0))
            if len(seen) >= 200:
                break
        c.commit()
    out["received"] = len(seen)
    try:
        with Consumer(cluster, group="fraud", topics=["orders"]) as c:
            c.poll(timeout_s=2.0)
        out["other_group"] = "read"
    except AccessDenied as exc:
        out["other_group"] = f"AccessDenied: {exc}"
    context = cluster.trust.context()
    out["member_ports"] = {name: try_member_port(host, port, context)
                           for name, (host, port) in json.loads(member_ports).items()}
    loaded = set(sys.modules) - modules_before
    out["heavy_modules"] = sorted(m for m in loaded if m.split(".")[0] in ("ray", "pyspark", "raydp", "pysyncobj"))
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
