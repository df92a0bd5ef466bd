"""docs/client.md stays true: every Python block in it is the marked part of the example file named
just above it (tests/client/test_examples.py runs those files against an in-memory cluster and
tests/cluster/test_client_groups_e2e.py against a real one), with only plain assignments of the
example's arguments in front; and every client setting it lists is a real `client.*` key with that
default."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

from rocketray.client import ClientConfig

REPO = Path(__file__).resolve().parents[1]
MARKED_BLOCK = re.compile(r"<!-- example: (examples/[a-z_]+\.py) -->\n```python\n(.*?)```", re.S)


def example_region(path: str) -> str:
    source = (REPO / path).read_text()
    return textwrap.dedent(source.split("# example:begin\n", 1)[1].split("    # example:end", 1)[0])


def test_every_python_block_of_the_guide_is_an_example_the_tests_run():
    doc = (REPO / "docs/client.md").read_text()
    marked = MARKED_BLOCK.findall(doc)
    assert len(marked) == doc.count("```python") >= 5, "a Python block without its example marker"
    files = set()
    for path, block in marked:
        region = example_region(path)
        assert block.endswith(region), f"docs/client.md's copy of {path} differs from the file"
        prelude = ast.parse(block[:-len(region)])
        assert all(isinstance(s, ast.Assign) and isinstance(s.value, (ast.Constant, ast.Tuple))
                   for s in prelude.body), f"{path}: only the example's arguments may precede it"
        files.add(path)
    tested = (REPO / "tests/client/test_examples.py").read_text()
    assert all(f'load("{Path(p).stem}")' in tested for p in files)


def test_the_settings_table_lists_every_client_key():
    doc = (REPO / "docs/client.md").read_text()
    table = doc.split("## Settings", 1)[1].split("##", 1)[0]
    named = set(re.findall(r"`([a-z_]+)`", table))
    assert set(ClientConfig.__dataclass_fields__) <= named
    assert f"| `linger_ms` | {ClientConfig().linger_ms} |" in table
