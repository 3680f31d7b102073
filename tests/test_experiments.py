"""Experiments as single commands: the batch-size sweep and several trainings at once; each
training a real process and a real run in the store."""

import csv
import json

import pytest

from scaletrain.tracking import RunStore
from tests.processes import run


@pytest.mark.usefixtures("processes")
def test_sweep_records_every_point_and_survives_failing_ones(tmp_path):
    pytest.importorskip("matplotlib")
    out = run(["sweep", "batch-size", "16,128,256", "--model", "faulty_models:sweep_fault_mlp",
               "--model-option", "hidden=[32]", "--data", "digits", "--epochs", "3", "--lr", "0.003",
               "--target-accuracy", "0.8", "--lr-scaling", "sqrt", "--out", str(tmp_path / "sweep")], tmp_path,
              timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    with (tmp_path / "sweep" / "points.csv").open() as fh:
        points = {int(row["batch_size"]): row for row in csv.DictReader(fh)}
    assert sorted(points) == [16, 128, 256]
    assert points[16]["status"] == "finished" and float(points[16]["images_per_sec"]) > 0
    assert points[16]["time_to_target_s"] and points[16]["reached_target"] == "True"
    assert points[128]["status"] == "failed" and "OutOfMemoryError" in points[128]["error"]
    assert points[256]["status"] == "failed" and "exit code -9" in points[256]["error"]
    # sqrt LR scaling relative to the base batch size (128, the default): 16 -> lr * sqrt(1/8)
    assert float(points[16]["lr"]) == pytest.approx(0.003 * (16 / 128) ** 0.5)
    with RunStore(tmp_path / "scaletrain-runs" / "runs.db", create=False) as store:
        records = {r.id: r for r in store.runs(group="sweep-sweep")}
        assert set(records) == {row["run_id"] for row in points.values()}
        assert records[points[16]["run_id"]].summary["batch_size"] == 16
        assert records[points[256]["run_id"]].status == "failed"  # settled by the sweep: the run could not
    for plot in ("throughput.png", "time_to_accuracy.png"):
        assert (tmp_path / "sweep" / plot).stat().st_size > 10_000
    with (tmp_path / "sweep" / "summary.csv").open() as fh:
        summary = {int(row["batch_size"]): row for row in csv.DictReader(fh)}
    assert summary[16]["finished"] == "1" and summary[256]["finished"] == "0"
    # Each point's config is a plain training config that `train --config` runs again.
    config = tmp_path / "sweep" / "points" / "bs00016-r1" / "config.toml"
    again = run(["train", "--config", str(config), "--epochs", "1", "--run-dir", str(tmp_path / "again"),
                 "--no-record"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "again" / "summary.json").read_text())["batch_size"] == 16


@pytest.mark.usefixtures("processes")
def test_sweep_rejects_bad_sizes(tmp_path):
    for sizes, message in [("8,x", "comma-separated list of integers"), ("8,0", "at least 1"),
                           ("8,8", "repeat a size")]:
        out = run(["sweep", "batch-size", sizes, "--data", "digits"], tmp_path)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def _config(path, seed, hidden):
    path.write_text(f'epochs = 4\nseed = {seed}\nbatch_size = 64\n[model]\nname = "mlp"\n[model.options]\n'
                    f'hidden = [{hidden}]\n[data]\nname = "digits"\n[optim]\nlr = 0.003\n')
    return str(path)


@pytest.mark.usefixtures("processes")
def test_multi_trains_side_by_side_and_ensemble_averages_them(tmp_path):
    configs = [_config(tmp_path / f"m{i}.toml", i, 32 * i) for i in (1, 2)]
    out = run(["multi", *configs, "--parallel", "2", "--group", "pair", "--out", str(tmp_path / "multi")], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    started = [i for i, line in enumerate(lines) if " started on cpu " in line]
    ended = [i for i, line in enumerate(lines) if ": finished after " in line]
    assert len(started) == 2 and max(started) < min(ended), "the two trainings should run at the same time"
    with RunStore(tmp_path / "scaletrain-runs" / "runs.db", create=False) as store:
        records = store.runs(group="pair")
    assert [r.status for r in records] == ["finished", "finished"]
    # Each got its own share of the two cores: one thread each.
    assert all("1 threads" in r.environment["device"] for r in records)
    ids = [r.id for r in records]
    result = json.loads(run(["ensemble", *ids, "--json"], tmp_path).stdout)
    assert result["task"] == "classification" and result["processes"] == 1
    by_run = {m["run"]: m["metrics"]["accuracy"] for m in result["members"]}
    for record in records:  # the saved weights, evaluated again, give the run's own test accuracy
        assert by_run[record.id] == pytest.approx(record.summary["test_accuracy"], abs=1e-6)
    assert result["ensemble"]["accuracy"] >= min(by_run.values()) - 0.02
    # One member per process, gathered by the chief: the serial result.
    side_by_side = json.loads(run(["ensemble", *ids, "--json", "--nproc", "2"], tmp_path).stdout)
    assert side_by_side["processes"] == 2
    assert side_by_side["members"] == result["members"] and side_by_side["ensemble"] == pytest.approx(
        result["ensemble"], abs=1e-6)
    # A run named twice is refused: its members are distinct runs, each counted once (issue 66).
    twice = run(["ensemble", ids[0], ids[0], "--json"], tmp_path)
    assert twice.returncode == 2 and f"run {ids[0]} is named twice" in twice.stderr
    pinned = json.loads(run(["ensemble", *ids, "--json", "--nproc", "2", "--devices", "1,0"], tmp_path).stdout)
    assert pinned["members"] == result["members"]      # each process on its own core: the same predictions
    out = run(["ensemble", *ids, "--nproc", "2", "--devices", "0"], tmp_path)
    assert out.returncode == 2 and "names 1 device(s) for --nproc 2" in out.stderr
    out = run(["ensemble", *ids, "--nproc", "3"], tmp_path)   # refused before any worker starts
    assert out.returncode == 2 and "--nproc 3 for 2 members" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.usefixtures("processes")
def test_multi_says_why_a_training_failed(tmp_path):
    (tmp_path / "bad.toml").write_text('epochs = 1\nbatch_size = 64\n[model]\nname = "faulty_models:raising_mlp"\n'
                                       '[model.options]\nrank = 0\nat_call = 2\n[data]\nname = "digits"\n')
    out = run(["multi", "bad.toml", "--out", "multi"], tmp_path)
    assert out.returncode == 1
    [line] = [line for line in out.stdout.splitlines() if "bad on cpu" in line]
    assert ": failed after " in line and "injected failure on rank 0 at forward 2" in line, out.stdout


@pytest.mark.usefixtures("processes")
def test_ensemble_rejects_runs_without_models_or_on_other_data(tmp_path):
    store = RunStore(tmp_path / "runs.db")
    store.start_run("nomodel1", run_dir=str(tmp_path / "gone"), config={"data": {"name": "digits"}})
    store.start_run("nomodel2", run_dir=str(tmp_path / "gone"), config={"data": {"name": "digits"}})
    store.close()
    out = run(["ensemble", "nomodel1", "nomodel2", "--store", str(tmp_path / "runs.db")], tmp_path)
    assert out.returncode == 2 and "has no saved model" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("args, message", [
    (["multi", "missing.toml"], "config file missing.toml does not exist"),
    (["multi", "bad.toml"], "unknown config key 'epoch'"),
    (["sweep", "batch-size", "8,16", "--repeats", "0", "--data", "digits"], "--repeats must be >= 1"),
    (["sweep", "batch-size", "8,16", "--parallel", "0", "--data", "digits"], "--parallel must be >= 1"),
    (["runs", "list", "--store", "."], "is a folder"),
    (["train", "--data", "digits", "--sample-interval-s", "0"], "tracking.sample_interval_s"),
])
def test_experiment_commands_reject_bad_input_in_one_line(tmp_path, capsys, args, message):
    from scaletrain.cli.main import main
    (tmp_path / "bad.toml").write_text("epoch = 3\n")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.usefixtures("processes")
def test_a_stopped_job_frees_its_slot_for_the_next(tmp_path):
    """autotune stops a candidate at its cap and starts the next in the same one-slot pool: the
    stopped job's slot must come back (it did not, and the next start raised IndexError)."""
    import sys
    import time

    from scaletrain.experiments.slots import Job, SlotPool, device_slots
    pool = SlotPool(device_slots(1, "cpu"))
    pool.start(Job("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "a.log"))
    assert pool.wait_any(until=time.perf_counter() + 0.5) is None     # still running at its cap
    pool.terminate()
    assert pool.has_free_slot and not pool.running
    pool.start(Job("next", [sys.executable, "-c", "print('ran')"], tmp_path / "b.log"))
    finished = pool.wait_any()
    assert finished.returncode == 0 and "ran" in finished.job.log.read_text()


def test_cpu_slots_split_the_cores_and_lr_scales_with_the_batch():
    import os

    from scaletrain.experiments.slots import device_slots
    from scaletrain.experiments.sweep import scaled_lr
    cores = sorted(os.sched_getaffinity(0))
    slots = device_slots(len(cores), "cpu")
    assert [s.cpus for s in slots] == [[c] for c in cores]  # one core each, no core shared
    assert all(s.env["OMP_NUM_THREADS"] == "1" and s.env["CUDA_VISIBLE_DEVICES"] == "" for s in slots)
    whole = device_slots(1, "cpu")[0]
    assert whole.cpus == cores and whole.env["OMP_NUM_THREADS"] == str(len(cores))
    assert scaled_lr(0.1, 128, 512, "linear") == pytest.approx(0.4)
    assert scaled_lr(0.1, 128, 512, "sqrt") == pytest.approx(0.2)
    assert scaled_lr(0.1, 128, 512, "none") == 0.1
