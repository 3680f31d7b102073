"""A saved model in and out (seed 002 saves from one strategy and loads into another):
`--init-from` starts a new run from a run's weights, checked before any worker starts, and
`scaletrain export` writes a program for serving that predicts what the trained model does."""

from __future__ import annotations

import importlib.util
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from scaletrain.config import TrainConfig
from scaletrain.options import from_mapping
from scaletrain.training import build_training
from tests.processes import DIGITS_MLP, run, run_here

pytestmark = pytest.mark.usefixtures("processes")   # every test here starts processes


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """(working folder, model.pt) of one short run."""
    cwd = tmp_path_factory.mktemp("serving")
    result = run(["train", *DIGITS_MLP, "--epochs", "1", "--run-id", "src"], cwd)
    assert result.returncode == 0, result.stderr
    (folder,) = [p for p in (cwd / "scaletrain-runs").iterdir() if p.is_dir()]
    # Named before the probe could choose its precision: the name says so rather than the rule's guess.
    assert folder.name.endswith("-mlp-digits-auto-src"), folder.name
    return cwd, folder / "model.pt"


def _reference(model_pt: Path):
    """(test inputs, the trained model's predictions on them) through the Python API, the
    weights put in by --init-from."""
    cfg = from_mapping(TrainConfig, json.loads((model_pt.parent / "config.json").read_text()))
    cfg.model.init_from = str(model_pt)
    with build_training(cfg) as built:
        built.trainer.adopt(built.dataset)
        x = torch.as_tensor(built.dataset.test.x[:37])      # not the export's example batch size
        return x, built.trainer.predict(x)


def test_init_from_puts_the_saved_weights_into_a_new_run(trained):
    _, model_pt = trained
    saved = torch.load(model_pt, weights_only=True)
    cfg = from_mapping(TrainConfig, json.loads((model_pt.parent / "config.json").read_text()))
    with build_training(cfg) as built:
        fresh = built.trainer.model.state_dict()
    assert any(not torch.equal(fresh[k], saved[k]) for k in saved)   # training changed them
    cfg.model.init_from = str(model_pt)
    with build_training(cfg) as built:
        loaded = built.trainer.model.state_dict()
    assert all(torch.equal(loaded[k], saved[k]) for k in saved)


def test_init_from_refuses_what_does_not_fit_before_any_worker_starts(trained):
    cwd, model_pt = trained
    (cwd / "damaged.pt").write_bytes(model_pt.read_bytes()[:200])
    (cwd / "list.pt").write_bytes(b"")
    (cwd / "raw.pkl").write_bytes(pickle.dumps({"body.1.weight": [0.0]}, protocol=4))
    torch.save([torch.zeros(2)], cwd / "list.pt")
    cases = [(["--model-option", "hidden=[32]"], "body.1.weight is (64, 64) there, (32, 64) here"),
             (["--init-from", str(cwd / "damaged.pt")], "is not a whole file of torch.save's (cut short"),
             (["--init-from", str(cwd / "raw.pkl")], "a raw pickle"),    # one line: not torch's warning first
             (["--init-from", str(cwd / "list.pt")], "holds a list, not a model's state dict"),
             (["--init-from", str(cwd / "none.pt")], "--init-from " + str(cwd / "none.pt") + ": no such file")]
    for extra, words in cases:
        args = ["train", *DIGITS_MLP, "--init-from", str(model_pt), "--nproc", "2", "--epochs", "1", *extra]
        result = run_here(args, cwd)
        assert result.returncode == 2 and words in result.stderr, (extra, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "worker" not in result.stderr


def test_export_predicts_what_the_trained_model_does(trained):
    cwd, model_pt = trained
    result = run(["export", "src"], cwd)
    assert result.returncode == 0, result.stderr
    exported = model_pt.with_suffix(".pt2")
    assert f"exported run src to {exported.relative_to(cwd)}" in result.stdout
    x, expected = _reference(model_pt)
    got = torch.export.load(exported).module()(x)
    assert (got - expected).abs().max().item() < 1e-5
    before = exported.read_bytes()
    again = run_here(["export", "src"], cwd)            # an export is a result: never overwritten
    assert again.returncode == 2 and "already exists" in again.stderr
    assert exported.read_bytes() == before and not list(model_pt.parent.glob(".*tmp*"))


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript", "onnxruntime")),
                    reason="the onnx extra is not installed")
