"""Every command with every task, through the real CLI: train, evaluate, sweep, multi, tune,
find-batch-size and autotune on a regression (friedman1) and a language model (char-corpus), each
cell trained for real and judged by the task's own metrics (r2; perplexity), not accuracy.

Classification runs through every one of these commands in the commands' own test files
(test_cli, test_evaluator, test_experiments, test_tune, test_memory, test_autotune): this file
holds the cells that were untested. Each cell is as small as the command allows."""

from __future__ import annotations

import json

import pytest

from scaletrain.tracking.store import RunStore
from tests.processes import run

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("processes")]

# task: (the data and model flags, the task's own validation metric the cells must report)
TASKS = {
    "regression": (["--data", "friedman1", "--model", "mlp", "--train-subset", "256"], "r2"),
    "language-model": (["--data", "char-corpus", "--model", "gpt-tiny", "--seq-len", "16", "--train-subset", "128"],
                       "perplexity"),
}
QUICK = ["--epochs", "2", "--no-progress"]
SPACE = '["optim.lr"]\ntype = "float"\nlow = 0.001\nhigh = 0.01\nlog = true\n'


def _ok(result):
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    return result.stdout


def _finished_summaries(folder, group: str | None = None) -> list[dict]:
    with RunStore(str(folder / "scaletrain-runs" / "runs.db"), create=False) as store:
        return [r.summary for r in store.runs(group=group) if r.status == "finished"]


def _records(folder):
    with RunStore(str(folder / "scaletrain-runs" / "runs.db"), create=False) as store:
        return [r for r in store.runs() if r.group]


@pytest.fixture(params=TASKS)
def task(request):
    return request.param, *TASKS[request.param]


def test_train_then_evaluate_report_the_tasks_metrics(tmp_path, task):
    name, flags, metric = task
    out = _ok(run(["train", *flags, *QUICK, "--run-dir", "r", "--checkpoint-every", "2"], tmp_path))
    assert f"final val {metric}" in out and f"test {metric}" in out
    [summary] = _finished_summaries(tmp_path)
    assert summary["task"] == name and metric in summary["val_metrics"] and metric in summary["test_metrics"]
    out = _ok(run(["evaluate", "--watch", "r", "--once"], tmp_path))
    evaluated = [json.loads(line) for line in (tmp_path / "r" / "evaluations.jsonl").read_text().splitlines()]
    assert evaluated and all(f"val_{metric}" in e for e in evaluated) and f"val_{metric}" in out


def test_sweep_and_multi_show_the_tasks_metric(tmp_path, task):
    name, flags, metric = task
    target = ["--target", "0.5" if name == "regression" else "30", "--target-metric", metric]
    out = _ok(run(["sweep", "batch-size", "32", *flags, *QUICK, *target, "--out", "sw"], tmp_path))
    assert f"final val {metric}" in out and "1/1" in out
    [sweep_point] = _finished_summaries(tmp_path, "sweep-sw")
    assert sweep_point["task"] == name
    data, model = flags[1], flags[3]
    (tmp_path / "a.toml").write_text(f'epochs = 1\nprogress = false\n[model]\nname = "{model}"\n'
                                     f'[data]\nname = "{data}"\ntrain_subset = 128\nseq_len = 16\n')
    out = _ok(run(["multi", "a.toml", "--out", "mu"], tmp_path))   # multi's own table compares its runs
    assert f"final val {metric}" in out and f"test {metric}" in out
    [multi_run] = _finished_summaries(tmp_path, next(r.group for r in _records(tmp_path) if r.group.startswith("multi")))
    assert multi_run["task"] == name


def test_ensemble_combines_the_tasks_predictions_one_member_per_process(tmp_path, task):
    name, flags, metric = task
    for seed in (1, 2):
        _ok(run(["train", *flags, *QUICK, "--seed", str(seed), "--group", "members"], tmp_path))
    records = _records(tmp_path)
    ids = [r.id for r in records]
    serial = json.loads(_ok(run(["ensemble", *ids, "--json"], tmp_path)))
    assert serial["task"] == name and serial["metric"] == metric
    for record, member in zip(records, serial["members"], strict=True):   # each member scores as its run did
        assert member["metrics"] == pytest.approx(record.summary["test_metrics"], rel=1e-5)
    combined = serial["ensemble"][metric]
    # Averaging helps on these two (r2 up; perplexity below the worse member's).
    members = [m["metrics"][metric] for m in serial["members"]]
    assert (combined > min(members)) if name == "regression" else (combined < max(members))
    side_by_side = json.loads(_ok(run(["ensemble", *ids, "--json", "--nproc", "2"], tmp_path)))
    assert side_by_side["processes"] == 2 and side_by_side["members"] == serial["members"]
    assert side_by_side["ensemble"] == pytest.approx(serial["ensemble"], rel=1e-6)
    table = _ok(run(["ensemble", *ids], tmp_path))
    assert {"regression": "averaged outputs", "language-model": "averaged token distributions"}[name] in table


def test_an_ensemble_of_two_tasks_is_refused_in_one_line(tmp_path):
    for flags, _ in TASKS.values():
        _ok(run(["train", *flags, "--epochs", "1", "--no-progress", "--group", "g"], tmp_path))
    ids = [r.id for r in _records(tmp_path)]
    for extra in ([], ["--nproc", "2"]):
        out = run(["ensemble", *ids, *extra], tmp_path)
        assert out.returncode == 2 and "Traceback" not in out.stderr
        [line] = out.stderr.strip().splitlines()
        assert "learned different tasks" in line and "regression" in line and "language-model" in line


def test_tune_optimises_the_tasks_own_target(tmp_path, task):
    name, flags, metric = task
    (tmp_path / "space.toml").write_text(SPACE)
    out = _ok(run(["tune", "--space", "space.toml", "--trials", "1", *flags, *QUICK, "--out", "tu"], tmp_path))
    assert f"best: trial 0, val_{metric}" in out
    if name == "regression":   # no accuracy here: one line before any trial
        refused = run(["tune", "--space", "space.toml", *flags, "--metric", "val_accuracy", "--out", "t2"], tmp_path)
        assert refused.returncode == 2 and "the regression task reports val_loss, val_mae, val_r2" in refused.stderr
        assert not (tmp_path / "t2").exists()


def test_find_batch_size_and_autotune_run_the_task(tmp_path, task):
    name, flags, metric = task
    out = _ok(run(["find-batch-size", *flags, *QUICK, "--memory-limit", "1GB"], tmp_path))
    assert "largest batch that ran" in out
    out = _ok(run(["autotune", *flags, "--trials", "1", "--steps", "2", "--window-epochs", "2", "--knobs",
                   "steps_per_execution", "--out", "at"], tmp_path))
    rows = json.loads((tmp_path / "at" / "autotune.json").read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert [r["outcome"] for r in rows if r["outcome"] == "measured"] == ["measured"] and "best:" in out
    assert (tmp_path / "at" / "best.toml").is_file()
