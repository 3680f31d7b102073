"""MLflow: the run as an MLflow run, through the ordinary tracking URI (MLFLOW_TRACKING_URI: a
tracking server, a database); without one, a SQLite store in the run folder (mlflow.db, artifacts
beside it), never the deprecated ./mlruns file store. The experiment is MLFLOW_EXPERIMENT_NAME,
else the run's group, else "scaletrain". A resumed run continues its MLflow run (found by the tag
scaletrain.run_id), which is also how `scaletrain runs export --to mlflow` stays idempotent."""

from __future__ import annotations

import os
import time
from pathlib import Path

RUN_ID_TAG = "scaletrain.run_id"
# MLflow retries an HTTP call up to 7 times with growing waits (minutes against a dead server);
# this logger runs on its own thread, but a run's end waits for it: fail fast unless the user
# chose otherwise.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")

STATUS = {"finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED", "pruned": "KILLED"}
BATCH = 100     # MLflow's most params (and tags) per log_batch call


def tracking_uri(run_dir: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}"


def experiment_id(client, name: str, artifact_root: Path | None) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    location = artifact_root.resolve().as_uri() if artifact_root is not None else None
    return client.create_experiment(name, artifact_location=location)


def find_run(client, experiment: str, run_id: str):
    found = client.search_runs([experiment], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'", max_results=1)
    return found[0] if found else None


def log_params(client, mlflow_run: str, params: dict[str, str]) -> None:
    from mlflow.entities import Param
    items = [Param(k, str(v)[:6000]) for k, v in sorted(params.items())]
    for i in range(0, len(items), BATCH):
        client.log_batch(mlflow_run, params=items[i:i + BATCH])


class MlflowLogger:
    name = "mlflow"

    def __init__(self):
        self.client = None
        self.run = None

    def start(self, info) -> None:
        import logging

        from mlflow.tracking import MlflowClient
        # MLflow and its migrations announce a new SQLite store's tables at INFO on stderr.
        for name in ("mlflow", "alembic"):
            logging.getLogger(name).setLevel(logging.WARNING)
        uri = tracking_uri(info.run_dir)
        self.client = MlflowClient(tracking_uri=uri)
        # A local SQLite store keeps its artifacts beside it (MLflow's default is ./mlruns).
        artifacts = info.run_dir / "mlflow-artifacts" if uri.startswith("sqlite:") else None
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or info.group or "scaletrain"
        experiment = experiment_id(self.client, name, artifacts)
        existing = find_run(self.client, experiment, info.run_id)
        if existing is not None:
            self.run = existing.info.run_id
            self.client.update_run(self.run, status="RUNNING")
            return
        tags = {RUN_ID_TAG: info.run_id, **{f"scaletrain.{k}": v for k, v in info.tags.items()}}
        self.run = self.client.create_run(experiment, run_name=info.name, tags=tags).info.run_id
        log_params(self.client, self.run, info.params)

    def log_epoch(self, step: int, epoch: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in {**metrics, "epoch": float(epoch)}.items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run, metrics=batch[i:i + 1000])

    def finish(self, status: str, summary: dict | None, files: list[Path]) -> None:
        for path in files:
            self.client.log_artifact(self.run, str(path))
        self.client.set_terminated(self.run, status=STATUS.get(status, "FAILED"))


def export_runs(store, records, uri: str) -> tuple[list[str], list[str]]:
    """Copies runs of the run store into the MLflow tracking store at `uri` (params, per-epoch
    metrics at their optimizer step and wall time, tags, status); a run already there (its tag
    scaletrain.run_id) is left as it is, so a second export adds nothing. Returns (exported,
    already there) run ids."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from scaletrain.options import flatten_mapping
    client = MlflowClient(tracking_uri=uri)
    exported, present = [], []
    for record in records:
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or record.group or "scaletrain"
        experiment = experiment_id(client, name, None)
        if find_run(client, experiment, record.id) is not None:
            present.append(record.id)
            continue
        summary = record.summary or {}
        tags = {RUN_ID_TAG: record.id, "scaletrain.exported_from": str(store.path)}
        for key in ("strategy", "precision", "device", "world_size"):
            if summary.get(key) is not None:
                tags[f"scaletrain.{key}"] = str(summary[key])
        start_ms = int(record.created_at * 1000)
        run = client.create_run(experiment, start_time=start_ms, run_name=record.name, tags=tags).info.run_id
        log_params(client, run, {k: str(v) for k, v in flatten_mapping(record.config).items()})
        metrics = []
        for epoch in store.epochs(record.id):
            step = int(epoch.get("optimizer_steps", epoch["epoch"] + 1))
            when = start_ms + int(epoch["elapsed_s"] * 1000)
            metrics += [Metric(k, float(v), when, step) for k, v in epoch.items()
                        if k not in ("epoch", "elapsed_s") and isinstance(v, (int, float)) and not isinstance(v, bool)]
            metrics.append(Metric("epoch", float(epoch["epoch"] + 1), when, step))
        for i in range(0, len(metrics), 1000):
            client.log_batch(run, metrics=metrics[i:i + 1000])
        status = STATUS.get(record.status, "RUNNING" if record.status == "running" else "FAILED")
        if status != "RUNNING":
            client.set_terminated(run, status=status, end_time=int(record.updated_at * 1000))
        exported.append(record.id)
    return exported, present
