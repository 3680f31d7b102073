"""`scaletrain tune`: a real Optuna study whose trials are real training processes; resumed after
a kill; shared by two processes through a real PostgreSQL server; bad space files."""

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from scaletrain.cli.main import main
from tests.processes import DIGITS_MLP, descendants, free_port, run, run_here, start, warm_children

optuna = pytest.importorskip("optuna")

SPACE = """
[lr]
type = "float"
low = 3e-3
high = 3e-2
log = true

[batch_size]
type = "categorical"
choices = [32, 64]
"""
# A fifth of digits' training split (288 samples) validates: with the default tenth (144 samples) one
# image is 0.7 points, and the best of six trials sat at 136/144 = 0.944 in one CI run out of several.
BASE = ["--model", "mlp", "--model-option", "hidden=[64]", "--data", "digits", "--epochs", "8",
        "--val-fraction", "0.2"]


def _finished(study):
    State = optuna.trial.TrialState
    return {t.number: (t.state, t.params, t.value) for t in study.get_trials()
            if t.state in (State.COMPLETE, State.PRUNED)}


@pytest.mark.usefixtures("processes")
def test_tune_reaches_95_percent_on_digits_and_resumes_after_a_kill(tmp_path):
    (tmp_path / "space.toml").write_text(SPACE)
    args = ["tune", "--space", "space.toml", "--trials", "6", "--parallel", "2", "--out", "study", *BASE]
    storage = f"sqlite:///{tmp_path / 'study' / 'study.db'}"
    first = start(args, tmp_path, tmp_path / "first.log")
    try:
        # Kill it once two trials have finished and later ones are training.
        deadline, trainings = time.monotonic() + 240, []
        while time.monotonic() < deadline:
            try:
                study = optuna.load_study(study_name="space", storage=storage)
                running = study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
                if len(_finished(study)) >= 2 and running:
                    trainings = descendants(first.pid)
                    if trainings:
                        break
            except Exception:  # the database is not created yet
                pass
            time.sleep(0.3)
        else:
            pytest.fail("no two trials finished in time:\n" + (tmp_path / "first.log").read_text())
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    # The running trainings die with their tune (PR_SET_PDEATHSIG): no orphan keeps training.
    deadline = time.monotonic() + 30
    while any(os.path.exists(f"/proc/{pid}") and "Z" not in open(f"/proc/{pid}/stat").read().split()[2]
              for pid in trainings) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in trainings if os.path.exists(f"/proc/{pid}")
                and open(f"/proc/{pid}/stat").read().split()[2] != "Z"]
    before = _finished(optuna.load_study(study_name="space", storage=storage))

    # Cold, as a user's would be: this resumed tune, started from the warm server, hung past its
    # 300 s twice in about ten suite runs (2026-11-29, 2026-12-01), and never cold; the hang is
    # the warm harness's to find (issue 67's closing notes), not this claim's.
    second = run(args, tmp_path, timeout=300, cold=True)
    assert second.returncode == 0, second.stdout + second.stderr
    study = optuna.load_study(study_name="space", storage=storage)
    after = _finished(study)
    assert len(after) == 6
    assert {n: after[n] for n in before} == before  # finished trials kept, values unchanged
    rerun = [n for n in before if f"trial {n} on " in second.stdout]
    assert not rerun, f"finished trials ran again: {rerun}"
    started = second.stdout.count(" on cpu ")
    assert started == 6 - len(before)
    assert "was left running by a killed tune" in second.stdout
    assert study.best_value >= 0.95
    # best.toml is a plain training config that trains to the same accuracy again.
    again = run(["train", "--config", "study/best.toml", "--run-dir", "again", "--no-record"], tmp_path)
    assert again.returncode == 0, again.stderr
    import json
    assert json.loads((tmp_path / "again" / "summary.json").read_text())["best_val_accuracy"] >= 0.95
    # Every trial is a run in the store.
    listing = run_here(["runs", "list", "--group", "tune-space", "--json"], tmp_path)
    run_ids = {r["run"] for r in json.loads(listing.stdout)}
    assert {t.user_attrs["run_id"] for t in study.get_trials() if t.number in after} <= run_ids
    # The study asked to search around another training: refused, its trials kept as they were.
    other = run([*args, "--epochs", "4"], tmp_path)
    assert other.returncode == 2 and "holds a study of another training (it differs in epochs)" in other.stderr, \
        other.stderr[-2000:]
    assert len(_finished(optuna.load_study(study_name="space", storage=storage))) == 6



