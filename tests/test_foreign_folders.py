"""A run folder or run store from elsewhere is a file from a user: the code its configuration names
is imported only where this machine sealed the run, the command line names the same code, or the
user says --trust-code (user_code/trust.py). Through the real CLI."""

import json
import sqlite3
from pathlib import Path

import pytest

from scaletrain.config import config_digest
from tests.processes import run

MODEL = "faulty_models:slow_mlp"
QUICK = ["--model", MODEL, "--model-option", "delay_s=0.0", "--data", "digits", "--no-progress",
         "--checkpoint-every", "5"]


def _one_line(result, code=2) -> str:
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def _run_id(folder: Path) -> str:
    return (folder / "run_id").read_text().strip()


@pytest.fixture
def sealed_run(tmp_path):
    """A finished run of the user's own model, made on "this machine" (the cache folder `home`)."""
    home = tmp_path / "home"
    for folder in ("a", "b"):     # b: an ensemble's second member
        made = run(["train", *QUICK, "--epochs", "1", "--run-dir", folder], cwd=tmp_path, XDG_CACHE_HOME=str(home))
        assert made.returncode == 0, made.stderr
    assert (home / "scaletrain" / "trust.key").stat().st_mode & 0o777 == 0o600
    return tmp_path, home


@pytest.mark.usefixtures("processes")
def test_a_folder_from_another_machine_imports_no_code_unless_named_or_trusted(sealed_run):
    cwd, home = sealed_run
    elsewhere = str(cwd / "other-home")        # another user's cache: another key, so no seal of theirs holds
    ours = run(["train", "--run-dir", "a", "--resume", "auto", "--epochs", "2"], cwd=cwd, XDG_CACHE_HOME=str(home))
    assert ours.returncode == 0, ours.stderr             # this machine's own run needs no word
    refused = run(["train", "--run-dir", "a", "--resume", "auto", "--epochs", "3"], cwd=cwd, XDG_CACHE_HOME=elsewhere)
    line = _one_line(refused)
    assert MODEL in line and "--trust-code" in line
    watched = run(["evaluate", "--watch", "a", "--once"], cwd=cwd, XDG_CACHE_HOME=elsewhere)
    assert MODEL in _one_line(watched)
    run_id = _run_id(cwd / "a")
    for command in (["predict", run_id, "--split", "test", "--out", "p.npy"], ["export", run_id],
                    ["ensemble", run_id, _run_id(cwd / "b")]):
        assert MODEL in _one_line(run(command, cwd=cwd, XDG_CACHE_HOME=elsewhere)), command
    assert not (cwd / "p.npy").exists()
    named = run(["train", "--run-dir", "a", "--resume", "auto", "--epochs", "3", "--model", MODEL],
                cwd=cwd, XDG_CACHE_HOME=elsewhere)
    assert named.returncode == 0, named.stderr
    trusted = run(["evaluate", "--watch", "a", "--once", "--trust-code"], cwd=cwd, XDG_CACHE_HOME=elsewhere)
    assert trusted.returncode == 0, trusted.stderr
    by_env = run(["predict", run_id, "--split", "test", "--out", "p.npy"], cwd=cwd, XDG_CACHE_HOME=elsewhere,
                 SCALETRAIN_TRUST_CODE="1")
    assert by_env.returncode == 0, by_env.stderr


@pytest.mark.usefixtures("processes")
def test_a_crafted_config_with_its_digest_updated_runs_no_code(sealed_run):
    """The red team's folder: `data.name` set to a standard-library function, its options as the
    arguments, run.json's digest (and the store's copy) updated to match."""
    cwd, home = sealed_run
    folder, marker = cwd / "a", cwd / "PWNED"
    config = json.loads((folder / "config.json").read_text())
    config["data"] = {**config["data"], "name": "subprocess:getoutput", "options": {"cmd": f"touch {marker}"}}
    (folder / "config.json").write_text(json.dumps(config))
    meta = json.loads((folder / "run.json").read_text())
    meta["config_sha256"] = config_digest(config)
    (folder / "run.json").write_text(json.dumps(meta))
    run_id = _run_id(folder)
    with sqlite3.connect(cwd / "scaletrain-runs" / "runs.db") as db:
        db.execute("UPDATE runs SET config = ? WHERE id = ?", (json.dumps(config), run_id))
    for command in (["train", "--run-dir", "a", "--resume", "auto", "--epochs", "2"],
                    ["evaluate", "--watch", "a", "--once"],
                    ["predict", run_id, "--split", "test", "--out", "p.npy"]):
        line = _one_line(run(command, cwd=cwd, XDG_CACHE_HOME=str(home)))
        assert "subprocess:getoutput" in line and "--trust-code" in line, command
    assert not marker.exists()