def test_onnx_export_runs_in_onnxruntime_like_the_trained_model(trained):
    import onnxruntime
    cwd, model_pt = trained
    result = run(["export", "src", "--format", "onnx", "--out", "served/model.onnx"], cwd)
    assert result.returncode == 0, result.stderr
    session = onnxruntime.InferenceSession(str(cwd / "served/model.onnx"), providers=["CPUExecutionProvider"])
    x, expected = _reference(model_pt)
    got = session.run(None, {session.get_inputs()[0].name: x.to(torch.float32).numpy()})[0]
    assert abs(torch.from_numpy(got) - expected).max().item() < 1e-5


def test_predict_splits_the_samples_over_the_replicas_and_equals_one_device(trained):
    cwd, model_pt = trained
    x, expected = _reference(model_pt)
    np.save(cwd / "x.npy", x.numpy())
    one = run(["predict", "src", "--split", "test", "--out", "one.npy"], cwd)
    assert one.returncode == 0, one.stderr
    # fsdp: each replica's forwards gather parameters, so the ranks must run as many (the split is uneven).
    two = run(["predict", "src", "--input", "x.npy", "--out", "two.npy", "--nproc", "2", "--strategy", "fsdp"], cwd)
    assert two.returncode == 0, two.stderr
    assert "37 samples of run src in 2 process(es), split over 2 replica(s) (fsdp)" in two.stdout
    assert abs(np.load(cwd / "two.npy") - expected.numpy()).max() < 1e-6
    cfg = from_mapping(TrainConfig, json.loads((model_pt.parent / "config.json").read_text()))
    with build_training(cfg) as built:
        test_x = built.dataset.test.x
    assert np.load(cwd / "one.npy").shape == (len(test_x), 10)
    assert abs(np.load(cwd / "one.npy")[:37] - expected.numpy()).max() < 1e-6
    np.save(cwd / "wrong.npy", np.zeros((3, 4), dtype=np.float32))
    bad = run_here(["predict", "src", "--input", "wrong.npy", "--out", "w.npy", "--nproc", "2"], cwd)
    assert bad.returncode == 2 and "samples of shape (4,)" in bad.stderr and not (cwd / "w.npy").exists()
    again = run_here(["predict", "src", "--split", "test", "--out", "one.npy"], cwd)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_a_damaged_model_pt_is_named_as_the_runs_not_as_a_flag_never_given(tmp_path):
    """predict, export and ensemble read a run's model.pt without the user naming a flag: a damaged
    one is one line naming that run's saved model (issue 66: it blamed --init-from)."""
    made = run(["train", *DIGITS_MLP, "--epochs", "1", "--run-id", "dmg", "--run-dir", "r"], tmp_path)
    assert made.returncode == 0, made.stderr
    (tmp_path / "r" / "model.pt").write_bytes(b"not a model")
    for argv in (["predict", "dmg", "--split", "test", "--out", "p.npy"], ["export", "dmg"]):
        result = run_here(argv, tmp_path)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert "--init-from" not in lines[0] and "r/model.pt" in lines[0], lines[0]
        assert "saved model of run folder r" in lines[0] or "run dmg's model" in lines[0], lines[0]
    twice = run_here(["ensemble", "dmg", "dmg"], tmp_path)
    assert twice.returncode == 2 and "dmg" in twice.stderr and "twice" in twice.stderr, twice.stderr
