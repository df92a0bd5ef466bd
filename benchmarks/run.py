"""Benchmark runner.

``python benchmarks/run.py NAME [--json] [args...]`` runs ``benchmarks/bench_<name>.py``
(dashes become underscores). Each benchmark module defines ``run(argv) -> dict``;
the dict holds the benchmark's figures and ``ratio``, the figure of interest divided
by a baseline measured in the same run (its module docstring says which way is
better). With ``--json`` the runner prints exactly one JSON line; without it, a
readable summary. ``python benchmarks/run.py --list`` names the benchmarks.

``--smoke`` runs a benchmark at its smoke size: the module's ``SMOKE_ARGS`` (every benchmark must
define them: arguments that make it finish in seconds) come before the other arguments, so a
benchmark cannot rot unseen (tests/test_benchmarks.py runs each one this way). Smoke figures are
not measurements.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def available() -> list[str]:
    return sorted(p.stem[len("bench_"):].replace("_", "-") for p in HERE.glob("bench_*.py"))


def load(name: str):
    path = HERE / f"bench_{name.replace('-', '_')}.py"
    if not path.exists():
        raise SystemExit(f"unknown benchmark {name!r}; available: {', '.join(available())}")
    sys.path.insert(0, str(HERE.parent))
    spec = importlib.util.spec_from_file_location(f"bench_{name.replace('-', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv[0] == "--list":
        print("\n".join(available()))
        return 0
    name, rest = argv[0], argv[1:]
    as_json = "--json" in rest
    smoke = "--smoke" in rest
    rest = [a for a in rest if a not in ("--json", "--smoke")]
    module = load(name)
    if smoke:
        rest = [*module.SMOKE_ARGS, *rest]
    result = module.run(rest)
    if smoke:
        result["smoke"] = True
    assert "ratio" in result, f"benchmark {name} must report a ratio"
    result = {"benchmark": name, **result}
    if as_json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:>28}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
