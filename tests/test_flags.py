"""Every command's own numeric flags are checked like config fields (cli/flags.py): a value out of
range, not finite or not a number is one line naming the flag, exit 2, before any work; and no
integer larger than 64 bits reaches the code it feeds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from processes import run_here

CLI = Path(__file__).resolve().parents[1] / "scaletrain" / "cli"

BAD = [
    (["scaling", "--step-time-ms", "-5"], "--step-time-ms must be > 0"),
    (["autotune", "--cap-factor", "1"], "--cap-factor must be > 1"),
    (["scaling", "--step-time-ms", "inf"], "--step-time-ms must be a finite number"),
    (["scaling", "--overlap", "2"], "--overlap must be >= 0 and <= 1"),
    (["scaling", "--assume-h100-mfu", "0"], "--assume-h100-mfu must be > 0"),
    (["scaling", "--measure-steps", "1"], "--measure-steps must be >= 2"),
    (["plan-memory", "--devices", "0"], "--devices must be >= 1"),
    (["plan-memory", "--headroom", "1"], "--headroom must be >= 0 and < 1"),
    (["find-batch-size", "--margin", "-0.1"], "--margin must be >= 0"),
    (["find-batch-size", "--max-batch-size", "99999999999999999999"], "--max-batch-size must fit a 64-bit integer"),
    (["runs", "list", "--last", "0"], "--last must be >= 1"),
    (["tune", "--trials", "abc"], "--trials must be a whole number"),
    (["tune", "--parallel", "0"], "--parallel must be >= 1"),
    (["sweep", "batch-size", "--repeats", "nan"], "--repeats must be a whole number"),
    (["autotune", "--window-epochs", "1"], "--window-epochs must be >= 2"),
    (["autotune", "--loss-tolerance", "-1"], "--loss-tolerance must be > 0"),
    (["evaluate", "--poll-s", "0", "somewhere"], "--poll-s must be > 0"),
    (["shard", "--samples-per-shard", "0", "--out", "x"], "--samples-per-shard must be >= 1"),
    (["multi", "--parallel", "0", "a.toml"], "--parallel must be >= 1"),
    (["train", "--epochs", "99999999999999999999"], "'epochs' must fit a 64-bit integer"),
]


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(a[:3]) for a, _ in BAD])
def test_a_bad_number_is_one_line_naming_the_flag(args, message, tmp_path):
    out = run_here(args, tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert list(tmp_path.iterdir()) == []             # nothing was started or written


def test_every_numeric_flag_declares_its_bounds():
    """A plain `type=int` or `type=float` flag would skip the check; `add_number` declares it."""
    plain = [f"{p.name}: {m.group(0)}" for p in CLI.glob("*.py")
             for m in re.finditer(r'add_argument\("(--[\w-]+)"[^)]*type=(int|float)', p.read_text())
             if m.group(1) != "--target-accuracy"]     # train's alias of the config's checked `target`
    assert plain == []


@pytest.mark.usefixtures("processes")
def test_a_run_too_long_for_its_schedule_is_refused_before_training(tmp_path):
    out = run_here(["train", "--data", "digits", "--model", "mlp", "--epochs", "9999999999", "--no-record",
                    "--no-progress"], tmp_path)
    assert out.returncode == 2, out.stderr
    assert "optimizer steps; the learning-rate schedule holds at most 100,000,000" in out.stderr
    assert "Traceback" not in out.stderr
