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
    _failed_as_theirs(result, r"RaisingInit\.__init__", "KeyError: 'threshold', building your task "
                                                        "user_faults:RaisingInit")
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


@pytest.mark.parametrize("flags, line", [
    (["--data", "user_faults:negative_length"],
     "NegativeLength.__len__ does not give a sample count (__len__() should return >= 0)"),
    (["--data", "user_faults:dying_reads"], ") exited with code 3 while reading "),
    (["--data", "user_faults:dying_reads", "--data-option", "kill=true"], ") was killed by SIGKILL while reading "),
    (["--data", "user_faults:raising_reads", "--model", "user_faults:outputs"],
     "user_faults:outputs gives 2 outputs per sample, but the labels of user_faults:raising_reads go up to 2"),
    (["--data", "user_faults:raising_reads", "--data-option", "bad=-1", "--task", "user_faults:NeedsArgument"],
     "builds the task as NeedsArgument() with no arguments, and its __init__ cannot be called so (missing a "
     "required argument: 'weight')"),
    (["--model", "lit_classifier:OneCycleTooShort", "--data", "lit_classifier:Blobs"],
     "its OneCycleLR was built for total_steps 5, and this run takes 14 optimizer steps (1 epochs of 14)"),
    (["--model", "lit_classifier:LitClassifier", "--model-option", "lr=nan", "--data", "lit_classifier:Blobs"],
     "lit_classifier:LitClassifier's configure_optimizers gives the optimizer's lr, which must be a finite number"),
], ids=["negative len", "worker exits", "worker killed", "fewer outputs", "task needs an argument",
        "onecycle too short", "configure_optimizers lr"])
def test_the_red_teams_tracebacks_are_one_line(tmp_path, flags, line):
    """Each of these once printed a traceback (68 lines for a dead loader worker, two tracebacks)."""
    args = ["train", "--model", "mlp", *flags, *QUICK, "--run-dir", tmp_path / "r"]
    result = run(args, tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("scaletrain: error: ") and line in last, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    if "while reading" in line:    # which worker, and the samples it held: the batches in flight
        assert re.search(r"DataLoader worker \d \(pid \d+\) .* while reading \d batch\(es\): samples \d", last), last


def test_a_layer_that_cannot_take_the_data_is_named_with_what_it_was_given(tmp_path):
    """An nn.Sequential of torch's layers has no frame of the user's: the layer by its name."""
    result = run(["train", "--model", "user_faults:wrong_width", "--data", "user_faults:raising_reads",
                  "--data-option", "bad=-1", *QUICK, "--run-dir", tmp_path / "r"], tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "scaletrain: your code failed: your model's layer '0' (Linear(in_features=5, out_features=16, bias=True)) "
        "was given input shaped (32, 8) and raised RuntimeError: mat1 and mat2 shapes cannot be multiplied (32x8 "
        "and 5x16); check the model's layer sizes against the data's samples")
    # The planner traces it on fake tensors: torch's fake-tensor log (a whole traceback) stays out.
    planned = run(["plan-memory", "--model", "user_faults:wrong_width", "--data", "user_faults:raising_reads",
                   "--data-option", "bad=-1"], tmp_path)
    assert planned.returncode == 1, planned.stderr[-2000:]
    assert planned.stderr.strip().splitlines() == [
        "scaletrain: your code failed: your model's layer '0' (Linear(in_features=5, out_features=16, bias=True)) "
        "was given input shaped (128, 8) and raised RuntimeError: a and b must have same reduction dim, but got "
        "[128, 8] X [5, 16].; check the model's layer sizes against the data's samples"]


def test_more_outputs_than_classes_and_a_raising_collate_are_said(tmp_path):
    wide = run(["train", "--model", "user_faults:outputs", "--model-option", "width=5", "--data",
                "user_faults:raising_reads", "--data-option", "bad=-1", *QUICK, "--run-dir", tmp_path / "w"], tmp_path)
    assert wide.returncode == 0, wide.stderr[-2000:]
    assert "note: user_faults:outputs gives 5 outputs per sample and the labels of user_faults:raising_reads name " \
           "3 classes: the last 2 outputs never get a label" in wide.stdout
    collate = run(["train", "--model", "mlp", "--data", "user_faults:own_collate_raising", *QUICK, "--run-dir",
                   tmp_path / "c"], tmp_path)
    headline = _failed_as_theirs(collate, r"own_collate_raising\.<locals>\.collate", "collating a batch of")
    assert "pads them" not in headline
