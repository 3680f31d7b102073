"""The sidecar evaluator beside a real training: equal to in-loop evaluation, never in its way."""

from __future__ import annotations

import json
import os
import signal
from unittest import mock

import pytest

from scaletrain.distributed.cluster import parse_cluster_spec
from scaletrain.evaluation.sidecar import SidecarEvaluator, read_evaluations
from scaletrain.tracking.store import RunStore
from tests.processes import DIGITS_MLP, committed_steps, metrics, run, run_here, start, summary, wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("processes")]


def _evaluations(run_dir) -> list[dict]:
    return read_evaluations(run_dir)


def test_sidecar_equals_in_loop_evaluation_survives_a_kill_and_stops_with_the_run(tmp_path):
    run_dir = tmp_path / "r"
    # The sidecar may start first (the README's `train ... &` then `evaluate --watch`): it waits for the run.
    first = start(["evaluate", "--watch", str(run_dir), "--poll-s", "0.2"], tmp_path, tmp_path / "eval1.log")
    # digits: 1294 training samples, 20 steps of 64 an epoch; a checkpoint at every epoch's end.
    training = start(["train", *DIGITS_MLP, "--model", "faulty_models:slow_mlp", "--model-option", "delay_s=0.05",
                      "--epochs", "4", "--batch-size", "64", "--checkpoint-every", "20", "--keep-checkpoints", "10",
                      "--run-dir", str(run_dir)], tmp_path, tmp_path / "train.log")
    try:
        wait_for(lambda: _evaluations(run_dir), 120, "a first evaluation")
        first.send_signal(signal.SIGKILL)   # an evaluator killed mid-run
        first.wait(timeout=30)
        assert training.poll() is None and len(_evaluations(run_dir)) < 4
        second = start(["evaluate", "--watch", str(run_dir), "--poll-s", "0.2"], tmp_path, tmp_path / "eval2.log")
        assert training.wait(timeout=240) == 0, (tmp_path / "train.log").read_text()[-3000:]
        # It ends by itself once the run has finished and its last checkpoint is evaluated.
        assert second.wait(timeout=120) == 0, (tmp_path / "eval2.log").read_text()[-3000:]
    finally:
        for proc in (training, locals().get("first"), locals().get("second")):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    # Training was not disturbed: it ran every epoch to the end.
    assert summary(run_dir)["epochs_run"] == 4
    evaluated = _evaluations(run_dir)
    assert [e["step"] for e in evaluated] == committed_steps(run_dir / "checkpoints") == [20, 40, 60, 80]
    # Each checkpoint's results equal what the loop measured after the same epoch.
    for e, m in zip(evaluated, metrics(run_dir), strict=True):
        assert e["epoch"] == m["epoch"]
        assert e["val_loss"] == pytest.approx(m["val_loss"], rel=1e-6)
        assert e["val_accuracy"] == m["val_accuracy"]
    shown = run_here(["runs", "show", summary(run_dir)["run_id"], "--json"], tmp_path)
    assert [e["step"] for e in json.loads(shown.stdout)["evaluations"]] == [20, 40, 60, 80]


def test_the_cluster_evaluator_task_evaluates_the_run_and_bad_specs_are_one_line(tmp_path):
    run_dir = tmp_path / "r"
    trained = run(["train", *DIGITS_MLP, "--epochs", "2", "--batch-size", "64", "--checkpoint-every", "10",
                   "--no-eval-each-epoch", "--run-dir", str(run_dir)], tmp_path)
    assert trained.returncode == 0, trained.stderr
    # An evaluator killed while it records its first result leaves that step undone in both places.
    with SidecarEvaluator(run_dir, store=str(tmp_path / "scaletrain-runs" / "runs.db")) as killed:
        with mock.patch.object(RunStore, "log_evaluation", side_effect=SystemExit("killed")), \
                pytest.raises(SystemExit):
            killed.watch(once=True)
    assert _evaluations(run_dir) == []
    spec = json.dumps({"cluster": {"worker": ["127.0.0.1:29777"], "evaluator": ["127.0.0.1:29778"]},
                       "task": {"type": "evaluator", "index": 0}})
    assert parse_cluster_spec(spec).is_evaluator and parse_cluster_spec(spec).rank == -1
    evaluator = run(["train", "--run-dir", str(run_dir)], tmp_path, SCALETRAIN_CLUSTER=spec)
    assert evaluator.returncode == 0, evaluator.stderr
    assert [e["step"] for e in _evaluations(run_dir)] == committed_steps(run_dir / "checkpoints")
    assert all(e["val_accuracy"] > 0.8 for e in _evaluations(run_dir)[-1:])
    shown = run_here(["runs", "show", summary(run_dir)["run_id"], "--json"], tmp_path)
    assert [e["step"] for e in json.loads(shown.stdout)["evaluations"]] == committed_steps(run_dir / "checkpoints")
    no_dir = run(["train", *DIGITS_MLP], tmp_path, SCALETRAIN_CLUSTER=spec)
    assert no_dir.returncode == 2 and "needs --run-dir" in no_dir.stderr and "Traceback" not in no_dir.stderr
    missing = run_here(["evaluate", "--watch", str(tmp_path / "none"), "--start-timeout-s", "0.3"], tmp_path)
    assert missing.returncode == 2 and "holds no run" in missing.stderr
    assert "waiting for a training to start" in missing.stdout
    no_poll = run_here(["evaluate", "--watch", str(run_dir), "--poll-s", "0"], tmp_path)
    assert no_poll.returncode == 2 and "--poll-s must be > 0" in no_poll.stderr
