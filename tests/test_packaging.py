"""One import name: the wheel holds only ``rocketray/...``, installs and runs from a fresh environment
where none of the source folders is importable as a top-level name; ``pip install -e .`` works too;
the pyproject package list is the folders that hold an ``__init__.py``; one version everywhere; one
Python floor everywhere, and it is what the code needs."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

import rocketray

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("controller", "broker", "ha", "snapshot", "actors", "verify", "chaos", "cli", "spark_on_ray", "sim", "wire")

CHECK = """
import importlib.util, json, sys
import rocketray, rocketray.controller.state, rocketray.cli.main
print(json.dumps({"file": rocketray.__file__, "version": rocketray.__version__,
                  "top_level": {n: importlib.util.find_spec(n) is not None for n in sys.argv[1:]}}))
"""


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_package_list_is_the_folders_that_hold_an_init():
    tool = pyproject()["tool"]["setuptools"]
    declared = set(tool["packages"])
    found = {"rocketray"}
    for folder in sorted(p.parent for p in ROOT.glob("*/**/__init__.py")):
        rel = folder.relative_to(ROOT)
        if rel.parts[0] in ("tests", "benchmarks", "docs", "rocketray", "build", "dist") or rel.parts[0].startswith("."):
            continue
        found.add("rocketray." + ".".join(rel.parts))
    assert declared == found
    mapped = tool["package-dir"]
    assert {name for name in declared if "." not in name.removeprefix("rocketray.")} == set(mapped)
    for name, folder in mapped.items():
        assert (ROOT / folder / "__init__.py").is_file(), (name, folder)


def test_version_has_one_source():
    meta = pyproject()
    assert "version" not in meta["project"] and "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "rocketray.__version__"}


#: Standard-library modules that older Pythons lack, with the release that added them.
NEWER_STDLIB = {"tomllib": (3, 11), "wsgiref.types": (3, 11)}


def _sources() -> list[Path]:
    skip = {".git", ".venv", "build", "dist", "__pycache__"}
    return sorted(p for p in ROOT.rglob("*.py")
                  if not skip.intersection(p.relative_to(ROOT).parts) and ".egg-info" not in str(p))


def _imported_modules(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_python_floor_is_what_the_code_needs_and_is_stated_once():
    """requires-python is the newest release any source needs (by stdlib modules it imports and by
    the syntax it parses under), and mypy, the README and docs/cluster.md state the same floor."""
    meta = pyproject()
    match = re.fullmatch(r">=\s*(\d+)\.(\d+)", meta["project"]["requires-python"])
    assert match, meta["project"]["requires-python"]
    floor = (int(match[1]), int(match[2]))
    needed: dict[str, tuple[int, int]] = {}
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path), feature_version=floor)  # syntax no newer than the floor
        for module in _imported_modules(tree) & NEWER_STDLIB.keys():
            needed[f"{path.relative_to(ROOT)}: {module}"] = NEWER_STDLIB[module]
    assert needed, "rocketray/config.py imports tomllib"
    assert all(version <= floor for version in needed.values()), needed
    assert max(needed.values()) == floor, f"the floor {floor} is above what the code needs: {needed}"
    text = f"{floor[0]}.{floor[1]}"
    assert meta["tool"]["mypy"]["python_version"] == text
    assert f"Python >= {text} " in (ROOT / "README.md").read_text()
    assert f"Python {text}+ " in (ROOT / "docs" / "cluster.md").read_text()
    for classifier in meta["project"].get("classifiers", []):
        m = re.fullmatch(r"Programming Language :: Python :: (\d+)\.(\d+)", classifier)
        assert m is None or (int(m[1]), int(m[2])) >= floor, classifier


def _fresh_venv(path: Path) -> Path:
    """A venv that sees this environment's installed dependencies (a plain path in a .pth file: the
    editable install's finder, itself a .pth hook, stays inactive) but not this checkout."""
    venv.create(path, with_pip=True)
    python = path / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "deps-from-test-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _run_outside(python: Path, tmp_path: Path) -> dict:
    import json

    out = subprocess.run([python, "-c", CHECK, *FOLDERS], capture_output=True, text=True, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_wheel_holds_only_rocketray_and_installs_under_that_name(tmp_path):
    # built from a copy: setuptools writes build/ into the source tree, which is shared
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__",
                                                                "tests", "docs"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)],
                   check=True, timeout=600)
    (wheel,) = dist.glob("rocketray-*.whl")
    assert wheel.name.startswith(f"rocketray-{rocketray.__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"rocketray", f"rocketray-{rocketray.__version__}.dist-info"}
    for folder in FOLDERS:
        assert f"rocketray/{folder}/__init__.py" in names, folder

    python = _fresh_venv(tmp_path / "venv")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
                   check=True, timeout=600)
    got = _run_outside(python, tmp_path)
    assert Path(got["file"]).is_relative_to(tmp_path / "venv"), got["file"]
    assert got["version"] == rocketray.__version__
    assert got["top_level"] == {name: False for name in FOLDERS}
    version = subprocess.run([tmp_path / "venv" / "bin" / "rocketray", "--version"], capture_output=True,
                             text=True, cwd=tmp_path, check=True, timeout=300).stdout.strip()
    assert version == f"rocketray {rocketray.__version__}"


@pytest.mark.slow
def test_editable_install_maps_the_folders_under_rocketray(tmp_path):
    python = _fresh_venv(tmp_path / "venv")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)], check=True, timeout=600)
    got = _run_outside(python, tmp_path)
    assert Path(got["file"]) == ROOT / "rocketray" / "__init__.py"
    assert got["top_level"] == {name: False for name in FOLDERS}
