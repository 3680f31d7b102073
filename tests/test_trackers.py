"""External trackers for real: a local `mlflow server` process read back with MlflowClient, a W&B
offline run read back from its files, TensorBoard's event files, a tracking server that dies
mid-run, and `runs export --to mlflow`."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.processes import DIGITS_MLP, free_port, run, run_here, start, wait_for

if importlib.util.find_spec("mlflow") is None:   # (imported by the tests that use it: 1.4 s at collection)
    pytest.skip("mlflow is not installed", allow_module_level=True)
QUICK = [*DIGITS_MLP, "--batch-size", "64"]



def _start_server(folder):
    """`mlflow server` on loopback with a SQLite backend; returns (process, uri, backend file)."""
    folder.mkdir(parents=True, exist_ok=True)
    port, db = free_port(), folder / "backend.db"
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                               "--backend-store-uri", f"sqlite:///{db}", "--artifacts-destination",
                               (folder / "artifacts").as_uri(), "--workers", "1"],
                              stdout=(folder / "server.log").open("w"), stderr=subprocess.STDOUT,
                              start_new_session=True, env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as reply:
                if reply.status == 200:
                    return server, uri, db
        except OSError:
            time.sleep(0.5)
        assert server.poll() is None, (folder / "server.log").read_text()
    os.killpg(server.pid, signal.SIGKILL)
    raise AssertionError("mlflow server did not answer in 120 s: " + (folder / "server.log").read_text()[-2000:])


def _history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


@pytest.mark.usefixtures("processes")
def test_an_mlflow_server_gets_the_whole_run_exports_once_and_its_death_costs_one_warning(tmp_path):
    """One real `mlflow server` process: a run logged live and read back with MlflowClient, the
    store's runs exported (twice: the second adds nothing), then the server killed mid-run."""
    from mlflow.tracking import MlflowClient
    server, mlflow_server, db = _start_server(tmp_path / "server")
    try:
        _logged_live_and_exported(tmp_path, mlflow_server, MlflowClient(tracking_uri=mlflow_server))
        _killed_mid_run(tmp_path, server, mlflow_server, db)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _logged_live_and_exported(tmp_path, mlflow_server, client):
    done = run(["train", *QUICK, "--epochs", "3", "--logger", "mlflow", "--group", "g1", "--run-id", "live"], tmp_path,
               MLFLOW_TRACKING_URI=mlflow_server)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
    experiment = client.get_experiment_by_name("g1")
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.status == "FINISHED" and found.data.tags["scaletrain.run_id"] == "live"
    assert found.data.tags["scaletrain.strategy"] == "single" and found.data.tags["scaletrain.precision"] == "fp32"
    assert found.data.params["model.name"] == "mlp" and found.data.params["batch_size"] == "64"
    epochs = json.loads(run_here(["runs", "show", "live", "--json"], tmp_path).stdout)["epochs"]
    assert _history(client, found.info.run_id, "val_accuracy") == [
        (e["optimizer_steps"], pytest.approx(e["val_accuracy"])) for e in epochs]
    assert [v for _, v in _history(client, found.info.run_id, "epoch")] == [1, 2, 3]
    artifacts = {a.path for a in client.list_artifacts(found.info.run_id)}
    assert artifacts == {"config.json", "summary.json"}

    # Export: the run logged live is already there; one trained without a logger is copied, once.
    other = run(["train", *QUICK, "--epochs", "2", "--group", "g1", "--run-id", "later"], tmp_path)
    assert other.returncode == 0, other.stderr
    first = run_here(["runs", "export", "--to", "mlflow", "--group", "g1", "--tracking-uri", mlflow_server], tmp_path)
    assert first.returncode == 0 and "exported 1 run(s)" in first.stdout and "1 already there" in first.stdout
    again = run_here(["runs", "export", "--to", "mlflow", "--group", "g1"], tmp_path, MLFLOW_TRACKING_URI=mlflow_server)
    assert again.returncode == 0 and "exported 0 run(s)" in again.stdout and "2 already there" in again.stdout
    runs = {r.data.tags["scaletrain.run_id"]: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"live", "later"} and runs["later"].info.status == "FINISHED"
    later = json.loads(run_here(["runs", "show", "later", "--json"], tmp_path).stdout)["epochs"]
    assert _history(client, runs["later"].info.run_id, "train_loss") == [
        (e["optimizer_steps"], pytest.approx(e["train_loss"])) for e in later]
    assert runs["later"].data.params["epochs"] == "2"
    no_uri = run_here(["runs", "export", "--to", "mlflow"], tmp_path, MLFLOW_TRACKING_URI="")
    assert no_uri.returncode == 2 and "needs --tracking-uri" in no_uri.stderr


