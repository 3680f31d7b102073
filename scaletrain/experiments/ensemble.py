"""`scaletrain ensemble RUN_ID ...`: saved models' predictions combined (seed 002's models trained
side by side, one per device), scored on their data set's test split.

The members' predictions are averaged in their task's terms: class probabilities for a classifier,
token distributions for a language model, output values for a regression, whatever a user's own
task predicts (`Task.predictions`). The average is scored by the runs' own task, rebuilt as each run
built it (`Task.output_of_predictions`), so the ensemble reports the metrics each member's own run
reported: never a task guessed from the data.

With several processes (`--nproc N`, or a job started by torchrun) each process predicts its own
members (member i on process i mod N, on its own device) and the chief gathers every member's
predictions once and combines them in member order: the same sums, in the same order, as one
process predicting them all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from scaletrain.data import load_dataset
from scaletrain.data.registry import sample_shape
from scaletrain.errors import UserError
from scaletrain.inference.saved import check_record_code, saved_model_path, saved_run_config
from scaletrain.tasks import TASKS, Task
from scaletrain.tracking.store import RunRecord
from scaletrain.training import build_training
from scaletrain.user_code.lightning import names_lightning_module

# Data settings that must agree for the runs' test splits to be the same samples.
SAME_DATA_KEYS = ("name", "num_samples", "shape", "num_classes", "data_dir", "val_fraction")


@dataclass(slots=True)
class MemberResult:
    run_id: str
    model: str
    metrics: dict[str, float]


@dataclass(slots=True)
class EnsembleResult:
    task: str                   # the runs' task: what the predictions are and how they are scored
    metric: str                 # the task's headline metric
    members: list[MemberResult]
    ensemble: dict[str, float]  # the combined predictions' metrics
    processes: int              # how many processes predicted the members
    chief: bool = True          # this process holds the result (the others of a job hold none)
    combined: str = "averaged predictions"   # what the mean of the members' predictions is (the task's)


def check_members(records: list[RunRecord], data_dir: str | None = None) -> str:
    """The members' common task, after checking they can be combined: each saved a model, all
    learned one task on the same data. Reads no data where the data sets state their samples."""
    if len(records) < 2:
        raise UserError("an ensemble needs at least two runs")
    first, tasks, brought = records[0], {}, set()
    for record in records:
        check_record_code(record)          # before the model is imported to ask whether it brings its task
        if names_lightning_module(record.config.get("model", {}).get("name", "")):
            brought.add(record.id)         # its task is its own (the adapter's), never looked up by name
        else:
            check_record_code(record, (record.summary_value("task"),))   # before its task's name is imported
        saved_model_path(record)
        tasks[record.id] = recorded_task(record, data_dir)
    if len(set(tasks.values())) > 1:
        named = ", ".join(f"{run} {task}" for run, task in tasks.items())
        raise UserError(f"the runs learned different tasks ({named}); an ensemble combines predictions of one kind: "
                        "pass runs of one task")
    for record in records:
        for key in SAME_DATA_KEYS:
            a, b = first.config.get("data", {}).get(key), record.config.get("data", {}).get(key)
            if a != b:
                raise UserError(f"runs {first.id} and {record.id} were trained on different data (data.{key}: {a!r} vs "
                                f"{b!r}); an ensemble combines predictions on one test split")
    # A registered or user's task class is checked now; one a model brings, on the built task after.
    named = first.id not in brought and (":" in tasks[first.id] or tasks[first.id] in TASKS)
    _check_scorable(tasks[first.id], TASKS.get(tasks[first.id]) if named else None)
    return tasks[first.id]


def _check_scorable(name: str, task: type[Task] | Task | None) -> None:
    """Refused in one line where the runs' task cannot score a mean of predictions (checked on the
    registered or user's class before any member is predicted, on the built task after)."""
    why = task.scores_predictions() if task is not None else ""
    if why:
        raise UserError(f"the runs' task {name} cannot score an ensemble: {why}; compare the runs with "
                        "`scaletrain runs compare` instead")


def evaluate_ensemble(records: list[RunRecord], device: str = "auto", data_dir: str | None = None,
                      devices: list[int] = ()) -> EnsembleResult:
    """Every member's metrics and the combined predictions', on the test split. In a job of several
    processes (torchrun's variables set) the members are shared out one per process, each on its
    device (`devices`: as --devices; default its local rank's); only the chief's result holds them
    (`chief`)."""
    from scaletrain.distributed.env import dist_env
    task_name = check_members(records, data_dir)
    world = dist_env().world_size
    if world > len(records):
        raise UserError(f"{world} processes for {len(records)} members: start at most one process per member "
                        f"(--nproc {len(records)})")
    first = saved_run_config(records[0], device, data_dir)
    dataset = load_dataset(first.data, seed=first.seed)   # the members' one data set (check_members)
    if world == 1:
        predicted = [_predict_member(r, device, data_dir, dataset) for r in records]
        return _combine(records, [p for p, _ in predicted], predicted[0][1], dataset, 1)
    return _evaluate_in_job(records, device, data_dir, task_name, dataset, world, list(devices))


