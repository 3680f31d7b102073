"""Every command on every kind of batch (issue 65): one small data set as tensors, tuples, dicts
and a Hugging Face BatchEncoding (tests/plugins/batch_kinds.py), through train (1 and 2
processes), find-batch-size (1 and 2 processes), plan-memory, scaling, autotune, sweep, predict,
export and ensemble. Each cell trains or answers; none is refused for the kind of its batches."""

from __future__ import annotations

import numpy as np
import pytest

from tests.processes import metrics, run, summary

pytestmark = [pytest.mark.usefixtures("processes"), pytest.mark.timeout(600)]



def ok(out, *expected: str) -> str:
    """The command's stdout, after checking it ended well and says what it did."""
    assert out.returncode == 0, out.stdout[-1500:] + out.stderr[-2500:]
    assert "Traceback" not in out.stderr, out.stderr[-2500:]
    for text in expected:
        assert text in out.stdout, out.stdout[-2500:]
    return out.stdout


def every_command_takes(kind, tmp_path):
    data = ["--data", f"batch_kinds:{kind}", "--model", "batch_kinds:model", "--batch-size", "32", "--no-progress"]
    runs = {}
    for nproc in ("1", "2"):
        folder = tmp_path / f"run{nproc}"
        ok(run(["train", *data, "--epochs", "3", "--nproc", nproc, "--run-dir", folder], tmp_path),
           "160 train / 32 val")
        history = metrics(folder)
        assert history[-1]["train_loss"] < history[0]["train_loss"]       # it learned
        runs[nproc] = summary(folder)["run_id"]
        found = ok(run(["find-batch-size", *data, "--memory-limit", "1GB", "--nproc", nproc], tmp_path),
                   "largest batch that ran")
        assert "per device" in found
    ok(run(["plan-memory", *data], tmp_path), "activations traced")
    ok(run(["scaling", *data], tmp_path), "efficiency")
    ok(run(["autotune", *data, "--trials", "1", "--confirm-rounds", "0", "--steps", "2"], tmp_path), "best:")
    ok(run(["sweep", "batch-size", "32", *data, "--epochs", "1", "--out", "sweep"], tmp_path))
    # The trained models: predictions on their validation split, in order, one row a sample.
    ok(run(["predict", runs["1"], "--split", "val", "--out", "val.npy"], tmp_path))
    assert np.load(tmp_path / "val.npy").shape == (32, 3)
    ok(run(["export", runs["1"]], tmp_path), "max |difference| 0")
    ok(run(["ensemble", runs["1"], runs["2"]], tmp_path), "accuracy")


# A class a kind (TestTensors, TestTuples, ...): each is a scope of its own, so the test workers share
# the kinds out.
for _kind in ("tensors", "tuples", "dicts", "encodings"):
    globals()[f"Test{_kind.title()}"] = type(f"Test{_kind.title()}", (), {
        "test_every_command": lambda self, tmp_path, kind=_kind: every_command_takes(kind, tmp_path)})