def _killed_mid_run(tmp_path, server, uri, db):
    """The server is killed once the run's first metrics are in: one warning, nothing else lost."""
    args = ["train", *QUICK, "--model", "faulty_models:slow_mlp", "--model-option", "delay_s=0.03", "--epochs", "5",
            "--logger", "mlflow", "--checkpoint-every", "10", "--run-dir", "r"]
    job = start(args, tmp_path, tmp_path / "train.log", MLFLOW_TRACKING_URI=uri)
    try:
        def logged() -> bool:
            try:
                with sqlite3.connect(db) as conn:
                    return conn.execute("SELECT COUNT(*) FROM metrics").fetchone()[0] > 0
            except sqlite3.Error:
                return False
        wait_for(lambda: logged() or job.poll() is not None, 120, "the first epoch's metrics", poll=0.1)
        assert job.poll() is None, (tmp_path / "train.log").read_text()
        os.killpg(server.pid, signal.SIGKILL)      # the server is gone after the first epoch's metrics
        server.wait()
        assert job.wait(timeout=240) == 0, (tmp_path / "train.log").read_text()
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    log = (tmp_path / "train.log").read_text()
    warnings = [line for line in log.splitlines() if "warning: the mlflow logger failed" in line]
    assert len(warnings) == 1, log
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["epochs_run"] == 5 and (tmp_path / "r" / "model.pt").is_file()
    assert any(p.name.startswith("step-") for p in (tmp_path / "r" / "checkpoints").iterdir())
    # A server that is not there at all: the same one line, from the start.
    gone = run(["train", *QUICK, "--epochs", "1", "--logger", "mlflow"], tmp_path, MLFLOW_TRACKING_URI=uri)
    assert gone.returncode == 0 and gone.stderr.count("warning: the mlflow logger failed") == 1, gone.stderr


@pytest.mark.usefixtures("processes")
def test_every_tracker_at_once_offline_each_read_back_from_its_files(tmp_path, monkeypatch):
    """No tracking URI: MLflow's SQLite store in the run folder; no W&B key: W&B offline."""
    pytest.importorskip("wandb")
    pytest.importorskip("tensorboard")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    for name in ("WANDB_API_KEY", "WANDB_MODE", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    done = run(["train", *QUICK, "--epochs", "2", "--logger", "mlflow,wandb,tensorboard", "--run-dir", "r",
                "--run-id", "all3"], tmp_path, HOME=str(tmp_path))   # HOME: no netrc with a W&B key
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
    epochs = json.loads(run_here(["runs", "show", "all3", "--json"], tmp_path).stdout)["epochs"]
    expected = [(e["optimizer_steps"], pytest.approx(e["val_loss"])) for e in epochs]
    folder = tmp_path / "r"
    assert not (tmp_path / "mlruns").exists()
    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("scaletrain").experiment_id])
    assert _history(client, found.info.run_id, "val_loss") == expected
    assert (folder / "mlflow-artifacts").is_dir()
    events = EventAccumulator(str(folder / "tensorboard"))
    events.Reload()
    assert [(e.step, pytest.approx(e.value)) for e in events.Scalars("val_loss")] == expected
    (offline,) = (folder / "wandb").glob("offline-run-*")
    assert _wandb_history(offline, "val_loss") == expected
    config = _wandb_config(offline)
    assert config["model.name"] == "mlp" and config["batch_size"] == 64 and config["model.options"] == {"hidden": [64]}
    assert _wandb_summary(offline)["summary/epochs_run"] == 2
    assert {p.name for p in (offline / "files").iterdir()} >= {"config.json", "summary.json"}


