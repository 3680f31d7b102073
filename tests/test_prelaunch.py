"""Under --nproc, what the workers would refuse is refused by the launcher, before any of them
starts (training/preflight.py); an error a worker still meets is printed once, as the job's last
line, with the exit code it would have had alone (distributed/launch.py)."""

from __future__ import annotations

import json

import pytest

from tests.processes import DIGITS_MLP, run

pytestmark = pytest.mark.usefixtures("processes")   # every test here starts processes

GPT = ["--model", "gpt-small", "--data", "char-corpus", "--no-progress", "--epochs", "1"]

# Each found by the launcher: (the command's flags, what its one line says).
BEFORE_LAUNCH = {
    "backup workers": (["--strategy", "ps", "--nproc", "3", "--backup-workers", "2"], "--backup-workers 2"),
    "pipeline, not a sequence of layers": (["--model", "mlp", "--data", "digits", "--strategy", "pipeline", "--nproc",
                                            "2", "--stages", "2"], "cannot be cut into pipeline stages"),
    "tensor degree vs heads": ([*GPT, "--strategy", "tensor", "--nproc", "3", "--tensor-parallel", "3"],
                               "--tensor-parallel 3 must divide the heads (8)"),
    "unknown split point": ([*GPT, "--strategy", "pipeline", "--nproc", "2", "--stages", "2",
                             "--split-points", "nosuch.layer"], "--split-points: no layer named nosuch.layer"),
    "tensor on a cnn": (["--strategy", "tensor", "--nproc", "2", "--tensor-parallel", "2"],
                        "CNN1d has no repeated block"),
    "fsdp block class": (["--strategy", "fsdp", "--nproc", "2", "--block-classes", "Nope"],
                         "--block-classes: no module of class Nope"),
    "checkpointing without blocks": (["--nproc", "2", "--activation-checkpointing"],
                                     "--activation-checkpointing recomputes repeated blocks"),
}


@pytest.mark.parametrize("case", BEFORE_LAUNCH)
def test_the_launcher_refuses_in_one_line_before_any_worker_starts(tmp_path, case):
    flags, says = BEFORE_LAUNCH[case]
    result = run(["train", "--epochs", "1", *flags, "--run-dir", "r"], cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scaletrain: error: ") and says in lines[0], result.stderr
    assert not (tmp_path / "r").exists()      # nothing written


def test_an_error_a_worker_meets_is_printed_once_last_with_its_own_exit_code(tmp_path):
    """A shard whose labels exceed the manifest's classes is found only while batches are decoded,
    by every rank: the job prints it once, as its last line, exit 2 (not 1)."""
    made = run(["shard", "--data", "digits", "--out", "shards", "--samples-per-shard", "500"], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    manifest = tmp_path / "shards" / "manifest.json"
    body = json.loads(manifest.read_text())
    body["num_classes"] = 5
    manifest.write_text(json.dumps(body))
    result = run(["train", *DIGITS_MLP, "--data", "shards", "--data-dir", "shards", "--epochs", "1", "--nproc", "2",
                  "--run-dir", "r"], cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    says = "has the label 9, outside the manifest's 5 classes"
    assert result.stderr.count(says) == 1, result.stderr[-3000:]
    assert says in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr and "failed with exit code" not in result.stderr
