"""The project skeleton: packages import, the CLI answers --version, benchmarks are discoverable."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("package", ["actors", "controller", "broker", "ha", "snapshot", "spark_on_ray", "verify",
                                     "chaos", "cli"])
def test_subpackages_import(package):
    assert importlib.import_module(f"rocketray.{package}").__doc__


def test_cli_version_prints_distribution_version(capsys):
    from rocketray.cli import main as cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    import rocketray

    assert capsys.readouterr().out.strip() == f"rocketray {rocketray.__version__}"


def test_cli_without_command_exits_with_usage_code(capsys):
    from rocketray.cli import main as cli

    assert cli.main([]) == cli.EXIT_USAGE


def test_benchmark_runner_lists_every_benchmark_module():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--list"],
                         capture_output=True, text=True, check=True).stdout.split()
    expected = sorted(p.stem[len("bench_"):].replace("_", "-") for p in (ROOT / "benchmarks").glob("bench_*.py"))
    assert out == expected


# -- one language: the same flag names a cluster in every command ------------------------------------

@pytest.mark.parametrize("argv", [["start"], ["status"], ["stop"], ["admin", "get-controller-metadata"],
                                  ["analytics", "--live"]])
def test_every_cluster_command_takes_name_and_address(argv):
    from rocketray.cli import main as cli

    parser = cli.build_parser()
    args = parser.parse_args([*argv, "--name", "prod", "--address", "ray://h:10001"])
    assert (args.name, args.address) == ("prod", "ray://h:10001")
    old = parser.parse_args([*argv, "--cluster", "prod"])  # the old spelling, hidden from --help
    assert old.name == "prod"


def test_help_shows_only_the_current_spelling(capsys):
    from rocketray.cli import main as cli

    for argv in (["admin", "get-sync-state-set"], ["analytics"]):
        with pytest.raises(SystemExit):
            cli.main([*argv, "--help"])
        out = capsys.readouterr().out
        assert "--name" in out and "--cluster " not in out and "--ray-address" not in out


def test_chaos_defaults_to_the_broker_experiment():
    from rocketray.cli import main as cli

    parser = cli.build_parser()
    assert parser.parse_args(["chaos"]).target == "brokers"
    assert parser.parse_args(["chaos", "--target", "controller"]).target == "controller"


def test_chaos_rejects_unknown_broker_nemesis_before_starting_anything(capsys):
    from rocketray.cli import main as cli

    assert cli.main(["chaos", "--nemesis", "meteor", "--duration", "1"]) == 2
    assert "unknown broker nemesis meteor" in capsys.readouterr().err
