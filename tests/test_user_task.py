"""A user's own task (`--task package.module:Name`, `Trainer(task=...)`) and a model that computes
its own loss (a Hugging Face GPT-2 built from its config, on a tokenised `datasets.Dataset`),
through the Python API and the real CLI under torchrun (ddp, fsdp, activation checkpointing)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from scaletrain.errors import ConfigError
from scaletrain.tasks import build_task
from scaletrain.training import Trainer
from tests.processes import PLUGINS, run, summary
from tests.test_user_data import _config as user_data_config

sys.path.insert(0, str(PLUGINS))
import multilabel  # noqa: E402


def _config(tmp_path, **overrides):
    return user_data_config(tmp_path, **{"epochs": 4, "batch_size": 64, **overrides})


def _micro_f1(probabilities: torch.Tensor, truth: torch.Tensor) -> float:
    predicted, truth = probabilities > 0.5, truth > 0.5
    tp = int((predicted & truth).sum())
    return 2 * tp / (2 * tp + int((predicted & ~truth).sum()) + int((~predicted & truth).sum()))


@pytest.mark.parametrize("given", ["instance", "name"])
def test_a_user_task_trains_and_scores_exactly(tmp_path, given):
    """Its metric is the user's formula over the whole split: the evaluation's F1 (sums over
    batches) equals micro-F1 of the predictions, computed by hand."""
    data = multilabel.arrays()
    kwargs = {"task": multilabel.MultiLabel()} if given == "instance" else {}
    cfg = _config(tmp_path, **({"task": "multilabel:MultiLabel"} if given == "name" else {}))
    torch.manual_seed(0)
    with Trainer(multilabel.build((16,), 5), cfg, **kwargs) as trainer:
        history = trainer.fit(data["train"], val=data["val"], test=data["test"])
        assert set(history[-1]) >= {"val_loss", "val_f1"} and "train_" not in history[-1]
        assert history[-1]["val_f1"] > 0.7 > history[0]["val_f1"] - 0.3
        scores = trainer.evaluate(data["test"])
        probabilities = trainer.predict(data["test"][0])
    assert scores["f1"] == pytest.approx(_micro_f1(probabilities, data["test"][1]), abs=1e-12)


def test_user_task_contract_is_checked_in_one_line():
    for name, words in [("multilabel:NotATask", "not a subclass of scaletrain.tasks.Task"),
                        ("multilabel:NoSums", "lacks eval_metrics, eval_sums"),
                        ("multilabel:Colliding", "collides with the logs' own train_loss"),
                        ("multilabel:Missing", "has no function 'Missing'"),
                        ("nowhere:Task", "cannot import module 'nowhere'"),
                        ("multilabel:NoDefaultTarget", "the class sets no default_target, and the inherited 'loss' is "
                                                       "not one of its metrics \\(f1\\); set default_target = 'f1'")]:
        with pytest.raises(ConfigError, match=words):
            build_task(name, "regression")
    from scaletrain.tasks import TASKS
    assert build_task("multilabel:MultiLabel", "regression").name == "multilabel:MultiLabel"
    assert not any(":" in name for name in TASKS)     # looked up, never listed among ours


@pytest.mark.usefixtures("processes")
def test_user_task_through_the_cli_on_two_processes(tmp_path):
    """`--task module:Name` under torchrun: its sums reduce over ranks, so the run's reported test F1
    is the F1 of the model it saved, evaluated on one process."""
    args = ["train", "--model", "multilabel:build", "--data", "multilabel:splits", "--task", "multilabel:MultiLabel",
            "--epochs", "3", "--batch-size", "64", "--lr", "0.01", "--no-progress", "--run-dir", tmp_path / "run"]
    result = run([*args, "--nproc", "2", "--strategy", "ddp"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "multilabel:MultiLabel" in result.stdout
    reported = summary(tmp_path / "run")
    from scaletrain.checkpoint.weights import read_weights
    model = multilabel.build((16,), 5)
    model.load_state_dict(read_weights(str(tmp_path / "run" / "model.pt"), "model"))
    data = multilabel.splits()
    with Trainer(model, _config(tmp_path / "eval", task="multilabel:MultiLabel")) as trainer:
        scores = trainer.evaluate(data["test"])
    assert reported["test_metrics"]["f1"] == pytest.approx(scores["f1"], abs=1e-9)
    # The planners trace and measure the step through the user's loss.
    flags = ["--model", "multilabel:build", "--data", "multilabel:splits", "--task", "multilabel:MultiLabel"]
    planned = run(["plan-memory", *flags, "--batch-size", "64"], tmp_path)
    assert planned.returncode == 0 and "activations traced" in planned.stdout, planned.stderr[-2000:]
    tuned = run(["autotune", *flags, "--trials", "2", "--confirm-rounds", "0", "--steps", "3", "--knobs", "steps_per_execution",
                 "--out", tmp_path / "tuned"], tmp_path)
    assert tuned.returncode == 0 and "best:" in tuned.stdout, tuned.stdout[-2000:] + tuned.stderr[-2000:]


@pytest.mark.usefixtures("processes")
def test_ensemble_scores_by_the_runs_own_task(tmp_path):
    """Two runs of a user's multi-label task: the ensemble averages their sigmoid probabilities and
    reports the task's micro-F1 (its float targets would read as a regression to a guess from the
    data), each member's F1 being its run's own test F1; on one process and on two alike."""
    from scaletrain.checkpoint.weights import read_weights
    ids = []
    for seed in (1, 2):
        trained = run(["train", "--model", "multilabel:build", "--data", "multilabel:splits", "--task",
                       "multilabel:MultiLabel", "--epochs", "2", "--batch-size", "64", "--lr", "0.01", "--seed", str(seed),
                       "--no-progress", "--run-dir", tmp_path / f"r{seed}", "--run-id", f"ml{seed}"], tmp_path)
        assert trained.returncode == 0, trained.stderr[-2000:]
        ids.append(f"ml{seed}")
    serial = run(["ensemble", *ids, "--json"], tmp_path)
    assert serial.returncode == 0, serial.stderr[-2000:]
    result = json.loads(serial.stdout)
    assert result["task"] == "multilabel:MultiLabel" and result["metric"] == "f1"
    for member, seed in zip(result["members"], (1, 2), strict=True):
        assert member["metrics"]["f1"] == pytest.approx(summary(tmp_path / f"r{seed}")["test_metrics"]["f1"], abs=1e-9)
    x, y = multilabel.arrays()["test"]
    mean = 0
    for seed in (1, 2):
        model = multilabel.build((16,), 5)
        model.load_state_dict(read_weights(str(tmp_path / f"r{seed}" / "model.pt"), "model"))
        with torch.no_grad():
            mean = mean + torch.sigmoid(model(x)) / 2
    assert result["ensemble"]["f1"] == pytest.approx(_micro_f1(mean, y), abs=1e-6)
    side_by_side = run(["ensemble", *ids, "--json", "--nproc", "2"], tmp_path)
    assert side_by_side.returncode == 0, side_by_side.stderr[-2000:]
    assert json.loads(side_by_side.stdout)["ensemble"] == pytest.approx(result["ensemble"], rel=1e-6)


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("name, words", [
    ("multilabel:PerSampleLoss", "loss must be a scalar floating-point tensor .* got a tensor of shape \\(\\d+,\\)"),
    ("multilabel:NoSums", "lacks eval_metrics, eval_sums")])
def test_a_broken_user_task_is_one_line_from_the_cli(tmp_path, name, words):
    result = run(["train", "--model", "multilabel:build", "--data", "multilabel:splits", "--task", name,
                  "--epochs", "1", "--no-progress", "--run-dir", tmp_path / "run"], tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    import re
    assert re.search(words, result.stderr), result.stderr


@pytest.fixture
def hf_gpt():
    """The Hugging Face plugin (transformers and datasets are optional extras)."""
    pytest.importorskip("transformers")
    pytest.importorskip("datasets")
    import hf_gpt
    return hf_gpt


def test_a_hugging_face_model_trains_on_its_own_loss(tmp_path, hf_gpt):
    """GPT-2 from its config on dict rows: no task code; the loss falls, and evaluation's loss is the
    model's own (its mean over the split's batches)."""
    data = hf_gpt.splits(256)
    torch.manual_seed(0)
    with Trainer(hf_gpt.build(None, None), _config(tmp_path, epochs=3, batch_size=32)) as trainer:
        history = trainer.fit(data["train"], val=data["val"])
        assert trainer.task.name == "own-loss"
        model = trainer.model
    assert history[-1]["val_loss"] < 0.5 * history[0]["train_loss"]
    assert history[-1]["val_perplexity"] == pytest.approx(np.exp(history[-1]["val_loss"]))
    model.eval()
    with torch.no_grad():
        by_hand = [model(**{k: v[i:i + 32] for k, v in data["val"][:].items()}).loss for i in range(0, 128, 32)]
    assert history[-1]["val_loss"] == pytest.approx(float(torch.stack(by_hand).mean()), rel=1e-5)


@pytest.mark.usefixtures("processes")
def test_a_hugging_face_model_under_ddp_and_fsdp_with_checkpointing(tmp_path, hf_gpt):
    """The same run on one process, on two under ddp, and on two under fsdp with its GPT2Blocks as
    the sharded and recomputed units: the same losses (no dropout; fp32)."""
    base = ["train", "--model", "hf_gpt:build", "--data", "hf_gpt:splits", "--epochs", "2", "--batch-size", "32",
            "--no-progress", "--lr", "0.003"]
    losses = {}
    for name, extra in [("single", []), ("ddp", ["--nproc", "2", "--strategy", "ddp"]),
                        ("fsdp", ["--nproc", "2", "--strategy", "fsdp", "--activation-checkpointing"])]:
        result = run([*base, *extra, "--run-dir", tmp_path / name, "--run-id", f"gpt-{name}"], tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        lines = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [(m["train_loss"], m["val_loss"]) for m in lines]
    assert "own-loss" in result.stdout
    for name in ("ddp", "fsdp"):
        assert np.allclose(losses[name], losses["single"], rtol=2e-4), (name, losses)
    # predict gives the token distributions; export (one input tensor) refuses named inputs in one line.
    predicted = run(["predict", "gpt-fsdp", "--split", "val", "--out", tmp_path / "p.npy"], tmp_path)
    assert predicted.returncode == 0, predicted.stderr[-2000:]
    probabilities = np.load(tmp_path / "p.npy")
    assert probabilities.shape == (128, hf_gpt.LENGTH, hf_gpt.VOCAB)
    assert np.allclose(probabilities.sum(-1), 1, atol=1e-4)
    exported = run(["export", "gpt-single", "--out", tmp_path / "m.pt2"], tmp_path)
    assert exported.returncode == 2 and "several named inputs (input_ids, attention_mask)" in exported.stderr
    assert "Traceback" not in exported.stderr and not (tmp_path / "m.pt2").exists()


@pytest.mark.usefixtures("processes")
def test_own_loss_refuses_what_it_cannot_train(tmp_path, hf_gpt):
    result = run(["train", "--model", "hf_gpt:build_logits_only", "--data", "hf_gpt:splits", "--epochs", "1",
                  "--no-progress", "--run-dir", tmp_path / "run"], tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "without .loss" in result.stderr, result.stderr
    result = run(["train", "--model", "multilabel:build", "--data", "multilabel:splits", "--task", "own-loss",
                  "--epochs", "1", "--no-progress", "--run-dir", tmp_path / "run2"], tmp_path)
    assert result.returncode == 2 and "forward takes no labels=" in result.stderr, result.stderr


@pytest.mark.parametrize("kind", ["user-task", "own-loss"])
def test_the_step_stays_free_of_host_syncs(tmp_path, kind, request):
    """The no-host-sync rule of tests/test_trainer.py holds for a user's task and for a model's own
    loss: the step (forward, the task's loss, backward, clipping, the update) never reads a tensor
    back, under fp16's loss scaling too. (transformers' GPT-2 itself does, in its forward: its mask
    and packed-sequence checks; the own-loss case runs a model of its convention that does not.)"""
    from scaletrain.config import OptimConfig, PrecisionConfig
    from tests.test_trainer import steps_without_host_syncs
    cfg = _config(tmp_path, epochs=1, batch_size=32, precision=PrecisionConfig(policy="fp16-mixed"),
                  optim=OptimConfig(lr=1e-3, clip_grad_norm=1.0))
    if kind == "user-task":
        data, model, cfg.task = multilabel.splits(), multilabel.build((16,), 5), "multilabel:MultiLabel"
    else:
        hf = request.getfixturevalue("hf_gpt")
        data, model = hf.splits(128), hf.build_sync_free(None, None)
    with Trainer(model, cfg) as trainer:
        dataset = trainer.as_dataset(data["train"], val=data["val"])
        trainer.fit(dataset)
        x, y = next(iter(trainer.loader(dataset.train, train=True)))
        assert isinstance(x, dict) or kind == "user-task"
        steps_without_host_syncs(trainer, x, y)


def test_plan_memory_traces_a_dict_input_model_as_it_trains(hf_gpt):
    """The planner's example batch takes the data's named inputs and the model's own loss: its
    traced activations equal the same count on real tensors through the trainer's task."""
    from scaletrain.data.user import as_dataset
    from scaletrain.memory.planner import Planner, PlanRequest
    from scaletrain.memory.tracker import LiveBytes, storage_key
    data = as_dataset(hf_gpt.splits(64)["train"], count_classes=False)
    batch = 16
    req = PlanRequest(model="hf_gpt:build", input_shape=data.input_shape, num_classes=hf_gpt.VOCAB,
                      task=data.task, batch_size=batch, example=data.example)
    planner = Planner(req)
    assert planner.task.name == "own-loss"
    predicted = planner.plan("ddp", 1, batch).activation_bytes
    torch.manual_seed(0)
    model = hf_gpt.build(None, None)
    task = build_task("auto", data.task, model)
    rows = data.train.head(batch)
    x = task.model_inputs(rows.x, rows.y)
    tracker = LiveBytes(list(model.parameters()) + list(model.buffers()) + list(x.values()))
    with tracker:
        task.loss(task.forward(model, x), rows.y).backward()
    real = tracker.peak_excluding({storage_key(p.grad) for p in model.parameters()})
    assert predicted == pytest.approx(real, rel=0.10)


