"""Import arrows point down the floors of docs/architecture.md (DESIGN.md's floors), no modules import
each other in a circle, and no module takes another's private name. The floors table is read from
docs/architecture.md, so the page and the check cannot disagree. ALLOWED lists the violations not yet
moved; an entry that no longer occurs fails the test too, so the list only shrinks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from import_graph import Import, graph, is_private, product_modules, script_modules, strongly_connected

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
SCRIPT_FOLDERS = ("benchmarks", "examples")
SCRIPT_FILES = ("driver.py",)

#: Upward arrows not yet moved, as (importer, imported module): why each remains and what moving it needs.
ALLOWED_UP: dict[tuple[str, str], str] = {
    ("rocketray.client.socket_transport", "rocketray.actors.cluster"):
        "a Ray driver's transport (Producer('demo')) is built on actors.cluster's Cluster handle "
        "(connect(name) finds the cluster's registry actor). Moving it needs the Ray-driver transports "
        "(ray_transport, socket_transport: they call Ray) under actors/, with the client reaching them "
        "through a connector its caller passes in, or the client finding the registry itself through "
        "names kept on a lower floor.",
}

#: Circles not yet broken (each a sorted tuple of modules): why, and what breaking it needs.
ALLOWED_CIRCLES: dict[tuple[str, ...], str] = {}

#: Private names still taken from another module, as (importer, imported module, name).
ALLOWED_PRIVATE: dict[tuple[str, str, str], str] = {}


def floors() -> dict[str, int]:
    """Module-name prefix -> row, from the table of docs/architecture.md."""
    rows: dict[str, int] = {}
    table = PAGE.read_text().split("## The floors", 1)[1]
    for line in table.splitlines():
        match = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
        if match:
            for prefix in re.findall(r"`([\w.]+)`", match.group(2)):
                assert prefix not in rows, f"{prefix} is in two rows of {PAGE.name}"
                rows[prefix] = int(match.group(1))
    return rows


def floor_of(module: str, rows: dict[str, int]) -> int:
    prefixes = [p for p in rows if module == p or module.startswith(p + ".")]
    assert prefixes, f"{module} is on no floor of {PAGE.name}: add its package to the table"
    return rows[max(prefixes, key=len)]


@pytest.fixture(scope="module")
def modules():
    found = product_modules(ROOT)
    found.update(script_modules(ROOT, SCRIPT_FOLDERS, SCRIPT_FILES))
    return found


@pytest.fixture(scope="module")
def arrows(modules) -> list[Import]:
    return graph(modules)


def test_every_module_is_on_a_floor_and_the_table_names_real_modules(modules):
    """Every module maps to a row, and every row's name is a module or package that exists."""
    rows = floors()
    for name in modules:
        floor_of(name, rows)
    for prefix in rows:
        assert any(m == prefix or m.startswith(prefix + ".") for m in modules), f"{prefix}: no such module"


def test_no_import_arrow_runs_up(arrows):
    """A module imports only modules of its own row or lower ones."""
    rows = floors()
    up = {}
    for arrow in arrows:
        if floor_of(arrow.source, rows) < floor_of(arrow.target, rows):
            up.setdefault((arrow.source, arrow.target), arrow.line)
    new = [f"{s} (line {line}) imports {t}, a higher floor" for (s, t), line in sorted(up.items())
           if (s, t) not in ALLOWED_UP]
    assert not new, "\n".join(new)
    gone = sorted(set(ALLOWED_UP) - set(up))
    assert not gone, f"fixed, remove from ALLOWED_UP: {gone}"


def test_no_import_circle(modules, arrows):
    """No strongly connected component of more than one module: each is listed whole."""
    circles = {tuple(c) for c in strongly_connected(sorted(modules), arrows)}
    new = [" <-> ".join(c) for c in sorted(circles - set(ALLOWED_CIRCLES))]
    assert not new, "import circles:\n" + "\n".join(new)
    gone = sorted(set(ALLOWED_CIRCLES) - circles)
    assert not gone, f"broken, remove from ALLOWED_CIRCLES: {gone}"


def test_no_module_takes_another_modules_private_name(arrows):
    """`from x import _name` only inside one module: a shared name is public where it lives."""
    taken = {(a.source, a.target, n): a.line for a in arrows for n in a.names if is_private(n)}
    new = [f"{s} (line {line}) takes {t}.{n}" for (s, t, n), line in sorted(taken.items())
           if (s, t, n) not in ALLOWED_PRIVATE]
    assert not new, "\n".join(new)
    gone = sorted(set(ALLOWED_PRIVATE) - set(taken))
    assert not gone, f"fixed, remove from ALLOWED_PRIVATE: {gone}"


def test_the_graph_reader_sees_function_level_type_only_and_relative_imports(tmp_path):
    """The reader counts an import in a function, under TYPE_CHECKING and a relative one, skips
    __future__, and reports a three-module circle as one component."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.package-dir]\n"rocketray.p" = "pkg"\n')
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from __future__ import annotations\ndef f():\n    from rocketray.p import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import _x, y\n")
    (pkg / "c.py").write_text("import rocketray.p.a\n")
    found = product_modules(tmp_path)
    arrows = graph(found)
    assert {(a.source, a.target, a.names) for a in arrows} == {
        ("rocketray.p.a", "rocketray.p.b", ()),
        ("rocketray.p.b", "rocketray.p.c", ("_x", "y")),
        ("rocketray.p.c", "rocketray.p.a", ()),
    }
    assert strongly_connected(sorted(found), arrows) == [["rocketray.p.a", "rocketray.p.b", "rocketray.p.c"]]
