"""A user's code that fails, through the real CLI: where it raises (a __getitem__, a stream, a
task's __init__, a LightningModule's training_step), one line names their function, its file and
line, and the sample or step scaletrain was at, then the traceback cut to their own frames; exit 1,
the run recorded failed (no folder where it had not started), under loader workers and two
processes alike. Where it breaks a contract (None, an object array, a task's n_sums), one line
names the contract: exit 2, no traceback. (tests/plugins/user_faults.py holds each fault.)"""

from __future__ import annotations

import json
import re

import pytest

from tests.processes import run

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("processes")]
QUICK = ["--epochs", "1", "--batch-size", "32", "--no-progress"]


def _failed_as_theirs(result, function: str, where: str) -> str:
    """The user's failure: exit 1, the headline, then only the user's frames."""
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    err = result.stderr
    # One process: the line itself; under a launcher, the failing worker's role before it.
    headline = next(line for line in err.splitlines()
                    if re.match(r"scaletrain: (error: worker rank \d+ failed: )?your code failed: ", line))
    assert re.search(rf"your code failed: {function} \(user_faults\.py:\d+\) raised ", headline), headline
    assert where in headline, headline
    frames = err.split("Traceback (your code's frames only, most recent call last):\n", 1)[1]
    files = re.findall(r'File "([^"]+)"', frames)
    assert files and all(f.endswith("user_faults.py") for f in files), frames
    assert "Traceback (most recent call last)" not in err    # no traceback of ours or torch's
    return headline


def _status(folder) -> str | None:
    return json.loads((folder / "run.json").read_text())["status"] if (folder / "run.json").exists() else None


@pytest.mark.parametrize("extra", [[], ["--num-workers", "2"], ["--nproc", "2", "--num-workers", "2"]],
                         ids=["in process", "two loader workers", "two processes"])
def test_a_getitem_that_raises_mid_epoch_is_named_with_its_sample_and_step(tmp_path, extra):
    result = run(["train", "--model", "mlp", "--data", "user_faults:raising_reads", *QUICK, *extra,
                  "--run-dir", tmp_path / "r"], tmp_path)
    _failed_as_theirs(result, r"(RaisingReads\.)?__getitem__",
                      "ValueError: cannot decode record 300, reading sample 300 of the 512 its __len__ gives; "
                      "in epoch 1, training step")
    assert _status(tmp_path / "r") == "failed"


def test_a_read_that_raises_before_the_start_leaves_no_folder(tmp_path):
    """The class count reads every target before the run starts: the sample is named there too."""
    result = run(["train", "--model", "mlp", "--data", "user_faults:raising_reads", "--data-option", "stated=0",
                  *QUICK, "--run-dir", tmp_path / "r"], tmp_path)
    headline = _failed_as_theirs(result, r"RaisingReads\.__getitem__", "reading sample 300 of the 512")
    assert "training step" not in headline and not (tmp_path / "r").exists()


def test_a_len_that_lies_and_a_stream_that_raises_are_named(tmp_path):
    lying = run(["train", "--model", "mlp", "--data", "user_faults:lying_length", *QUICK, "--run-dir", tmp_path / "l"],
                tmp_path)
    _failed_as_theirs(lying, r"LyingLength\.__getitem__", "IndexError: list index out of range, reading sample")
    assert "of the 512 its __len__ gives" in lying.stderr
    stream = run(["train", "--model", "mlp", "--data", "user_faults:raising_stream", *QUICK,
                  "--run-dir", tmp_path / "s"], tmp_path)
    _failed_as_theirs(stream, r"RaisingStream\.__iter__", "ConnectionError: the stream's server went away at record "
                      "300, reading record 300 of the stream")


def test_a_tasks_init_that_raises_is_named(tmp_path):
    result = run(["train", "--model", "mlp", "--data", "user_faults:raising_reads", "--data-option", "bad=-1",
                  "--task", "user_faults:RaisingInit", *QUICK, "--run-dir", tmp_path / "r"], tmp_path)
    _failed_as_theirs(result, r"RaisingInit\.__init__", "KeyError: 'threshold', building your task user_faults:RaisingInit")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("model", ["user_faults:LitRaising", "user_faults:lit_raising"], ids=["class", "builder"])
def test_a_lightning_training_step_that_raises_is_named_with_its_step(tmp_path, model):
    """The LightningModule named by its class or returned by a builder function: its own step trains
    (a builder's module was once trained as a plain model, its training_step never called)."""
    pytest.importorskip("lightning")
    result = run(["train", "--model", model, "--data", "user_faults:raising_reads", "--data-option",
                  "bad=-1", *QUICK, "--run-dir", tmp_path / "r"], tmp_path)
    _failed_as_theirs(result, r"LitRaising\.training_step", "the loss went the wrong way on purpose, in epoch 1, "
                      "training step")
    assert _status(tmp_path / "r") == "failed"


@pytest.mark.parametrize("flags, contract", [
    (["--data", "user_faults:returns_none"], "data 'user_faults:returns_none' returned None; it must return the splits"),
    (["--data", "user_faults:object_array"], "the features are a NumPy array of Python objects (dtype object"),
    (["--data", "user_faults:raising_reads", "--data-option", "bad=-1", "--task", "user_faults:WrongSums"],
     "eval_sums must return a vector of n_sums = 2 sums, got a tensor of shape (3,)"),
])
def test_a_broken_contract_is_one_line_and_exit_2(tmp_path, flags, contract):
    result = run(["train", "--model", "mlp", *flags, *QUICK, "--run-dir", tmp_path / "r"], tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert contract in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("scaletrain: error: ")
    assert not (tmp_path / "r").exists()