@pytest.mark.usefixtures("processes")
def test_plan_memory_and_autotune_on_a_hugging_face_model(tmp_path, hf_gpt):
    flags = ["--model", "hf_gpt:build", "--data", "hf_gpt:splits", "--batch-size", "32"]
    planned = run(["plan-memory", *flags, "--activation-checkpointing"], tmp_path)
    assert planned.returncode == 0 and "activations traced" in planned.stdout, planned.stderr[-2000:]
    tuned = run(["autotune", *flags, "--trials", "2", "--confirm-rounds", "0", "--steps", "3", "--knobs", "activation_checkpointing",
                 "--out", tmp_path / "tuned"], tmp_path)
    assert tuned.returncode == 0 and "best:" in tuned.stdout, tuned.stdout[-2000:] + tuned.stderr[-2000:]
    assert "refused" not in tuned.stdout     # recomputed blocks give the baseline's loss
    # The scaling predictor measures the step as the trainer runs it (FLOPs through the model's own loss).
    scaled = run(["scaling", *flags, "--measure-steps", "2", "--json"], tmp_path)
    assert scaled.returncode == 0, scaled.stderr[-2000:]
    rows = json.loads(scaled.stdout)      # the log line about counting classes goes to stderr
    assert rows[0]["devices"] == 1 and rows[0]["step_time_s"] > 0


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("nproc", [1, 2])
def test_find_batch_size_on_named_inputs(tmp_path, hf_gpt, nproc):
    """Dict rows whose labels the model takes by name: the finder draws its trial batches as the
    loaders deliver them (each named input, the labels among them) and counts every input's bytes
    against the budget, on one process and on two."""
    found = run(["find-batch-size", "--model", "hf_gpt:build", "--data", "hf_gpt:splits", "--memory-limit", "40MB",
                 "--nproc", str(nproc), "--json"], tmp_path)
    assert found.returncode == 0 and "Traceback" not in found.stderr, found.stderr[-2000:]
    result = json.loads(found.stdout)
    fitting = [t for t in result["trials"] if t["fits"]]
    assert result["max_batch_size"] >= 32 and all(t["peak_bytes"] <= 40e6 for t in fitting)
    assert any(not t["fits"] and "--memory-limit" in t["reason"] for t in result["trials"])
    peaks = [t["peak_bytes"] for t in sorted(fitting, key=lambda t: t["batch_size"])]
    assert peaks == sorted(peaks)


