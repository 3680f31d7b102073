"""A run is one thing, its numbers are right, and nothing it wrote is lost: each test reproduces a
way scaletrain once broke that promise, through the real CLI, real files and real processes."""

import hashlib
import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from scaletrain.tracking import RunStore
from tests.processes import DIGITS_MLP, cli_env, run, run_here, start, torchrun, wait_for

EPOCHS2 = DIGITS_MLP + ["--epochs", "2", "--no-record"]


def _one_error_line(result, code=2):
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def _checkpoints(folder: Path) -> list[Path]:
    return sorted((folder / "checkpoints").glob("step-*"))


def _store(tmp_path) -> RunStore:
    return RunStore(tmp_path / "scaletrain-runs" / "runs.db", create=False)


# -- 1. one identity ------------------------------------------------------------------------------

@pytest.mark.usefixtures("processes")
def test_a_fresh_run_never_reuses_a_folder_that_holds_a_run(tmp_path):
    first = run(["train", *DIGITS_MLP, "--epochs", "1", "--run-dir", "a"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    first_id = (tmp_path / "a" / "run_id").read_text().strip()
    model_before = (tmp_path / "a" / "model.pt").read_bytes()
    again = run(["train", *DIGITS_MLP, "--epochs", "1", "--run-dir", "a"], cwd=tmp_path)
    line = _one_error_line(again)
    assert first_id in line and "--resume auto" in line and "--overwrite" in line
    assert (tmp_path / "a" / "model.pt").read_bytes() == model_before   # nothing touched
    fresh = run(["train", *DIGITS_MLP, "--epochs", "1", "--run-dir", "a", "--overwrite"], cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr
    second_id = (tmp_path / "a" / "run_id").read_text().strip()
    assert second_id != first_id
    with _store(tmp_path) as store:   # the old result stays in the store under its own id
        assert {r.id: r.status for r in store.runs()} == {first_id: "finished", second_id: "finished"}


@pytest.mark.usefixtures("processes")
def test_a_second_training_in_a_locked_folder_exits_at_once_naming_the_holder(tmp_path):
    slow = ["--model", "faulty_models:slow_mlp", "--model-option", "delay_s=0.05", "--data", "digits",
            "--no-progress", "--epochs", "30", "--no-record", "--target-accuracy", "0.999", "--run-dir", "busy"]
    holder = start(["train", *slow], tmp_path, tmp_path / "holder.log")
    try:
        # (a loaded 2-core runner has taken over a minute to start a run)
        wait_for(lambda: (tmp_path / "busy" / "run.json").exists() or holder.poll() is not None, 180,
                 "the holder to start")
        assert holder.poll() is None, (tmp_path / "holder.log").read_text()
        # It exits at once: waiting for the lock would outlast the guard (the holder trains 30 slow epochs).
        second = run(["train", *slow, "--resume", "auto"], cwd=tmp_path, timeout=120)
        line = _one_error_line(second)
        assert f"host {socket.gethostname()}, pid " in line and "in use by another training" in line
        assert int(line.split("pid ")[1].split(")")[0]) == holder.pid
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    # The kernel dropped the dead holder's lock: the run can be resumed (it had no checkpoint:
    # it starts over as the same run).
    after = run(["train", *slow[:-2], "--epochs", "1", "--model-option", "delay_s=0.0", "--run-dir", "busy",
                 "--overwrite"], cwd=tmp_path)
    assert after.returncode == 0, after.stderr


@pytest.mark.usefixtures("processes")
def test_torchrun_twice_without_rdzv_id_makes_two_runs(tmp_path):
    """torchrun's rendezvous id defaults to 'none': once, every such job shared one folder and id."""
    for _ in range(2):
        result = torchrun(1, ["-m", "scaletrain", "train", *DIGITS_MLP, "--epochs", "1"], tmp_path)
        assert result.returncode == 0, result.stderr
    folders = sorted(p for p in (tmp_path / "scaletrain-runs").iterdir() if p.is_dir())
    assert len(folders) == 2
    ids = [(f / "run_id").read_text().strip() for f in folders]
    assert ids[0] != ids[1] and all(f.name.endswith(i) for f, i in zip(folders, ids, strict=True))
    with _store(tmp_path) as store:
        assert sorted(r.id for r in store.runs()) == sorted(ids)


@pytest.mark.usefixtures("processes")
def test_resume_auto_without_run_dir_never_continues_a_different_configuration(tmp_path):
    base = DIGITS_MLP + ["--epochs", "1", "--checkpoint-every", "5", "--no-record"]
    assert run(["train", *base], cwd=tmp_path).returncode == 0
    (first,) = [p for p in (tmp_path / "scaletrain-runs").iterdir() if p.is_dir()]
    other = run(["train", *base, "--model-option", "hidden=[32]", "--resume", "auto"], cwd=tmp_path)
    assert other.returncode == 0, other.stderr
    assert "new run" in other.stdout and str(first) not in other.stdout
    same = run(["train", *base, "--epochs", "2", "--resume", "auto"], cwd=tmp_path)
    assert same.returncode == 0, same.stderr
    assert f"resuming run {(first / 'run_id').read_text().strip()}" in same.stdout


@pytest.mark.usefixtures("processes")
def test_another_runs_checkpoint_is_refused_without_an_owner_file(tmp_path):
    """A checkpoint folder holding another run's checkpoint, its owner.json gone (copied in, or
    deleted): the checkpoint's own record of its configuration says whose it is, and a resume of
    another configuration is refused in one line, --resume auto or a named checkpoint, before
    anything trains or is overwritten."""
    import shutil
    quick = [*DIGITS_MLP, "--epochs", "1", "--no-record", "--checkpoint-every", "20"]
    a = run(["train", *quick, "--run-dir", "a", "--checkpoint-dir", "ck", "--run-id", "run-a"], cwd=tmp_path)
    assert a.returncode == 0, a.stderr
    (tmp_path / "ck" / "owner.json").unlink()
    saved = sorted(p.name for p in (tmp_path / "ck").glob("step-*"))
    b = run(["train", *quick, "--lr", "0.001", "--run-dir", "b", "--checkpoint-dir", "ck", "--resume", "auto"],
            cwd=tmp_path)
    line = _one_error_line(b)
    assert "taken by run run-a with another configuration" in line, line
    assert sorted(p.name for p in (tmp_path / "ck").glob("step-*")) == saved and not (tmp_path / "b").exists()
    # Copied into a run folder of its own (the other run's checkpoints/), and named with --resume.
    c = run(["train", *quick, "--lr", "0.001", "--run-dir", "c"], cwd=tmp_path)
    assert c.returncode == 0, c.stderr
    shutil.copytree(tmp_path / "ck" / saved[-1], tmp_path / "c" / "checkpoints" / "step-000000099")
    again = run(["train", "--run-dir", "c", "--resume", "auto", "--epochs", "2", "--no-record"], cwd=tmp_path)
    assert "another configuration" in _one_error_line(again)
    named = run(["train", *quick, "--lr", "0.001", "--run-dir", "d", "--resume", str(tmp_path / "ck" / saved[-1])],
                cwd=tmp_path)
    assert "another configuration" in _one_error_line(named) and not (tmp_path / "d" / "model.pt").exists()
    own = run(["train", *quick, "--run-dir", "a", "--checkpoint-dir", "ck", "--resume", "auto", "--epochs", "2"],
              cwd=tmp_path)
    assert own.returncode == 0, own.stderr     # its own checkpoint still resumes


@pytest.mark.usefixtures("processes")
def test_a_run_writes_only_where_it_owns(tmp_path):
    """Another run's checkpoint folder (inside its run folder, or a shared folder it claimed) is
    refused before anything trains: saves never mix, keep-K never deletes the other run's, and
    its --resume auto never continues from foreign weights. A name never places a study elsewhere."""
    quick = [*DIGITS_MLP, "--epochs", "1", "--no-record", "--checkpoint-every", "20"]
    first = run(["train", *quick, "--run-dir", "shc"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    before = {p.name: p.stat().st_mtime_ns for p in _checkpoints(tmp_path / "shc")}
    into = run(["train", *quick, "--run-dir", "cd2", "--checkpoint-dir", "shc/checkpoints"], cwd=tmp_path)
    line = _one_error_line(into)
    assert "--checkpoint-dir shc/checkpoints is inside the folder of run" in line
    assert {p.name: p.stat().st_mtime_ns for p in _checkpoints(tmp_path / "shc")} == before
    assert not (tmp_path / "cd2").exists()
    # A shared folder outside every run: the first run to save there owns it.
    a = run(["train", *quick, "--run-dir", "a", "--checkpoint-dir", "ck"], cwd=tmp_path)
    assert a.returncode == 0, a.stderr
    saved = sorted(p.name for p in (tmp_path / "ck").glob("step-*"))
    b = run(["train", *quick, "--run-dir", "b", "--checkpoint-dir", "ck", "--resume", "auto"], cwd=tmp_path)
    assert "holds the checkpoints of run" in _one_error_line(b)
    assert sorted(p.name for p in (tmp_path / "ck").glob("step-*")) == saved and not (tmp_path / "b").exists()
    again = run(["train", *quick, "--run-dir", "a", "--checkpoint-dir", "ck", "--resume", "auto", "--epochs", "2"],
                cwd=tmp_path)
    assert again.returncode == 0, again.stderr   # its own folder: saves and resumes as before
    nested = run(["train", *quick, "--run-dir", "shc/inner"], cwd=tmp_path)
    assert "--run-dir shc/inner is inside the folder of run" in _one_error_line(nested)
    delivered = run(["train", *quick, "--run-dir", "cd3"], cwd=tmp_path, SM_MODEL_DIR="shc")
    assert "SM_MODEL_DIR shc is in the folder of run" in _one_error_line(delivered)
    summary = (tmp_path / "shc" / "summary.json").read_bytes()
    over = run_here(["runs", "report", "-o", "shc/summary.json"], tmp_path)
    assert "is a file of run" in _one_error_line(over) and (tmp_path / "shc" / "summary.json").read_bytes() == summary
    study = run(["autotune", "--study-name", "../../escaped", "--trials", "2"], cwd=tmp_path)
    assert "--study-name '../../escaped' is not a plain name" in _one_error_line(study)
    assert not (tmp_path.parent / "escaped").exists() and not (tmp_path / "scaletrain-runs").exists()


# -- 2. resume from the run's own config ----------------------------------------------------------

@pytest.mark.usefixtures("processes")
def test_resume_continues_with_the_saved_config_and_refuses_fixed_changes(tmp_path):
    made = run(["train", *DIGITS_MLP, "--epochs", "2", "--checkpoint-every", "5", "--run-dir", "a",
                "--target-accuracy", "0.999"], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    run_id = (tmp_path / "a" / "run_id").read_text().strip()
    config_before = (tmp_path / "a" / "config.json").read_text()
    changed = run(["train", "--run-dir", "a", "--resume", "auto", "--model-option", "hidden=[32]",
                   "--lr", "0.5"], cwd=tmp_path)
    line = _one_error_line(changed)
    assert "model.options" in line and "optim.lr" in line
    assert (tmp_path / "a" / "config.json").read_text() == config_before
    with _store(tmp_path) as store:
        record = store.get(run_id)
        assert record.status == "finished" and record.config["model"]["options"] == {"hidden": [64]}
    # The README's form: no flag repeated; only what may change mid-run is given.
    resumed = run(["train", "--run-dir", "a", "--resume", "auto", "--epochs", "4", "--no-progress"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["epochs_run"] == 4 and summary["model"] == "mlp" and summary["run_id"] == run_id
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert saved["data"]["name"] == "digits" and saved["optim"]["lr"] == 0.003 and saved["epochs"] == 4
    with _store(tmp_path) as store:
        assert [r.id for r in store.runs()] == [run_id]
        assert [e["epoch"] for e in store.epochs(run_id)] == [0, 1, 2, 3]


# -- 3. verified checkpoints ----------------------------------------------------------------------

def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def _zero(path: Path) -> None:
    path.write_bytes(bytes(path.stat().st_size))


DAMAGE = {
    "truncated shard": lambda c: _truncate(next(c.glob("*.distcp"))),
    "zeroed shard": lambda c: _zero(next(c.glob("*.distcp"))),
    "deleted .metadata": lambda c: (c / ".metadata").unlink(),
    "garbage marker": lambda c: (c / "COMMITTED").write_text("{not json"),
    "empty marker": lambda c: (c / "COMMITTED").write_text(""),
}


@pytest.fixture(scope="module")
def checkpointed_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("checkpointed")
    made = run(["train", *EPOCHS2, "--checkpoint-every", "5", "--target-accuracy", "0.999", "--run-dir", "a"],
               cwd=folder)
    assert made.returncode == 0, made.stderr
    return folder / "a"


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_checkpoint_is_skipped_for_the_next_older_one(checkpointed_run, tmp_path, damage):
    import shutil
    folder = tmp_path / "a"
    shutil.copytree(checkpointed_run, folder)
    older, newest = _checkpoints(folder)[-2:]
    DAMAGE[damage](newest)
    resumed = run(["train", "--run-dir", "a", "--resume", "auto", "--epochs", "3"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"skipping damaged checkpoint {Path('a') / 'checkpoints' / newest.name}" in resumed.stderr
    assert f"resumed from {Path('a') / 'checkpoints' / older.name}" in resumed.stdout


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("nproc", ["1", "2"])
def test_no_usable_checkpoint_is_one_line_and_exit_2(checkpointed_run, tmp_path, nproc):
    """Under --nproc 2 the launcher verifies the checkpoint before any worker starts."""
    import shutil
    folder = tmp_path / "a"
    shutil.copytree(checkpointed_run, folder)
    for checkpoint in _checkpoints(folder):
        _truncate(next(checkpoint.glob("*.distcp")))
    resumed = run(["train", "--run-dir", "a", "--resume", "auto", "--epochs", "3", "--nproc", nproc], cwd=tmp_path)
    assert resumed.returncode == 2
    errors = [line for line in resumed.stderr.splitlines() if line.startswith("scaletrain: error")]
    assert len(errors) == 1 and "no usable checkpoint" in errors[0] and "Traceback" not in resumed.stderr
    assert resumed.stderr.splitlines()[-1] == errors[0]
    assert "torch/distributed/run.py" not in resumed.stderr   # torchrun never started


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs: a real full disk (mounting needs root, as on this project's machines)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.decode().strip()}): the full-disk test needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.usefixtures("processes")
def test_a_full_disk_fails_the_run_in_one_line_and_the_last_checkpoint_resumes(tmp_path, small_disk):
    """Out of space mid-run: one line naming the path and the OS's reason, run.json says failed,
    no temporary file or partial checkpoint is left, the newest committed checkpoint verifies,
    and once space is freed --resume auto finishes the run from it."""
    from scaletrain.checkpoint.store import CheckpointStore
    # A 150 KiB model: its checkpoints hold the weights and AdamW's two moments, about 450 KiB.
    quick = [*DIGITS_MLP, "--model-option", "hidden=[512]", "--no-record", "--checkpoint-every", "10",
             "--run-dir", str(small_disk / "run")]
    first = run(["train", *quick, "--epochs", "1"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    folder = small_disk / "run"
    newest = _checkpoints(folder)[-1]
    stat = os.statvfs(small_disk)
    # Leaves 1,400 KiB: the space the run sets aside fits (model.pt and summary.json, about 480 KiB,
    # and one checkpoint of its whole state, 0.7 MiB), a checkpoint beside them does not.
    filler = small_disk / "filler"
    filler.write_bytes(bytes(max(0, stat.f_bavail * stat.f_frsize - 1400 * 1024)))
    full = run(["train", *quick, "--epochs", "3", "--resume", "auto"], cwd=tmp_path)
    line = _one_error_line(full, code=1)
    assert re.search(r"could not write \S+ \(No space left on device\)", line), line
    assert json.loads((folder / "run.json").read_text())["status"] == "failed"
    leftovers = [p.name for p in folder.rglob("*") if ".tmp" in p.name or ".space-probe" in p.name]
    # The step it failed at is kept beside them, in the space the run held for one (rescue.py).
    assert leftovers == [] and _checkpoints(folder)[-1] > newest and "kept a checkpoint at step" in line
    assert all(CheckpointStore.is_complete(p) for p in _checkpoints(folder))
    assert CheckpointStore.problem(newest) is None
    filler.unlink()                     # space freed: the run goes on from its newest checkpoint
    again = run(["train", *quick, "--epochs", "3", "--resume", "auto"], cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads((folder / "run.json").read_text())["status"] == "finished"


class _FillDisk:
    """Callback: fills the disk of `folder` at the `call`-th call of the hook it is given."""

    def __init__(self, folder: Path, hook: str, call: int = 1):
        self.folder, self.call, self.calls, self.leave = folder, call, 0, 0
        setattr(self, hook, self._fill)

    def _fill(self, *args) -> None:
        self.calls += 1
        if self.calls != self.call:
            return
        stat = os.statvfs(self.folder)
        free = stat.f_bavail * stat.f_frsize - self.leave
        # Unbuffered: a write the disk cannot take fails here, never again as a buffer flushed at
        # close (a background checkpoint taking space meanwhile once failed the test so).
        with (self.folder / "filler").open("wb", buffering=0) as fh:
            try:
                fh.write(bytes(max(free, 0)))
            except OSError:
                pass     # full: that is the point


def _disk_run(small_disk, hook: str | None, epochs: int = 2, call: int = 1, **overrides):
    """A real run (this process, real files) on the small tmpfs, the disk filled at `hook`."""
    from scaletrain.errors import WriteFailed
    from scaletrain.runner import run_training
    from tests.conftest import small_config
    cfg = small_config(small_disk, epochs=epochs, **overrides)
    cfg.run_dir = str(small_disk / "run")
    cfg.tracking.record = False
    try:
        run_training(cfg, callbacks=[_FillDisk(small_disk, hook, call)] if hook else [])
        return None
    except WriteFailed as exc:
        return str(exc)


def _status(folder: Path) -> str:
    return json.loads((folder / "run.json").read_text())["status"]


@pytest.mark.usefixtures("processes")
def test_a_disk_full_when_the_weights_are_written_still_gets_them(small_disk):
    """The disk fills after the last epoch (at model.pt and summary.json): both were set aside
    before training, so both are written, whole, and the run finishes."""
    import torch
    assert _disk_run(small_disk, "on_train_end") is None
    folder = small_disk / "run"
    assert _status(folder) == "finished"
    weights = torch.load(folder / "model.pt", weights_only=True)
    assert set(weights) and json.loads((folder / "summary.json").read_text())["epochs_run"] == 2
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".") and p.name != ".lock"]


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("moment, hook, call, every", [
    ("mid-epoch", "on_train_batch_end", 3, 0),       # the next write: the epoch's metrics line
    ("a metrics line", "on_epoch_begin", 2, 0),
    ("owner.json", "on_train_begin", 1, 30),          # the first checkpoint claims the folder first
    ("a checkpoint", "on_train_batch_end", 31, 30),   # the second checkpoint
])
def test_a_disk_that_fills_mid_run_keeps_the_epochs_trained(small_disk, moment, hook, call, every):
    """The first failed write once ended the run and gave back model.pt's space: no weights, no
    checkpoint, and --resume auto started from scratch. Now the run saves a checkpoint of where it
    is into space it held for one, writes its weights into model.pt's, says both in its one line
    and is recorded failed; once space is freed, --resume auto goes on from that step."""
    import torch

    from scaletrain.runner import run_training
    from tests.conftest import small_config
    error = _disk_run(small_disk, hook, epochs=12, call=call, checkpoint=_every(every))
    folder = small_disk / "run"
    assert error is not None and "No space left on device" in error, (moment, error)
    assert _status(folder) == "failed"
    assert "kept a checkpoint at step" in error and f"the weights trained so far in {folder / 'model.pt'}" in error
    kept = int(error.split("kept a checkpoint at step ")[1].split()[0])
    assert kept > 0 and set(torch.load(folder / "model.pt", weights_only=True))
    (small_disk / "filler").unlink()
    cfg = small_config(small_disk, epochs=12, checkpoint=_every(every, resume="auto"))
    cfg.run_dir, cfg.tracking.record = str(folder), False
    _, trainer = run_training(cfg)
    assert trainer.resumed_at_step == kept and trainer.resumed_from is not None, moment
    assert _status(folder) == "finished" and len(trainer.history) == 12


def _every(steps: int, resume: str | None = None):
    from scaletrain.config import CheckpointConfig
    return CheckpointConfig(every=steps, resume=resume)


@pytest.mark.usefixtures("processes")
def test_a_disk_full_at_the_summary_json_still_gets_it(small_disk):
    """--summary-json's space is set aside before training, as model.pt's is: it once failed the
    run only after training."""
    out = small_disk / "out" / "summary.json"
    assert _disk_run(small_disk, "on_train_end", summary_json=str(out)) is None
    assert _status(small_disk / "run") == "finished" and json.loads(out.read_text())["epochs_run"] == 2


@pytest.mark.usefixtures("processes")
def test_a_disk_with_no_room_for_the_weights_refuses_the_run_before_it_trains(small_disk):
    filler = small_disk / "filler"
    stat = os.statvfs(small_disk)
    filler.write_bytes(bytes(stat.f_bavail * stat.f_frsize - 24 * 1024))
    error = _disk_run(small_disk, "on_train_end")
    assert error is not None and "set aside before training" in error and "No space left on device" in error
    assert "run again" in error and not (small_disk / "run").exists()     # nothing trained: no folder


@pytest.mark.usefixtures("processes")
def test_run_json_status_is_written_in_place_when_the_disk_has_no_room(tmp_path, small_disk):
    from scaletrain.lifecycle.folder import RunFolder
    folder = RunFolder(small_disk / "run")
    folder.path.mkdir()
    folder.start("r1", {"a": 1}, {})
    stat = os.statvfs(small_disk)
    (small_disk / "filler").write_bytes(bytes(stat.f_bavail * stat.f_frsize))
    folder.set_status("failed")
    assert folder.status == "failed" and folder.run_id == "r1"


def _processes_of(marker: str) -> list[int]:
    """Every process whose command line holds `marker` (a run's folder): the CLI, the launcher, its
    ranks and their loader workers (forked: the same command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _stop_and_wait(tmp_path, run_dir: Path, ranks: int, stop) -> None:
    """Starts a training of `ranks` processes on a data set whose loader workers hang, stops it
    with `stop(process)` once its first step has ended and every loader worker hangs, and waits
    for its last process to end (those left after 60 s are killed, and the test fails)."""
    from tests.processes import start, wait_for
    log, marks = tmp_path / f"{run_dir.name}.log", tmp_path / f"{run_dir.name}.marks"
    marks.mkdir()
    argv = ["train", "--model", "faulty_models:stepping_mlp", "--model-option", f"marks={marks}",
            "--data", "hung_stream:splits", "--data-option", "n=2048", "--data-option", "reads=80",
            "--num-workers", "2", "--epochs", "2", "--batch-size", "16", "--no-progress", "--no-record",
            "--run-dir", str(run_dir), *(["--nproc", str(ranks)] if ranks > 1 else [])]
    proc = start(argv, tmp_path, log, HUNG_STREAM_MARKS=str(marks))
    try:
        # Trained and stuck: each rank's first step ended (a run stopped before it leaves no folder)
        # and its two loader workers, 5 batches each given, hung in a read (the plugins mark both).
        def stuck():
            names = [p.name for p in marks.iterdir()]
            return sum(n.startswith("stepped-") for n in names) == ranks and \
                sum(n.startswith("hung-") for n in names) == 2 * ranks
        wait_for(lambda: stuck() or proc.poll() is not None, 90, "a step taken and every loader worker hung")
        assert proc.poll() is None, log.read_text()[-2000:]
        stop(proc)
        # Gone, not left behind: how soon is benchmarks/stop_latency.py's figure (BENCHMARKS.md); the
        # DataLoader's own shutdown would join each hung worker for 5 s, and a leak never ends.
        wait_for(lambda: not _processes_of(str(run_dir)), 60, "every process of the run to end", poll=0.05)
    finally:
        for pid in _processes_of(str(run_dir)):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()


@pytest.mark.usefixtures("processes")
def test_sigterm_ends_a_run_whose_loader_workers_hang_every_time(tmp_path):
    """SIGTERM to a training whose loader workers are stuck in a user's read: every process gone
    (how soon: benchmarks/stop_latency.py) and the run recorded interrupted, five times running
    (issue 66 S1: 1 try in 5 took over 20 s and left "running"; the other 4, 11-12 s: the
    DataLoader joined each hung worker 5 s)."""
    for attempt in range(5):
        run_dir = tmp_path / f"r{attempt}"
        _stop_and_wait(tmp_path, run_dir, 1, lambda proc: proc.send_signal(signal.SIGTERM))
        assert _status(run_dir) == "interrupted", attempt


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("target", ["the launcher", "its process group", "one rank", "the launcher, killed"])
def test_every_process_of_a_job_ends_with_it(tmp_path, target):
    """--nproc 2, loader workers hung: SIGTERM to the launcher, to its process group or to one rank,
    or SIGKILL to the launcher (its agent can stop nobody then: each worker is sent SIGTERM by the
    kernel as its parent dies): every process gone (how soon: benchmarks/stop_latency.py), the run
    recorded interrupted, twice running (issue 66 S2: workers of a killed launcher trained on to the last step)."""
    def stop(proc):
        if target == "the launcher":
            proc.send_signal(signal.SIGTERM)
        elif target == "its process group":
            os.killpg(proc.pid, signal.SIGTERM)
        elif target == "one rank":
            from tests.processes import children
            os.kill(children(proc.pid)[0], signal.SIGTERM)      # the launcher's children are its ranks
        else:
            proc.send_signal(signal.SIGKILL)
    for attempt in range(2):
        run_dir = tmp_path / f"r{attempt}"
        _stop_and_wait(tmp_path, run_dir, 2, stop)
        assert _status(run_dir) == "interrupted", attempt


@pytest.mark.usefixtures("processes")
def test_a_run_that_fails_before_its_first_step_leaves_no_folder(tmp_path):
    """The training began (callbacks told, data read) and its first step raised: a true record
    in the store, no run folder from a run that never trained. One step later the folder stays."""
    for at_call, kept in ((2, False), (3, True)):
        folder = tmp_path / f"at{at_call}"
        result = run(["train", "--model", "faulty_models:raising_mlp", "--model-option", "rank=0",
                      "--model-option", f"at_call={at_call}", "--data", "digits", "--epochs", "1", "--no-progress",
                      "--run-dir", str(folder)], cwd=tmp_path)
        assert result.returncode == 1 and "injected failure" in result.stderr, result.stderr
        assert folder.exists() == kept
        if kept:
            assert json.loads((folder / "run.json").read_text())["status"] == "failed"


# -- 4. files from elsewhere never run code -------------------------------------------------------

class _Payload:
    """Unpickling this runs a shell command that creates `target`."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


@pytest.mark.usefixtures("processes")
def test_a_crafted_cifar_batch_is_refused_without_running_it(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    marker = tmp_path / "pwned-cifar"
    with (folder / "data_batch_1").open("wb") as fh:
        pickle.dump({b"data": _Payload(marker), b"labels": [0]}, fh)
    result = run(["train", "--data", "cifar10", "--data-dir", str(folder), "--model", "mlp", "--no-record"],
                 cwd=tmp_path)
    line = _one_error_line(result)
    assert "data_batch_1" in line and "posix.system" in line and "refused" in line
    assert not marker.exists()


def test_a_real_cifar_style_batch_still_loads(tmp_path):
    from scaletrain.data.cifar import _read_batch
    path = tmp_path / "data_batch_1"
    data = np.random.default_rng(0).integers(0, 255, (4, 3072), dtype=np.uint8)
    with path.open("wb") as fh:
        pickle.dump({b"batch_label": b"training batch 1 of 5", b"labels": [1, 2, 3, 4], b"data": data,
                     b"filenames": [b"a.png", b"b.png", b"c.png", b"d.png"]}, fh)
    x, y = _read_batch(path)
    assert x.shape == (4, 3, 32, 32) and y.tolist() == [1, 2, 3, 4]


@pytest.mark.usefixtures("processes")
def test_crafted_checkpoint_metadata_is_refused_even_with_a_matching_manifest(checkpointed_run, tmp_path):
    """An attacker who rewrites both `.metadata` and the manifest still cannot run code: the
    metadata is read by an unpickler that admits only DCP's own classes."""
    import shutil
    folder = tmp_path / "a"
    shutil.copytree(checkpointed_run, folder)
    marker = tmp_path / "pwned-dcp"
    for checkpoint in _checkpoints(folder):
        (checkpoint / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
        manifest = json.loads((checkpoint / "COMMITTED").read_text())
        data = (checkpoint / ".metadata").read_bytes()
        manifest["files"][".metadata"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (checkpoint / "COMMITTED").write_text(json.dumps(manifest))
    result = run(["train", "--run-dir", "a", "--resume", "auto", "--epochs", "3"], cwd=tmp_path)
    line = _one_error_line(result)
    assert "posix.system" in line and "refused" in line
    assert not marker.exists()


def _rewrite_with_manifest(checkpoint: Path, name: str, data: bytes) -> None:
    """Replaces a checkpoint file and its manifest entry, as an attacker who rewrites both would."""
    (checkpoint / name).write_bytes(data)
    manifest = json.loads((checkpoint / "COMMITTED").read_text())
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "COMMITTED").write_text(json.dumps(manifest))


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("damage", ["a pickle", "cut short", "zeros"])
def test_a_crafted_tensor_file_is_named_in_one_line_by_resume_and_evaluate(checkpointed_run, tmp_path, damage):
    """A `.distcp` file replaced (a pickle, its first half, zeros of its size) with a manifest that
    matches it: train --resume auto and evaluate say which file is wrong, in one line, exit 2;
    nothing in it runs (issue 66 C1: an EOFError traceback)."""
    import shutil
    folder = tmp_path / "a"
    shutil.copytree(checkpointed_run, folder)
    marker = tmp_path / "pwned-distcp"
    for checkpoint in _checkpoints(folder):
        tensors = next(checkpoint.glob("*.distcp"))
        original = tensors.read_bytes()
        data = {"a pickle": pickle.dumps(_Payload(marker)), "cut short": original[:len(original) // 2],
                "zeros": bytes(len(original))}[damage]
        _rewrite_with_manifest(checkpoint, tensors.name, data)
    for argv in (["train", "--run-dir", "a", "--resume", "auto", "--epochs", "3"],
                 ["evaluate", "--watch", "a", "--once", "--store", "runs.db"]):
        result = run(argv, cwd=tmp_path)
        line = _one_error_line(result)
        assert ".distcp" in line and "damaged" in line, line
        assert not marker.exists()


@pytest.mark.usefixtures("processes")
def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path):
    (tmp_path / "latin1.toml").write_bytes('epochs = 1\n# réglages\n'.encode("latin-1"))
    result = run_here(["train", "--config", "latin1.toml"], tmp_path)
    assert "config file latin1.toml is not UTF-8 text" in _one_error_line(result)


@pytest.mark.usefixtures("processes")
def test_a_model_too_big_to_build_is_one_line_before_allocating(tmp_path):
    """Counted on the meta device against the host's available memory, in the launcher (--nproc)
    and in the training process alike: no allocator traceback, no run folder."""
    huge = ["train", "--model", "mlp", "--model-option", "hidden=[400000,400000]", "--data", "digits", "--epochs", "1"]
    for extra in ([], ["--nproc", "2"]):
        result = run([*huge, *extra, "--run-dir", "big"], cwd=tmp_path, timeout=120)
        line = _one_error_line(result)
        assert "hidden=[400000, 400000] holds 596" in line and "available to build it in" in line, line
        assert not (tmp_path / "big").exists()


# -- 5. outputs checked before training; the model written first ----------------------------------

@pytest.mark.usefixtures("processes")
def test_unwritable_outputs_fail_before_any_step_and_leave_no_folder(tmp_path):
    (tmp_path / "file").write_text("")
    cases = [(["--summary-json", "file/summary.json"], "--summary-json"),
             (["--run-dir", "file/run"], "--run-dir"),
             (["--store", "file/runs.db"], "run store"),
             (["--run-dir", "/proc/scaletrain-run"], "--run-dir")]
    for flags, what in cases:
        result = run(["train", *DIGITS_MLP, "--epochs", "1", *flags], cwd=tmp_path)
        line = _one_error_line(result)
        assert what in line, line
        assert "Epoch" not in result.stdout and not (tmp_path / "scaletrain-runs").exists()
    assert run(["train", *DIGITS_MLP, "--epochs", "1"], cwd=tmp_path).returncode == 0
    report = run(["runs", "report", "-o", "file/report.html"], cwd=tmp_path)
    line = _one_error_line(report)
    assert "--output" in line and "file is a file" in line


@pytest.mark.usefixtures("processes")
def test_model_is_written_before_the_summaries(tmp_path):
    result = run(["train", *EPOCHS2, "--run-dir", "a", "--summary-json", "out/s.json"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    times = {name: (tmp_path / name).stat().st_mtime_ns for name in ("a/model.pt", "a/summary.json", "out/s.json")}
    assert times["a/model.pt"] <= times["a/summary.json"] <= times["out/s.json"]


# -- 6. honest clocks -----------------------------------------------------------------------------

def test_the_epoch_clock_counts_every_step_and_no_checkpoint_save(tmp_path, monkeypatch):
    """The epoch clock once restarted after each save, so images/sec counted only the steps after
    the last one (255k vs 88k on digits). On a stubbed clock every training step takes 1 s and every
    (synchronous) save 10^6 s: the epochs' training time holds every step's second and none of the
    saves'. Real time still passes beneath it, so the figures are bounds, each fixed by the stub
    alone (how fast this machine trains cannot move them)."""
    from conftest import small_config
    from scaletrain.checkpoint.checkpointer import Checkpointer
    from scaletrain.checkpoint.store import CheckpointStore
    from scaletrain.data import load_dataset
    from scaletrain.models import build_model
    from scaletrain.training import Trainer
    from scaletrain.training.step import TrainStep

    real, offset, steps = time.perf_counter, [0.0], [0]
    monkeypatch.setattr(time, "perf_counter", lambda: real() + offset[0])
    step, save = TrainStep.__call__, Checkpointer.save

    def timed_step(self, x, y):
        offset[0] += 1.0
        steps[0] += 1
        return step(self, x, y)

    def timed_save(self, trainer, *args, **kwargs):
        offset[0] += 1e6
        return save(self, trainer, *args, **kwargs)
    monkeypatch.setattr(TrainStep, "__call__", timed_step)
    monkeypatch.setattr(Checkpointer, "save", timed_save)
    cfg = small_config(tmp_path, epochs=2)
    dataset = load_dataset(cfg.data)
    synchronous = Checkpointer(CheckpointStore(tmp_path / "ck"), every=2, background=False)
    trainer = Trainer(build_model("mlp", dataset.input_shape, dataset.num_classes, hidden=[64]), cfg,
                      checkpointer=synchronous)
    try:
        history = trainer.fit(dataset)
    finally:
        trainer.close()
    train_s = sum(h["epoch_train_time_s"] for h in history)
    saved_s = history[-1]["checkpoint_time_s"]
    trained = history[-1]["optimizer_steps"]
    assert trained == 40 and steps[0] >= trained              # (digits: 20 steps an epoch of batch 64)
    assert saved_s >= 1e6 * (trained // 2)                       # every save, counted beside training ...
    assert trained <= train_s < saved_s / 1e4                    # ... and none inside it; every step inside


# -- 7. a diverged training has its own exit code -------------------------------------------------

@pytest.mark.usefixtures("processes")
def test_a_diverged_training_is_not_bad_input(tmp_path):
    result = run(["train", *DIGITS_MLP, "--epochs", "2", "--lr", "1e12", "--optimizer", "sgd", "--no-record",
                  "--lr-schedule", "constant"], cwd=tmp_path)
    line = _one_error_line(result, code=4)
    assert "diverged" in line and "inf/NaN" in line


# -- 8. run store output --------------------------------------------------------------------------

@pytest.mark.usefixtures("processes")
def test_user_text_is_never_markup_and_every_accepted_id_shows(tmp_path):
    for run_id, group in (("a.b-1", "[/]"), ("Z9", "[bold]x")):
        result = run(["train", *DIGITS_MLP, "--epochs", "1", "--run-id", run_id, "--group", group], cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        shown = run_here(["runs", "show", run_id], cwd=tmp_path)
        assert shown.returncode == 0 and f"group {group}" in shown.stdout, shown.stderr
    listing = run_here(["runs", "list"], cwd=tmp_path)
    assert listing.returncode == 0 and "[/]" in listing.stdout and "[bold]x" in listing.stdout, listing.stderr
    assert run_here(["runs", "compare", "a.b-1", "Z9"], cwd=tmp_path).returncode == 0
    piped = subprocess.run(f"{sys.executable} -m scaletrain runs show a.b-1 --json | head -1", shell=True,
                           cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert piped.stdout == "{\n" and piped.stderr == ""


# -- 9. the batch finder on CPU -------------------------------------------------------------------

@pytest.mark.usefixtures("processes")
def test_batch_finder_counts_the_batch_and_stays_inside_the_training_set(tmp_path):
    # (Its guard: it once measured every batch size up to the whole set, minutes; it now takes seconds.)
    result = run(["find-batch-size", "--model", "mlp", "--data", "synthetic", "--shape", "3,64,64",
                  "--num-samples", "8000", "--memory-limit", "100MB", "--no-progress", "--json"], cwd=tmp_path,
                 timeout=120)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    input_bytes = 3 * 64 * 64 * 4
    assert found["max_batch_size"] * input_bytes < 100e6   # the inputs alone fit the budget
    assert found["limited_by"] is None
    assert result.stderr.count("find-batch-size: batch ") == len(found["trials"])   # each trial shown
    # Doubling to 1024 takes 11 trials; the measured peaks' chord finds the answer in 2 more
    # (bisection between 512 and 1024 took 9).
    assert len(found["trials"]) <= 14, [t["batch_size"] for t in found["trials"]]
    small = run(["find-batch-size", "--model", "mlp", "--data", "digits", "--memory-limit", "4GB", "--json"],
                cwd=tmp_path)
    found = json.loads(small.stdout)
    assert found["max_batch_size"] == 1294 and found["limited_by"] == "the training set's 1294 samples"


# -- 10. the default recipe is the default --------------------------------------------------------

@pytest.mark.usefixtures("processes")
def test_a_flag_changes_only_what_it_names(tmp_path):
    from scaletrain.cli.main import build_parser
    from scaletrain.cli.train import config_from_args, load_recipe
    bare = config_from_args(build_parser().parse_args(["train"]))
    for flags, key, value in ((["--epochs", "3"], "epochs", 3), (["--no-record"], "tracking.record", False),
                              (["--nproc", "2"], "distributed.nproc", 2)):
        cfg = config_from_args(build_parser().parse_args(["train", *flags]))
        from scaletrain.options import get_path, set_path
        set_path(bare_copy := config_from_args(build_parser().parse_args(["train"])), key, value)
        assert cfg == bare_copy, flags
        assert get_path(cfg, key) == value
    recipe = load_recipe("mnist1d-cnn")
    assert (bare.optim.lr, bare.optim.lr_schedule, bare.target, bare.epochs) == \
        (recipe["optim"]["lr"], recipe["optim"]["lr_schedule"], recipe["target"], recipe["epochs"])
    help_text = run(["train", "--help"], cwd=tmp_path).stdout
    assert "default recipe" in help_text and "mnist1d-cnn" in help_text


# -- 11. reports of resumed runs ------------------------------------------------------------------

@pytest.mark.usefixtures("processes")
def test_a_resumed_run_continues_its_wall_time(tmp_path):
    made = run(["train", *DIGITS_MLP, "--epochs", "2", "--checkpoint-every", "11", "--run-dir", "a",
                "--target-accuracy", "0.999", "--sample-interval-s", "0.05"], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    run_id = (tmp_path / "a" / "run_id").read_text().strip()
    with _store(tmp_path) as store:
        before = store.epochs(run_id)
    resumed = run(["train", "--run-dir", "a", "--resume", "auto", "--epochs", "4"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    with _store(tmp_path) as store:
        after = store.epochs(run_id)
        samples = store.samples(run_id)
    assert [e["epoch"] for e in after] == [0, 1, 2, 3]
    assert after[0] == before[0]
    # Epoch 2 ended after the newest checkpoint was taken (its last step), so the resumed run
    # finishes it again: same samples and a throughput over the whole epoch's training time.
    assert after[1]["samples"] == before[1]["samples"] and after[1]["images_per_sec"] > 0
    elapsed = [e["elapsed_s"] for e in after]
    assert elapsed == sorted(elapsed) and elapsed[2] > elapsed[1]
    times = [s.elapsed_s for s in samples]
    assert times == sorted(times)


@pytest.mark.usefixtures("processes")
def test_experiment_outputs_are_checked_first_and_never_merged(tmp_path):
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "points.csv").write_text("batch_size\n16\n")
    (tmp_path / "file").write_text("")
    (tmp_path / "space.toml").write_text('[lr]\ntype = "float"\nlow = 0.001\nhigh = 0.01\n')
    cases = [(["sweep", "batch-size", "16", *DIGITS_MLP, "--out", "done"], "--out done already holds a sweep's results"),
             (["sweep", "batch-size", "16", *DIGITS_MLP, "--out", "file/sweep"], "file is a file"),
             (["multi", "a.toml", "--out", "done"], "--out done already holds runs"),
             (["tune", "--space", "space.toml", *DIGITS_MLP, "--out", "file"], "--out file is a file")]
    for argv, message in cases:
        line = _one_error_line(run(argv, cwd=tmp_path))
        assert message in line, line
    assert (tmp_path / "done" / "points.csv").read_text() == "batch_size\n16\n"


# -- 7. a run's record is what ran (issue 26, item 4) ---------------------------------------------

@pytest.mark.usefixtures("processes")
def test_a_hand_edited_config_is_refused_on_resume(tmp_path):
    made = run(["train", *DIGITS_MLP, "--epochs", "1", "--checkpoint-every", "5", "--run-dir", "a"], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    saved = tmp_path / "a" / "config.json"
    digest = json.loads((tmp_path / "a" / "run.json").read_text())["config_sha256"]
    run_id = (tmp_path / "a" / "run_id").read_text().strip()
    with _store(tmp_path) as store:
        assert store.get(run_id).environment["config_sha256"] == digest   # the store names the same config
    config = json.loads(saved.read_text())
    config["optim"]["lr"] = 0.5
    saved.write_text(json.dumps(config, indent=2))
    resumed = run(["train", "--run-dir", "a", "--resume", "auto", "--epochs", "2"], cwd=tmp_path)
    line = _one_error_line(resumed)
    assert f"{Path('a') / 'config.json'} was changed after run {run_id} started" in line
    # Undoing the edit (any layout of the same values) continues the run.
    config["optim"]["lr"] = 0.003
    saved.write_text(json.dumps(config))
    resumed = run(["train", "--run-dir", "a", "--resume", "auto", "--epochs", "2"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr


def _signal_once(proc, sig, ready, what: str) -> subprocess.CompletedProcess:
    try:
        from tests.processes import wait_for
        wait_for(ready, 120, what, poll=0.05)
        os.kill(proc.pid, sig)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            from tests.processes import kill_group
            kill_group(proc)
    return proc


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("sig, code, line", [(signal.SIGTERM, 143, "scaletrain: terminated"),
                                             (signal.SIGINT, 130, "scaletrain: interrupted")])
def test_a_signal_mid_training_ends_the_run_interrupted_in_one_line(tmp_path, sig, code, line):
    log = tmp_path / "log"
    proc = start(["train", *DIGITS_MLP, "--epochs", "200", "--run-dir", "a"], tmp_path, log)
    metrics = tmp_path / "a" / "metrics.jsonl"
    _signal_once(proc, sig, lambda: metrics.is_file() and metrics.read_text().strip(), "the first epoch")
    out = log.read_text()
    assert proc.returncode == code, out[-2000:]
    assert out.strip().splitlines()[-1] == line and "Traceback" not in out, out[-2000:]
    assert json.loads((tmp_path / "a" / "run.json").read_text())["status"] == "interrupted"
    run_id = (tmp_path / "a" / "run_id").read_text().strip()
    with _store(tmp_path) as store:
        assert store.get(run_id).status == "interrupted"
    assert not (tmp_path / "a" / ".lock").exists() or run(["train", *DIGITS_MLP, "--epochs", "1", "--run-dir", "a",
                                                          "--overwrite"], cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("word", ["interrupted", "failed"])
def test_the_launchers_word_on_a_stopped_job_never_overwrites_a_finished_run(tmp_path, word):
    """A signal (or a worker's failure) that reaches the launcher after the chief recorded the run
    as finished (a Ctrl-C in the last moments of the job, seen in CI) leaves the finished result
    as it is, in the folder and the store; a run still "running" takes the launcher's word."""
    from scaletrain.config import TrainConfig
    from scaletrain.lifecycle.folder import RunFolder
    from scaletrain.lifecycle.plan import RunPlan, record_job_end
    from scaletrain.options import to_mapping
    from scaletrain.tracking.store import RunStore
    cfg = TrainConfig()
    cfg.tracking.store = str(tmp_path / "runs.db")
    for run_id, before, after in [("done", "finished", "finished"), ("live", "running", word)]:
        folder = RunFolder(tmp_path / run_id)
        folder.path.mkdir()
        folder.start(run_id, to_mapping(cfg), {"host": "h"})
        with RunStore(cfg.tracking.store) as store:
            store.start_run(run_id)
            if before == "finished":
                folder.set_status("finished")
                store.finish_run(run_id, "finished", {"epochs": 1})
        record_job_end(RunPlan(folder, "new", run_id), cfg, word, "a worker failed" if word == "failed" else None)
        assert folder.status == after
        with RunStore(cfg.tracking.store) as store:
            assert store.get(run_id).status == after


def test_an_interrupt_while_the_command_measures_the_machines_load_is_one_line(monkeypatch, capsys):
    """A launcher stopping its workers the instant they start lands in the first thing main() does,
    sampling the machine's load (psutil's import): the command's own handler ends it in one line
    (CI once printed two workers' tracebacks from there)."""
    from scaletrain.cli import main as cli
    from scaletrain.training import threads

    def interrupted():
        raise KeyboardInterrupt
    monkeypatch.setattr(threads, "mark_start", interrupted)
    assert cli.main(["runs", "list"]) == 130
    assert capsys.readouterr().err.strip() == "scaletrain: interrupted"


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130)])   # SIGTERM takes the same path (test above, and the launcher's)
def test_a_signal_while_parameter_servers_start_is_one_line_no_traceback(tmp_path, sig, code):
    """The launcher (torchrun's agent) takes the signal, stops workers and servers, and the job
    ends in one line; the run folder is either gone (no step ran) or says interrupted."""
    from tests.processes import descendants
    log = tmp_path / "log"
    # Far more epochs than the signal can wait for: 50 of them train in under a second once the
    # group has met, and a signal that a loaded machine delivers after the last one finds the run
    # "finished" (as it should stay), which is not the case this test is about.
    proc = start(["train", *DIGITS_MLP, "--epochs", "100000", "--nproc", "3", "--strategy", "ps", "--num-ps", "1",
                  "--batch-size", "126", "--run-dir", "a"], tmp_path, log)

    def starting():
        # Past the interpreter's own start-up (a signal inside its first import of `site` is
        # Python's to report): the processes import torch and meet over gloo.
        if len(descendants(proc.pid)) < 3:
            return False
        time.sleep(0.6)
        return True
    _signal_once(proc, sig, starting, "the workers and the server")
    out = log.read_text()
    assert proc.returncode == code, out[-3000:]
    assert "Traceback" not in out and "death signal" not in out, out[-3000:]   # torch's agent's own line too
    assert out.strip().splitlines()[-1] == ("scaletrain: interrupted" if sig == signal.SIGINT
                                            else "scaletrain: terminated"), out[-3000:]
    # One error line. (A signal that lands once training has begun also finds the run's own
    # description, "scaletrain: mlp (0.00M params) on digits ...", earlier in the log.)
    described = re.compile(r"^scaletrain: \S+ \([\d.]+M params\) on ")
    assert [line for line in out.splitlines() if line.startswith("scaletrain:") and not described.match(line)] \
        == [out.strip().splitlines()[-1]]
    folder = tmp_path / "a"
    assert not folder.exists() or json.loads((folder / "run.json").read_text())["status"] == "interrupted"


def test_an_output_path_check_makes_what_it_tries_and_leaves_nothing_behind(tmp_path):
    """The check makes the first missing folder as the run would (so the OS's own reason is the one
    reported), then removes it: a checked path that the command then refuses for another reason
    leaves no empty folder."""
    from scaletrain.lifecycle.paths import check_writable_dir
    check_writable_dir(tmp_path / "a" / "b", "--out")
    assert list(tmp_path.iterdir()) == []


def test_a_stop_during_a_held_import_is_raised_once_the_module_has_loaded(tmp_path, monkeypatch):
    """A stop signal whose handler would raise inside torch's C++ initialisation aborts the process
    (pybind11 cannot pass the exception on: SIGABRT), so torch's first import is held whole: a
    signal arriving while a held module loads is raised after its body has run to its end; an
    unheld module is cut short where the signal lands."""
    import signal
    import sys

    from scaletrain.lifecycle import stops
    done = tmp_path / "done"
    (tmp_path / "held_for_test.py").write_text(
        f"import os, signal, pathlib\nos.kill(os.getpid(), signal.SIGINT)\npathlib.Path({str(done)!r}).touch()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    stops.hold_stops_while_loading()
    for held in (True, False):
        monkeypatch.setattr(stops, "HELD_IMPORTS", {"held_for_test"} if held else set())
        previous = signal.signal(signal.SIGINT, stops.on_stop_signal)
        try:
            with pytest.raises(KeyboardInterrupt):
                import held_for_test  # noqa: F401
        finally:
            signal.signal(signal.SIGINT, previous)
            sys.modules.pop("held_for_test", None)
        assert done.exists() is held, held
        done.unlink(missing_ok=True)
