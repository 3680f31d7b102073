"""`scaletrain ensemble RUN_ID ...`: the averaged class probabilities of saved models (seed 002's
models trained side by side), evaluated on their data set's test split."""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.checkpoint.weights import load_weights
from scaletrain.data import load_dataset
from scaletrain.errors import UserError
from scaletrain.inference.saved import saved_model_path, saved_run_config
from scaletrain.tracking.store import RunRecord
from scaletrain.training import build_training

# Data settings that must agree for the runs' test splits to be the same samples.
SAME_DATA_KEYS = ("name", "num_samples", "shape", "num_classes")


@dataclass(slots=True)
class MemberResult:
    run_id: str
    model: str
    accuracy: float


def check_members(records: list[RunRecord]) -> None:
    if len(records) < 2:
        raise UserError("an ensemble needs at least two runs")
    first = records[0]
    for record in records:
        saved_model_path(record)
        for key in SAME_DATA_KEYS:
            a, b = first.config.get("data", {}).get(key), record.config.get("data", {}).get(key)
            if a != b:
                raise UserError(f"runs {first.id} and {record.id} were trained on different data (data.{key}: {a!r} vs "
                                f"{b!r}); an ensemble averages predictions on one test split")


def evaluate_ensemble(records: list[RunRecord], device: str = "auto",
                      data_dir: str | None = None) -> tuple[list[MemberResult], float]:
    check_members(records)
    first_cfg = saved_run_config(records[0], device, data_dir)
    dataset = load_dataset(first_cfg.data, seed=first_cfg.seed)
    labels = dataset.test.y.long()
    members, total = [], None
    for record in records:
        cfg = saved_run_config(record, device, data_dir)
        with build_training(cfg, dataset=dataset) as built:
            trainer = built.trainer
            if trainer.task.name != "classification":
                raise UserError(f"run {record.id} trained a {trainer.task.name} model; an ensemble averages "
                                "class probabilities, so every member must be a classifier")
            load_weights(trainer.model, saved_model_path(record), f"run {record.id}'s model")
            trainer.evaluate(dataset)  # sets the input normalisation from the training split, as in training
            probabilities = trainer.predict(dataset.test.x)
        accuracy = (probabilities.argmax(-1) == labels).float().mean().item()
        members.append(MemberResult(record.id, cfg.model.name, accuracy))
        total = probabilities if total is None else total + probabilities
    ensemble = (total.argmax(-1) == labels).float().mean().item()
    return members, ensemble