def test_gradient_accumulation_cuts_named_inputs_into_micro_batches(tmp_path, hf_gpt):
    """Two micro-batches of 16 dict rows (each input and the labels cut alike) give the step of one
    batch of 32: the same losses, epoch after epoch (fp32, no dropout)."""
    from scaletrain.config import OptimConfig
    data = hf_gpt.splits(128)
    histories = []
    for accum in (1, 2):
        torch.manual_seed(0)
        cfg = _config(tmp_path / str(accum), epochs=2, batch_size=32, optim=OptimConfig(lr=3e-3, grad_accum_steps=accum))
        with Trainer(hf_gpt.build(None, None), cfg) as trainer:
            histories.append([(h["train_loss"], h["val_loss"]) for h in trainer.fit(data["train"], val=data["val"])])
    assert np.allclose(histories[0], histories[1], rtol=1e-4), histories


@pytest.mark.usefixtures("processes")
def test_tune_optimises_a_user_tasks_metric(tmp_path):
    """`tune --metric auto` on a user task is its default target (val_f1, maximised); a built-in
    metric the task does not report is refused; the study's best value is one a trial logged."""
    optuna = pytest.importorskip("optuna")
    from scaletrain.errors import UserError
    from scaletrain.experiments.tune import resolve_objective
    from scaletrain.tasks import TASKS
    task = build_task("multilabel:MultiLabel", "regression")
    assert resolve_objective("auto", "auto", task) == ("val_f1", "maximize")
    with pytest.raises(UserError, match="reports val_loss, val_f1"):
        resolve_objective("val_accuracy", "auto", task)
    assert resolve_objective("auto", "auto", TASKS["own-loss"](tokens=True)) == ("val_perplexity", "minimize")
    (tmp_path / "space.toml").write_text('[lr]\ntype = "float"\nlow = 3e-3\nhigh = 3e-2\nlog = true\n')
    result = run(["tune", "--space", "space.toml", "--trials", "2", "--out", "study", "--model", "multilabel:build",
                  "--data", "multilabel:splits", "--task", "multilabel:MultiLabel", "--epochs", "2"], tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    study = optuna.load_study(study_name="space", storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}")
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE and 0.5 < study.best_value <= 1.0
