"""The project skeleton: packages import, the CLI answers --version, benchmarks are discoverable."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("package", ["actors", "controller", "broker", "ha", "snapshot", "spark_on_ray"])
def test_top_level_packages_import(package):
    assert importlib.import_module(package).__doc__


def test_cli_version_prints_distribution_version(capsys):
    from rocketray.cli import main as cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip().startswith("rocketray ")


def test_cli_without_command_exits_with_usage_code(capsys):
    from rocketray.cli import main as cli

    assert cli.main([]) == cli.EXIT_USAGE


def test_benchmark_runner_lists_every_benchmark_module():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--list"],
                         capture_output=True, text=True, check=True).stdout.split()
    expected = sorted(p.stem[len("bench_"):].replace("_", "-") for p in (ROOT / "benchmarks").glob("bench_*.py"))
    assert out == expected