def _wandb_records(path):
    """The records of a W&B run file (`run-ID.wandb`, what `wandb sync` uploads): LevelDB's log
    format after a 7-byte header (":W&B", magic, version), 32 KiB blocks of chunks, each with a
    7-byte header (crc32, length, type: 1 whole, 2 first, 3 middle, 4 last)."""
    import struct

    from wandb.proto import wandb_internal_pb2
    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a W&B run file"
    offset, block, pending = 7, 32768, b""
    while offset + 7 <= len(data):
        room = block - offset % block
        if room < 7:                 # a block's tail too short for a chunk header is padding
            offset += room
            continue
        _, length, kind = struct.unpack("<IHB", data[offset:offset + 7])
        chunk = data[offset + 7:offset + 7 + length]
        offset += 7 + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def _wandb_history(offline_dir, key: str) -> list[tuple[int, float]]:
    """(step, value) of `key` from the run's own record file."""
    out = []
    for record in _wandb_records(next(offline_dir.glob("run-*.wandb"))):
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            if key in items:
                out.append((int(items["_step"]), items[key]))
    return out


def _wandb_config(offline_dir) -> dict:
    config = {}
    for record in _wandb_records(next(offline_dir.glob("run-*.wandb"))):
        kind = record.WhichOneof("record_type")
        updates = record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
        config.update({item.key: json.loads(item.value_json) for item in updates})
    return config


def _wandb_summary(offline_dir) -> dict:
    summary = {}
    for record in _wandb_records(next(offline_dir.glob("run-*.wandb"))):
        if record.WhichOneof("record_type") == "summary":
            summary.update({item.key: json.loads(item.value_json) for item in record.summary.update})
    return summary


class _Recording:
    """A tracker whose calls can be made to fail or to hang, to check the contract every tracker
    is held to (tracking/loggers/base.py), without a training."""
    name = "recording"

    def __init__(self, fail_at: str | None = None, hang_until: threading.Event | None = None):
        self.calls, self.fail_at, self.hang_until = [], fail_at, hang_until

    def _call(self, what):
        if self.hang_until is not None:
            self.hang_until.wait(30)
        if what == self.fail_at:
            raise ConnectionError("server gone\nsecond line")
        self.calls.append(what)

    def start(self, info):
        self._call("start")

    def log_epoch(self, step, epoch, metrics):
        self._call(f"epoch {epoch} at {step}")

    def finish(self, status, summary, files):
        self._call(f"finish {status}")


class _Trainer:
    class strategy:
        name, world_size = "single", 1
    device = "cpu"
    global_step = 7


def test_trackers_run_off_the_training_thread_warn_once_and_are_waited_for_a_bounded_time(tmp_path, monkeypatch):
    from scaletrain.tracking.loggers import base
    info = base.RunInfo(run_id="r", name="n", run_dir=tmp_path, group=None, params={}, tags={})
    warnings: list[str] = []
    # The slow tracker hangs in every call until released: had any call of it run on this thread,
    # the calls below could not return before it is.
    released = threading.Event()
    failing, slow, fine = _Recording(fail_at="epoch 1 at 7"), _Recording(hang_until=released), _Recording()
    logging = base.ExternalLogging([failing, slow, fine], info, warn=warnings.append)
    logging.on_train_begin(_Trainer())
    for epoch in range(3):
        logging.on_epoch_end(_Trainer(), epoch, {"val_loss": 0.5, "epoch": epoch + 1, "optimizer_steps": 7})
    assert slow.calls == []                        # still hanging in its first call: it held nothing up
    monkeypatch.setattr(base, "FINISH_WAIT_S", 1.0)
    logging.finish("finished")
    assert fine.calls == ["start", "epoch 1 at 7", "epoch 2 at 7", "epoch 3 at 7", "finish finished"]
    assert failing.calls == ["start"]              # dropped after its first failure
    assert slow.calls == []                        # finish waited its bound, not for the hanging tracker
    released.set()
    assert warnings == ["the recording logger failed (server gone); the run goes on without it",
                        "the recording logger did not finish within 1 s; its record of this run may be incomplete "
                        "(the run's own files are complete)"]
