"""Hybrid sharded data parallelism (--strategy hsdp) with real processes (torchrun, gloo, 4 ranks
as 2 groups x 2 shards): it trains exactly like ddp, resumes bitwise, its checkpoints reshard onto
one device, the planner shards over the group, and a group size that does not divide the job is
one line before any worker starts."""

from __future__ import annotations

import pytest
import torch

from scaletrain.config import TrainConfig
from scaletrain.memory.model_state import ParamInfo, model_state
from scaletrain.options import from_mapping
from tests.processes import DIGITS_MLP, metrics, run

pytestmark = pytest.mark.timeout(300)
COMMON = DIGITS_MLP + ["--epochs", "2", "--batch-size", "64", "--no-record"]
HSDP = ["--nproc", "4", "--strategy", "hsdp", "--shard-size", "2"]


def _epochs(path):
    return [(m["train_loss"], m["train_accuracy"], m["val_loss"], m["val_accuracy"]) for m in metrics(path)]


@pytest.fixture(scope="module")
def hsdp_run(tmp_path_factory):
    """2 epochs of hsdp on 4 ranks, checkpointed every 30 steps (step 30 is mid-way through epoch 2)."""
    folder = tmp_path_factory.mktemp("hsdp")
    result = run(["train", *COMMON, *HSDP, "--run-dir", str(folder / "full"), "--checkpoint-every", "30"], folder)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "layout: 2 group(s) of 2: parameters sharded within a group" in result.stdout
    return folder


@pytest.mark.usefixtures("processes")
def test_hsdp_trains_exactly_like_ddp(hsdp_run):
    ddp = run(["train", *COMMON, "--nproc", "4", "--strategy", "ddp", "--run-dir", str(hsdp_run / "ddp")], hsdp_run)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    for a, b in zip(_epochs(hsdp_run / "ddp"), _epochs(hsdp_run / "full"), strict=True):
        assert a == pytest.approx(b, abs=1e-6)
    want, got = (torch.load(hsdp_run / name / "model.pt", weights_only=True) for name in ("ddp", "full"))
    assert want.keys() == got.keys()
    for name in want:
        assert torch.allclose(want[name], got[name], atol=1e-6), name


@pytest.mark.usefixtures("processes")
def test_hsdp_resumes_bitwise_and_reshards_onto_one_device(hsdp_run):
    ckpt = hsdp_run / "full" / "checkpoints" / "step-000000030"
    again = run(["train", *COMMON, *HSDP, "--run-dir", str(hsdp_run / "again"), "--resume", str(ckpt)], hsdp_run)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {ckpt}" in again.stdout
    assert _epochs(hsdp_run / "again") == _epochs(hsdp_run / "full")          # bitwise, not approximately
    one = run(["train", *COMMON, "--strategy", "single", "--run-dir", str(hsdp_run / "one"), "--resume", str(ckpt)],
              hsdp_run)
    assert one.returncode == 0, one.stderr[-3000:]
    for a, b in zip(_epochs(hsdp_run / "full"), _epochs(hsdp_run / "one"), strict=True):
        assert a == pytest.approx(b, abs=1e-6)


def test_planner_shards_hsdp_state_over_its_group():
    params = [ParamInfo((64, 64), 0), ParamInfo((64,), 0), ParamInfo((10, 64), -1)]
    cfg = from_mapping(TrainConfig, {"distributed": {"strategy": "hsdp", "shard_size": 2}})
    hsdp = model_state(params, "hsdp", 8, 4, 4, distributed=cfg.distributed)
    assert hsdp == model_state(params, "fsdp", 2, 4, 4)            # sharded over its group of 2, not over 8
    assert hsdp.optimizer_bytes > model_state(params, "fsdp", 8, 4, 4).optimizer_bytes
    assert model_state(params, "hsdp", 8, 4, 4) == model_state(params, "fsdp", 8, 4, 4)   # default: one group


@pytest.mark.usefixtures("processes")
def test_a_shard_size_that_does_not_divide_the_job_is_one_line(tmp_path):
    result = run(["train", *COMMON, "--nproc", "4", "--strategy", "hsdp", "--shard-size", "3",
                  "--run-dir", str(tmp_path / "r")], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "scaletrain: error: --shard-size 3 does not divide 4 processes into equal groups; use a divisor of 4"]
    assert not (tmp_path / "r").exists()
    wrong = run(["train", *COMMON, "--shard-size", "2"], tmp_path)
    assert wrong.returncode == 2 and "--shard-size needs --strategy hsdp" in wrong.stderr
