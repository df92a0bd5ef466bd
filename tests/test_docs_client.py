"""docs/client.md stays true: its first example is examples/quickstart.py's marked part (which
tests/cluster/test_client_groups_e2e.py runs against a real cluster), and every client setting it
lists is a real `client.*` key with that default."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from rocketray.client import ClientConfig

REPO = Path(__file__).resolve().parents[1]


def test_the_guides_example_is_the_one_ci_runs():
    doc = (REPO / "docs/client.md").read_text()
    block = doc.split("```python\n", 1)[1].split("```", 1)[0]
    source = (REPO / "examples/quickstart.py").read_text()
    region = source.split("# example:begin\n", 1)[1].split("    # example:end", 1)[0]
    assert block.splitlines()[0].startswith('cluster = "demo"')
    assert "\n".join(block.splitlines()[1:]) + "\n" == textwrap.dedent(region)


def test_the_settings_table_lists_every_client_key():
    doc = (REPO / "docs/client.md").read_text()
    table = doc.split("## Settings", 1)[1].split("##", 1)[0]
    named = set(re.findall(r"`([a-z_]+)`", table))
    assert set(ClientConfig.__dataclass_fields__) <= named
    assert f"| `linger_ms` | {ClientConfig().linger_ms} |" in table