def recorded_task(record: RunRecord, data_dir: str | None = None) -> str:
    """The task a run learned, by its record: the one its summary names (what its trainer built,
    a user's own task or a model's own loss among them), else the one its config names, else, for
    `auto` before any summary, the data's."""
    recorded = record.summary_value("task")
    if isinstance(recorded, str) and recorded:
        return recorded
    configured = record.config.get("task", "auto")
    if isinstance(configured, str) and configured != "auto":
        return configured
    return sample_shape(saved_run_config(record, "cpu", data_dir).data)[2]


def _predict_member(record: RunRecord, device: str, data_dir: str | None, dataset) -> tuple[torch.Tensor, Task]:
    """The member's predictions on the test split (float32, on the host), and its task as its run
    built it (what scores them)."""
    from scaletrain.checkpoint.weights import load_weights
    from scaletrain.distributed import build_strategy
    from scaletrain.distributed.env import DistEnv
    cfg = saved_run_config(record, device, data_dir)
    # One device of this process, whatever job it is part of: a member is one whole model.
    strategy = build_strategy(cfg.distributed, DistEnv())
    strategy.setup(device)
    try:
        with build_training(cfg, dataset=dataset, strategy=strategy) as built:
            trainer = built.trainer
            load_weights(trainer.model, saved_model_path(record), f"run {record.id}'s model")
            trainer.adopt(dataset)   # the input normalisation from the training split, as in training
            return trainer.predict(dataset.test), trainer.task
    finally:
        strategy.teardown()


def _combine(records: list[RunRecord], predictions: list[torch.Tensor], scoring: Task, dataset,
             processes: int) -> EnsembleResult:
    """The members' and the mean prediction's metrics by the runs' task (or the task it is scored
    as: a LightningModule's, the data's); `predictions` in member order."""
    scoring = scoring.scored_as()
    _check_scorable(scoring.name, scoring)
    split = dataset.test
    targets = split.y if hasattr(split, "y") else split.head(len(split)).y
    for record, p in zip(records, predictions, strict=True):
        _check_shape(record, p, tuple(predictions[0].shape), records[0].id)
    members = [MemberResult(r.id, r.config.get("model", {}).get("name", "?"), _score(scoring, p, targets))
               for r, p in zip(records, predictions, strict=True)]
    total = predictions[0].double().clone()
    for p in predictions[1:]:
        total += p.double()
    mean = (total / len(predictions)).float()
    return EnsembleResult(scoring.name, scoring.default_target or next(iter(scoring.metrics)), members,
                          _score(scoring, mean, targets), processes, combined=scoring.combined)


def _score(task, predictions: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    sums = task.eval_sums(task.output_of_predictions(predictions), targets)
    return {name: float(value) for name, value in task.eval_metrics(sums.tolist()).items()}


def _check_shape(record: RunRecord, predictions: torch.Tensor, shape: tuple[int, ...], other: str) -> None:
    if tuple(predictions.shape) != shape:
        raise UserError(f"run {record.id}'s predictions are shaped {tuple(predictions.shape)}, run {other}'s "
                        f"{shape}; an ensemble combines predictions of one shape")


def _evaluate_in_job(records: list[RunRecord], device: str, data_dir: str | None, task_name: str, dataset,
                     world: int, devices: list[int]) -> EnsembleResult:
    """This process's members (i mod world == rank) on its own device; every member's predictions
    gathered once by the chief, which combines them in member order."""
    import torch.distributed as dist

    from scaletrain.config import DistributedConfig
    from scaletrain.distributed import build_strategy
    from scaletrain.distributed.env import dist_env
    from scaletrain.distributed.shapes import agreed_shape
    env = dist_env()
    group = build_strategy(DistributedConfig(strategy="ddp", nproc=world, devices=devices), env)
    here = group.setup(device)
    try:
        predicted = [_predict_member(r, str(here), data_dir, dataset) for r in records[env.rank::world]]
        mine = [p for p, _ in predicted]
        slots = math.ceil(len(records) / world)
        # Every process sends the same shape: its members' predictions, padded to `slots`.
        # Each holds at least one member; a member shaped otherwise is refused by the process predicting it.
        shape = agreed_shape(mine[0].shape, group.all_reduce_max_, group.device)
        sent = torch.zeros((slots, *shape), dtype=torch.float32)
        for i, (record, p) in enumerate(zip(records[env.rank::world], mine, strict=True)):
            _check_shape(record, p, shape, "another")
            sent[i] = p
        sent = sent.to(here)
        received = [torch.empty_like(sent) for _ in range(world)] if env.is_chief else None
        dist.gather(sent, received, dst=0)
        if not env.is_chief:
            return EnsembleResult(task_name, "", [], {}, world, chief=False)
        # Member i was rank (i mod world)'s (i // world)-th.
        predictions = [received[i % world][i // world].cpu() for i in range(len(records))]
        # The chief predicted member 0: its task scores them all (check_members: one task).
        return _combine(records, predictions, predicted[0][1], dataset, world)
    finally:
        group.teardown()
