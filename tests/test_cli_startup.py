"""The commands that only read answer at once: `--help`, `list`, `train --help` and `runs
list|show` never import torch (2-3 s of the 2-core machine's time), and the names `list` shows are
the registered ones."""

from __future__ import annotations

import subprocess
import sys

import pytest
from processes import cli_env

from scaletrain.tracking.store import RunStore

pytestmark = pytest.mark.usefixtures("processes")   # every test here starts processes

# Runs one command through the CLI's main() and says whether torch was imported on the way.
PROBE = """
import sys
from scaletrain.cli.main import main

try:
    code = main(sys.argv[1:])
except SystemExit as exc:       # argparse's --help
    code = exc.code
print("TORCH" if "torch" in sys.modules else "NO-TORCH", code)
"""


def _probe(args, cwd) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=cwd,
                         env=cli_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()[-1]


@pytest.mark.parametrize("args", [["--help"], ["list"], ["train", "--help"], ["runs", "--help"],
                                  ["runs", "list"], ["runs", "list", "--json"], ["runs", "show", "abcd1234"],
                                  ["plan-memory", "--help"], ["autotune", "--help"]])
def test_reading_commands_never_import_torch(args, tmp_path):
    store = RunStore(tmp_path / "scaletrain-runs" / "runs.db")
    store.start_run("abcd1234", name="probe", config={"model": {"name": "cnn1d"}}, environment={"device": "cpu"})
    store.finish_run("abcd1234", "finished", summary={"epochs_run": 1})
    store.close()
    assert _probe(args, tmp_path) == "NO-TORCH 0"


def test_a_config_error_is_found_without_torch(tmp_path):
    """A misspelt choice is checked against the names the source declares, before any import."""
    out = subprocess.run([sys.executable, "-c", PROBE, "train", "--data", "nosuch"], capture_output=True,
                         text=True, cwd=tmp_path, env=cli_env(), timeout=60)
    assert out.stdout.split() == ["NO-TORCH", "2"]
    assert "unknown" in out.stderr or "one of" in out.stderr
    assert "mnist1d" in out.stderr and "Traceback" not in out.stderr


def test_the_strategies_option_tables_are_known_without_importing_them(tmp_path):
    """`--shard-size`, `--stages`, `--num-ps` belong to tables the strategies own; the config and
    the flags find them by their declarations, in modules that import no torch."""
    probe = ("import sys\n"
             "from scaletrain.cli.main import build_parser\n"
             "from scaletrain.cli.train import config_from_args\n"
             "cfg = config_from_args(build_parser('train').parse_args(['train', '--strategy', 'hsdp', '--shard-size', "
             "'2']))\n"
             "print(cfg.distributed.hsdp.shard_size, sorted(cfg.distributed.tables), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=cli_env(),
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(maxsplit=1) == ["2", "['fsdp', 'hsdp', 'pipeline', 'ps', 'tensor'] False\n"]
