"""Experiments as single commands: the batch-size sweep and several trainings at once; each
training a real process and a real run in the store."""

import csv
import json

import pytest

from scaletrain.tracking import RunStore
from tests.processes import run


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


def test_sweep_rejects_bad_sizes(tmp_path):
    for sizes, message in [("8,x", "comma-separated list of integers"), ("8,0", "at least 1"),
                           ("8,8", "repeat a size")]:
        out = run(["sweep", "batch-size", sizes, "--data", "digits"], tmp_path)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