@pytest.mark.usefixtures("processes")
def test_a_run_writes_only_into_a_new_empty_or_own_folder(tmp_path):
    """`--run-dir /` once wrote seven files into `/`, and from then on every run anywhere was refused
    as "inside the folder of run ...". A folder holding what no run writes is refused, resume and
    overwrite alike, before anything is written; a stray run file in such a folder blocks nothing."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("mine")
    for extra in ([], ["--overwrite"], ["--resume", "auto"]):
        refused = run(["train", *QUICK, "--epochs", "1", "--run-dir", "project", *extra], cwd=tmp_path)
        line = _one_line(refused)
        assert "--run-dir project already holds files that are not a run's (notes.txt)" in line, extra
        assert sorted(p.name for p in project.iterdir()) == ["notes.txt"], extra
    # The files the old bug left in a home folder: no later run is "inside" that stray run.
    for name, text in (("run.json", json.dumps({"run_id": "stray", "status": "finished"})), ("run_id", "stray\n")):
        (project / name).write_text(text)
    below = run(["train", *QUICK, "--epochs", "1", "--run-dir", "project/runs/a"], cwd=tmp_path)
    assert below.returncode == 0, below.stderr
    nested = run(["train", *QUICK, "--epochs", "1", "--run-dir", "project/runs/a/inner"], cwd=tmp_path)
    assert "is inside the folder of run" in _one_line(nested)     # a real run's folder still holds only it


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("sig, code, word", [("SIGTERM", 143, "terminated"), ("SIGINT", 130, "interrupted")])
def test_a_stop_swallowed_on_its_way_still_ends_the_run(tmp_path, sig, code, word):
    """A signal whose exception something swallowed (here the user's builder; once torch._C's
    initialisation) is still owed: the run ends as interrupted, never trains to its end."""
    args = ["train", "--model", "swallowing:mlp", "--model-option", f"signal_name='{sig}'", "--data", "digits",
            "--no-progress", "--epochs", "3", "--run-dir", "a"]
    result = run(args, cwd=tmp_path, cold=True)
    assert result.returncode == code, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [f"scaletrain: {word}"]
    folder = tmp_path / "a"
    assert not (folder / "model.pt").exists()
    assert not folder.exists() or json.loads((folder / "run.json").read_text())["status"] == "interrupted"


@pytest.mark.usefixtures("processes")
def test_a_stop_at_any_moment_of_start_up_ends_the_run_or_leaves_nothing(tmp_path):
    """SIGTERM and SIGINT in turn, every 100 ms over the first 3 s of a cold `train`: each ends the
    command as stopped (128 + the signal; or killed by it before a handler exists), and a run it
    had begun is recorded interrupted, never trained on to exit 0."""
    import signal
    import time

    from tests.processes import kill_group, start
    outcomes = []
    for i in range(30):
        sig = (signal.SIGTERM, signal.SIGINT)[i % 2]
        folder = tmp_path / f"r{i}"
        proc = start(["train", *QUICK, "--epochs", "200", "--target-accuracy", "0.9999", "--run-dir", folder.name],
                     tmp_path, tmp_path / f"{i}.log")
        time.sleep(0.1 * (i + 1))
        proc.send_signal(sig)
        try:
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                kill_group(proc)
        log = (tmp_path / f"{i}.log").read_text()
        status = json.loads((folder / "run.json").read_text())["status"] if (folder / "run.json").exists() else None
        outcomes.append((i, sig.name, proc.returncode, status))
        assert proc.returncode in (128 + sig, -sig), (outcomes, log[-2000:])
        assert "Traceback" not in log, log[-2000:]
        assert status in (None, "interrupted"), (outcomes, log[-2000:])
        assert status is not None or not folder.exists(), (outcomes, sorted(p.name for p in folder.iterdir()))


@pytest.mark.usefixtures("processes")
def test_a_job_whose_workers_trained_nothing_fails_naming_their_command(tmp_path):
    """A child command that is not scaletrain exits 0 having done nothing: the job once exited 0,
    printed nothing and left no run."""
    child = tmp_path / "not-scaletrain.sh"
    child.write_text("#!/bin/sh\nexit 0\n")
    child.chmod(0o755)
    result = run(["train", *QUICK, "--epochs", "1", "--nproc", "2", "--run-dir", "a"], cwd=tmp_path, cold=True,
                 SCALETRAIN_CHILD_COMMAND=str(child))
    line = _one_line(result)
    assert "none recorded run" in line and str(child) in line


@pytest.mark.usefixtures("processes")
def test_this_machines_lightning_runs_reach_the_ensemble_without_a_word_of_trust(tmp_path):
    """A LightningModule run's summary names its task `lightning:<Class>`, which is the module's own
    (never imported by that name): sealed runs of this machine are not refused as foreign code, and
    the ensemble scores their mean class probabilities as the data's classification."""
    ids = []
    for seed in (0, 1):
        made = run(["train", "--model", "lit_classifier:LitClassifier", "--data", "lit_classifier:Blobs", "--epochs",
                    "1", "--seed", str(seed), "--no-progress", "--run-dir", f"r{seed}"], cwd=tmp_path)
        assert made.returncode == 0, made.stderr[-2000:]
        ids.append(_run_id(tmp_path / f"r{seed}"))
    ensemble = run(["ensemble", *ids], cwd=tmp_path)
    assert ensemble.returncode == 0 and "Traceback" not in ensemble.stderr, ensemble.stderr[-2000:]
    assert "names code to import" not in ensemble.stderr and "averaged probabilities" in ensemble.stdout