@pytest.fixture(scope="module")
def postgres():
    """A real PostgreSQL server on loopback (Debian's package; scripts/setup-system.sh installs it)."""
    pytest.importorskip("psycopg")
    binaries = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not binaries:
        pytest.skip("no PostgreSQL server installed (scripts/setup-system.sh installs Debian's postgresql)")
    bin_dir = binaries[-1]
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    folder = tempfile.mkdtemp(prefix="scaletrain-pg-", dir="/tmp")
    os.chmod(folder, 0o755)
    if as_postgres:
        shutil.chown(folder, "postgres", "postgres")
    data, port = os.path.join(folder, "data"), free_port()
    subprocess.run([*as_postgres, f"{bin_dir}/initdb", "-D", data, "-A", "trust", "-U", "postgres"],
                   check=True, capture_output=True)
    subprocess.run([*as_postgres, f"{bin_dir}/pg_ctl", "-D", data, "-l", os.path.join(folder, "log"), "-w",
                    "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {folder}", "start"],
                   check=True, capture_output=True)
    try:
        subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-c", "CREATE DATABASE tune"],
                       check=True, capture_output=True)
        yield f"postgresql://postgres@127.0.0.1:{port}/tune"
    finally:
        subprocess.run([*as_postgres, f"{bin_dir}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


ROUNDS = 8


def _open_at_once(url: str, gate, results) -> None:
    from scaletrain.experiments.study import open_storage
    gate.wait()
    try:
        open_storage(url)
        results.put("ok")
    except Exception as exc:  # the test reports what each process met
        results.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.usefixtures("processes")
def test_processes_opening_a_new_postgresql_database_at_once_all_succeed(postgres):
    # The first opening of a database creates Optuna's schema; processes racing on it must all
    # open the storage (PostgreSQL reports the loser as "relation ... already exists"). Several
    # fresh databases, so that the race is met.
    import multiprocessing
    server = postgres.rsplit("/", 1)[0]
    ctx = multiprocessing.get_context("fork")
    for attempt in range(ROUNDS):
        url = f"{server}/race{attempt}"
        subprocess.run(["psql", f"{server}/tune", "-c", f"CREATE DATABASE race{attempt}"], check=True,
                       capture_output=True)
        gate, results = ctx.Barrier(6), ctx.Queue()
        procs = [ctx.Process(target=_open_at_once, args=(url, gate, results)) for _ in range(6)]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        assert outcomes == ["ok"] * 6, outcomes


@pytest.mark.usefixtures("processes")
def test_a_postgresql_study_shared_by_two_processes(tmp_path, postgres):
    (tmp_path / "space.toml").write_text(SPACE)
    common = ["tune", "--space", "space.toml", "--trials", "4", "--parallel", "1", "--storage", postgres,
              "--study-name", "shared", *BASE, "--epochs", "3"]
    hosts = [start([*common, "--out", f"host{i}"], tmp_path, tmp_path / f"host{i}.log", **warm_children())   # trials warm
             for i in range(2)]
    try:
        codes = [h.wait(timeout=300) for h in hosts]
    finally:
        for h in hosts:
            if h.poll() is None:
                os.killpg(h.pid, signal.SIGKILL)
    logs = [(tmp_path / f"host{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], logs
    study = optuna.load_study(study_name="shared", storage=postgres)
    finished = _finished(study)
    assert len(finished) == 4
    workers = {t.user_attrs["worker"] for t in study.get_trials() if t.number in finished}
    assert len(workers) == 2, f"both processes should have run trials: {workers}"
    assert all(log.count(" on cpu ") >= 1 for log in logs)


@pytest.mark.parametrize("space, message", [
    ('[learning_rat]\ntype = "float"\nlow = 0.1\nhigh = 1.0\n', "unknown parameter 'learning_rat'"),
    ('[lr]\ntype = "float"\nlow = 0.1\nhigh = 0.01\n', "low (0.1) is greater than high (0.01)"),
    ('[lr]\ntype = "float"\nlow = 0.0\nhigh = 0.1\nlog = true\n', "a log scale needs low > 0"),
    ('[weight_decay]\ntype = "float"\nlow = -1.0\nhigh = 0.1\nlog = true\n', "a log scale needs low > 0"),
    ('[lr]\ntype = "float"\nlo = 0.1\nhigh = 1.0\n', "unknown setting(s) lo"),
    ('[lr]\ntype = "real"\nlow = 0.1\nhigh = 1.0\n', "type must be one of float, int, categorical"),
    ('[optim.lr]\ntype = "float"\nlow = 0.1\nhigh = 1.0\n', 'write ["optim.lr"] (quoted)'),
    ('[epochs]\ntype = "int"\nlow = 1.5\nhigh = 4\n', "low must be an integer"),
    ('[optimizer]\ntype = "categorical"\nchoices = []\n', "non-empty list"),
    ('[batch_size]\ntype = "categorical"\nchoices = [32, "big"]\n', "expects int"),
    ('[run_id]\ntype = "categorical"\nchoices = ["a"]\n', "cannot be searched"),
    ("lr = [", "not valid TOML"),
])
def test_bad_space_files_give_one_clear_line(tmp_path, capsys, space, message):
    (tmp_path / "space.toml").write_text(space)
    assert main(["tune", "--space", str(tmp_path / "space.toml"), "--data", "digits"]) == 2
    err = capsys.readouterr().err
    assert message in err and "space file" in err and len(err.strip().splitlines()) == 1


def test_tune_rejects_a_missing_space_file_and_a_bad_metric(tmp_path, capsys):
    assert main(["tune", "--space", str(tmp_path / "nope.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "space.toml").write_text(SPACE)
    assert main(["tune", "--space", str(tmp_path / "space.toml"), "--metric", "accuracy", "--out",
                 str(tmp_path / "s"), "--data", "digits", "--model", "mlp"]) == 2
    assert "--metric accuracy is not something a run reports" in capsys.readouterr().err


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("nproc", [1, 2])
def test_a_trial_process_is_pruned_through_the_real_cli(tmp_path, nproc):
    """The tuner's pruning reaches a trial's `train` process: a trial trailing a finished one at
    every epoch is stopped (exit 3) and recorded as pruned. Under --nproc every rank stops with
    the chief (a rank left training would wait on it until the collective timeout)."""
    import json as _json

    import optuna

    from scaletrain.experiments.pruning import TRIAL_ENV
    from scaletrain.tracking import RunStore
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    study.add_trial(optuna.trial.create_trial(value=0.999, intermediate_values={k: 0.999 for k in range(1, 11)},
                                              params={}, distributions={}))
    trial = study.ask()
    spec = {"storage": storage, "study": "s", "trial_id": trial._trial_id, "metric": "val_accuracy",
            "pruner": {"kind": "median", "startup_trials": 1, "warmup_epochs": 0}}
    result = run(["train", *DIGITS_MLP, "--epochs", "5", "--run-id", "trial1", "--target-accuracy", "0.9999",
                  "--nproc", str(nproc), "--step-timeout-s", "60"], tmp_path, timeout=50, **{TRIAL_ENV: _json.dumps(spec)})
    assert result.returncode == 3, result.stderr
    assert result.stderr.count("pruned after epoch 1") == 1 and "failed" not in result.stderr, result.stderr
    with RunStore(tmp_path / "scaletrain-runs" / "runs.db", create=False) as store:
        assert store.get("trial1").status == "pruned"


def test_a_study_refuses_to_select_on_the_test_split_and_knows_every_task_metric():
    from pathlib import Path

    from scaletrain.config import TrainConfig
    from scaletrain.errors import UserError
    from scaletrain.experiments.space import SearchSpace
    from scaletrain.experiments.tune import EPOCH_METRICS, TuneSettings, check_settings

    def settings(metric):
        return TuneSettings(space=SearchSpace(parameters=(), text=""), trials=1, parallel=1, metric=metric, direction="minimize",
                            out=Path("o"), storage_url="sqlite:///x.db", study_name="s", pruner={})
    with pytest.raises(UserError, match="never selects on the test split.*val_accuracy"):
        check_settings(settings("test_accuracy"), TrainConfig())
    assert {"val_perplexity", "val_r2", "val_mae", "train_mae"} <= set(EPOCH_METRICS)
    check_settings(settings("val_perplexity"), TrainConfig())
