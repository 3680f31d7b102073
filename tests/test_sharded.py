"""Sharded data parallelism with real processes (torchrun, gloo): zero1, zero2 and fsdp train
exactly like ddp, hold the bytes the planner predicts, and their checkpoints reshard between world
sizes; the batch-size finder agrees across ranks."""

from __future__ import annotations

import json
import math

import pytest
import torch

from scaletrain.config import TrainConfig
from scaletrain.memory.model_state import ParamInfo, model_state
from scaletrain.options import from_mapping
from scaletrain.training import build_training
from tests.processes import DIGITS_MLP, PLUGINS, metrics, run, torchrun

pytestmark = pytest.mark.timeout(300)
STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory):
    """Each strategy's 2-rank run of the digits MLP (tests/plugins/sharded_worker.py)."""
    out = {}
    for strategy in (*STRATEGIES, "fsdp+offload"):
        folder = tmp_path_factory.mktemp(strategy)
        result = torchrun(2, [PLUGINS / "sharded_worker.py", strategy, folder], folder)
        assert result.returncode == 0, result.stderr[-3000:]
        out[strategy] = [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(2)]
    return out


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("strategy", ["zero1", "zero2", "fsdp"])
def test_sharded_strategies_match_ddp(worker_results, strategy):
    ddp, sharded = worker_results["ddp"][0], worker_results[strategy][0]
    for a, b in zip(ddp["history"], sharded["history"], strict=True):
        for key in ("train_loss", "train_accuracy", "val_loss", "val_accuracy"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), key
    for name, value in ddp["weights"].items():
        assert torch.allclose(value, sharded["weights"][name], atol=1e-6), name


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("strategy", ["zero2", "fsdp"])
def test_the_predictor_states_what_a_model_without_blocks_really_sends(worker_results, strategy):
    """`scaletrain scaling` prices what step_collectives states: for the MLP (no repeated block, one
    unit) one all-gather and one reduce-scatter of the whole model per step, under fsdp as under
    zero2 (the root keeps its gathered parameters for the backward). Counted in a real step."""
    from scaletrain.distributed.strategies.registry import STRATEGIES
    from scaletrain.models import build_model
    from scaletrain.prediction.measure import count_blocks
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=[64, 32])
    assert count_blocks(model) == 0
    stated = STRATEGIES.get(strategy).step_collectives(count_blocks(model))
    for rank in worker_results[strategy]:
        model_bytes = 4 * sum(math.prod(shape) for shape in rank["shapes"])     # float32
        for kind in ("all_gather", "reduce_scatter"):
            times = sum(count for k, count, _ in stated if k == kind)
            assert rank["collective_bytes"][kind] / model_bytes == pytest.approx(times, rel=0.05), kind
    assert not any(hides for *_, hides in stated)   # one unit: nothing to prefetch or reduce behind


@pytest.mark.usefixtures("processes")
def test_cpu_offload_trains_exactly_like_fsdp(worker_results):
    """FSDP2's CPUOffloadPolicy steps the optimizer on the host shards: the same arithmetic."""
    fsdp, offload = worker_results["fsdp"][0], worker_results["fsdp+offload"][0]
    for a, b in zip(fsdp["history"], offload["history"], strict=True):
        for key in ("train_loss", "train_accuracy", "val_loss", "val_accuracy"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), key
    for name, value in fsdp["weights"].items():
        assert torch.allclose(value, offload["weights"][name], atol=1e-6), name
    assert offload["offload_policies"] == ["CPUOffloadPolicy"] and fsdp["offload_policies"] == ["OffloadPolicy"]
    # The shards it holds are fsdp's (on a CPU both live in host memory).
    assert worker_results["fsdp+offload"][0]["held"] == fsdp["held"]


@pytest.mark.usefixtures("processes")
def test_planner_puts_cpu_offloads_shards_on_the_host(worker_results):
    from scaletrain.config import DistributedConfig
    params = [ParamInfo(shape, -1) for shape in worker_results["fsdp"][0]["shapes"]]
    offload = DistributedConfig(strategy="fsdp")
    offload.fsdp.cpu_offload = True
    for strategy in ("fsdp", "zero2"):
        plain = model_state(params, strategy, devices=2, storage_bytes=4, compute_bytes=4)
        moved = model_state(params, strategy, devices=2, storage_bytes=4, compute_bytes=4, distributed=offload)
        assert (moved.param_bytes, moved.grad_bytes, moved.optimizer_bytes) == (0, 0, 0)
        assert moved.host_bytes == plain.param_bytes + plain.grad_bytes + plain.optimizer_bytes > 0
        assert moved.gathered_param_bytes == plain.gathered_param_bytes
        assert plain.host_bytes == 0
    for strategy in ("ddp", "zero1", "hsdp"):   # they do not offload: their rows are as without the flag
        assert model_state(params, strategy, 2, 4, 4, distributed=offload) == model_state(params, strategy, 2, 4, 4)
    # The held bytes the offloaded shards really are (the planner's host column).
    held = max(sum(r["held"].values()) for r in worker_results["fsdp+offload"])
    assert model_state(params, "fsdp", 2, 4, 4, distributed=offload).host_bytes == held


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_planner_model_state_equals_what_each_rank_really_holds(worker_results, strategy):
    ranks = worker_results[strategy]
    params = [ParamInfo(shape, -1) for shape in ranks[0]["shapes"]]
    plan = model_state(params, strategy, devices=2, storage_bytes=4, compute_bytes=4, optimizer="adamw")
    held = [r["held"] for r in ranks]
    # The planner reports the device holding the most.
    assert plan.param_bytes == max(h["param_bytes"] for h in held)
    assert plan.grad_bytes == max(h["grad_bytes"] for h in held)
    assert plan.optimizer_bytes == max(h["optimizer_bytes"] for h in held)
    # And sharded really is smaller: halved (plus padding) by fsdp/zero2; by zero1 only as far as
    # whole tensors split evenly (here one 64x64 weight is 62 % of the model).
    ddp_bytes = model_state(params, "ddp", 2, 4, 4).optimizer_bytes
    if strategy in ("zero2", "fsdp"):
        assert plan.optimizer_bytes < 0.55 * ddp_bytes and plan.grad_bytes < 0.55 * held[0]["param_bytes"] * 2
    elif strategy == "zero1":
        assert plan.optimizer_bytes < 0.7 * ddp_bytes


def _epochs(path):
    return [(m["train_loss"], m["val_loss"], m["val_accuracy"]) for m in metrics(path)]


@pytest.mark.usefixtures("processes")
def test_fsdp_checkpoint_saved_on_two_ranks_resumes_on_one_and_back(tmp_path):
    common = DIGITS_MLP + ["--epochs", "2", "--batch-size", "64", "--no-save-model"]
    full = run(["train", *common, "--nproc", "2", "--strategy", "fsdp", "--run-dir", str(tmp_path / "full"),
                "--checkpoint-every", "30"], tmp_path)
    assert full.returncode == 0, full.stderr
    ckpt = tmp_path / "full" / "checkpoints" / "step-000000030"  # mid-way through epoch 2
    one = run(["train", *common, "--strategy", "single", "--run-dir", str(tmp_path / "one"), "--resume", str(ckpt)],
              tmp_path)
    assert one.returncode == 0, one.stderr
    assert f"resumed from {ckpt}" in one.stdout
    for a, b in zip(_epochs(tmp_path / "full"), _epochs(tmp_path / "one"), strict=True):
        assert a == pytest.approx(b, abs=1e-6)
    # Back: a single-device checkpoint resumed by 2 fsdp ranks.
    single = run(["train", *common, "--strategy", "single", "--run-dir", str(tmp_path / "single"),
                  "--checkpoint-every", "30"], tmp_path)
    assert single.returncode == 0, single.stderr
    two = run(["train", *common, "--nproc", "2", "--strategy", "fsdp", "--run-dir", str(tmp_path / "two"),
               "--resume", str(tmp_path / "single" / "checkpoints" / "step-000000030")], tmp_path)
    assert two.returncode == 0, two.stderr
    for a, b in zip(_epochs(tmp_path / "single"), _epochs(tmp_path / "two"), strict=True):
        assert a == pytest.approx(b, abs=1e-6)


@pytest.mark.usefixtures("processes")
def test_fsdp_with_checkpointed_blocks_and_bf16_trains_a_vit(tmp_path):
    result = run(["train", "--model", "vit", "--model-option", "dim=32", "--model-option", "depth=2",
                  "--model-option", "heads=2", "--data", "synthetic", "--shape", "3,8,8", "--num-samples", "256",
                  "--epochs", "1", "--batch-size", "32", "--nproc", "2", "--strategy", "fsdp",
                  "--activation-checkpointing", "--precision", "bf16-mixed", "--no-progress",
                  "--run-dir", str(tmp_path / "r")], tmp_path)
    assert result.returncode == 0, result.stderr
    [epoch] = metrics(tmp_path / "r")
    state = torch.load(tmp_path / "r" / "model.pt", weights_only=True)
    assert state["blocks.0.attn.qkv.weight"].shape == (96, 32)  # exported whole, not as a shard
    # The gathered weights, evaluated by one process, give the validation loss the two sharded
    # ranks reported: the shards, their gathering and the padded lockstep evaluation all agree.
    cfg = from_mapping(TrainConfig, json.loads((tmp_path / "r" / "config.json").read_text()))
    cfg.distributed.strategy, cfg.distributed.nproc, cfg.memory.activation_checkpointing = "single", 1, False
    with build_training(cfg) as built:
        built.trainer.model.load_state_dict(state)
        single = built.trainer.evaluate(built.dataset, split="val")
    assert single["loss"] == pytest.approx(epoch["val_loss"], rel=2e-3)
    assert single["accuracy"] == pytest.approx(epoch["val_accuracy"], abs=1 / len(built.dataset.val))


@pytest.mark.usefixtures("processes")
def test_batch_size_finders_cap_counts_the_replicas(tmp_path):
    # Two fsdp replicas each take a batch: 1,294 digits allow 647 per device, not 1,294.
    result = run(["find-batch-size", "--model", "mlp", "--data", "digits", "--nproc", "2", "--strategy", "fsdp",
                  "--memory-limit", "4GB", "--first-batch-size", "512", "--json", "--no-progress"], tmp_path)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout[result.stdout.index("{"):])
    assert found["replicas"] == 2 and found["max_batch_size"] == 1294 // 2
    assert found["limited_by"] == "the training set's 1294 samples over 2 replicas"
    assert [t["batch_size"] for t in found["trials"]] == [512, 647]


@pytest.mark.usefixtures("processes")
def test_batch_size_finder_takes_the_same_branch_on_every_rank(tmp_path):
    # Only rank 1 runs out of memory above 48 samples; the all-reduced flag makes rank 0 agree.
    result = run(["find-batch-size", "--model", "faulty_models:oom_mlp", "--model-option", "above=48",
                  "--model-option", "rank=1", "--data", "digits", "--nproc", "2", "--strategy", "ddp",
                  "--memory-limit", "1GB", "--first-batch-size", "8", "--max-batch-size", "256", "--json", "--no-progress"],
                 tmp_path)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout[result.stdout.index("{"):])
    assert found["max_batch_size"] == 48 and found["devices"] == 2
    failed = {t["batch_size"] for t in found["trials"] if not t["fits"]}
    assert {49, 64} <= failed and 48 not in failed


def test_cpu_offload_under_a_strategy_that_cannot_is_one_line():
    from scaletrain.errors import ConfigError
    for strategy in ("ddp", "zero1", "hsdp"):
        with pytest.raises(ConfigError, match="--cpu-offload needs --strategy fsdp or zero2"):
            from_mapping(TrainConfig, {"distributed": {"strategy": strategy, "fsdp": {"cpu_offload": True}}}).validate()
    from_mapping(TrainConfig, {"distributed": {"strategy": "zero2", "fsdp": {"cpu_offload": True}}}).validate()


@pytest.mark.usefixtures("processes")
def test_zero1_with_more_processes_than_tensors_is_one_line_before_launch(tmp_path):
    """ZeRO-1 owners get whole tensors: DIGITS_MLP has 4, so a 5th process would own none (its
    optimizer could not be built, and the job died as a peer's "Connection closed by peer")."""
    result = run(["train", *DIGITS_MLP, "--nproc", "5", "--batch-size", "125", "--strategy", "zero1",
                  "--run-dir", str(tmp_path / "r")],
                 tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        "scaletrain: error: --strategy zero1 gives each process whole tensors of the optimizer state, and the model "
        "has 4 trainable tensors for 5 processes; use at most 4 processes, or --strategy zero2 or fsdp (they shard "
        "inside each tensor)"]
    assert not (tmp_path / "r").exists()


def test_fsdp_under_bf16_keeps_batch_norm_in_float32_at_single_device_memory():
    """A 16-bit gather would hand batch norm bf16 weights beside its float32 running statistics,
    which batch_norm refuses (the GPU kit's rehearsal found fsdp + bf16-mixed failing on every
    model with batch norm). Batch norm is its own float32 unit taking the 16-bit activations as
    they come, as under plain autocast: the step trains, and holds what one device holds plus
    fsdp's own per-parameter buffers (a gathered 16-bit copy, an unsharded float32 gradient: 6
    bytes a parameter, 8 allowed). Casting batch norm's inputs to float32 had added 15 a parameter
    here (a float32 copy of every normalised activation)."""
    import torch.distributed as dist

    from scaletrain.config import DataConfig, ModelConfig
    from scaletrain.data import load_dataset
    from scaletrain.memory.batch_finder import BatchSizeFinder
    from scaletrain.models import build_model
    from scaletrain.training import Trainer

    data = DataConfig(name="synthetic", shape=[3, 16, 16], num_samples=64)
    dataset = load_dataset(data, seed=0)
    import os
    launcher_env = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    peaks = {}
    for strategy in ("single", "fsdp"):
        cfg = TrainConfig(model=ModelConfig(name="resnet"), data=data, epochs=1, batch_size=16, progress=False,
                          save_model=False)
        cfg.tracking.record, cfg.precision.policy, cfg.distributed.strategy = False, "bf16-mixed", strategy
        torch.manual_seed(0)
        trainer = Trainer(build_model("resnet", dataset.input_shape, dataset.num_classes), cfg)
        try:
            peaks[strategy], _ = BatchSizeFinder(trainer, dataset, steps=3, margin=0.0,
                                                 memory_limit=1 << 40).measure(16, 3)
            history = trainer.fit(dataset)
        finally:
            trainer.close()
            if dist.is_initialized():
                dist.destroy_process_group()
        assert math.isfinite(history[-1]["train_loss"])
    params = sum(p.numel() for p in build_model("resnet", dataset.input_shape, dataset.num_classes).parameters())
    assert peaks["fsdp"] - peaks["single"] <= 8 * params, (peaks, params)
    # The one-process group it made here left the environment as it was: a WORLD_SIZE=1 left behind
    # made later multi-host and SLURM tests in the same worker train alone.
    assert {k: os.environ.get(k) for k in launcher_env} == launcher_env


def test_sgd_over_sharded_parameters_is_one_line():
    """torch has no sharded fused SGD (aten._fused_sgd_ has no DTensor rule) and the unfused one reads
    its tensor LR back every step: fsdp with SGD (a flag's, or a LightningModule's) is refused in
    one line where the optimizer is built, not a NotImplementedError from inside the first step."""
    import torch.distributed as dist

    from scaletrain.config import ModelConfig
    from scaletrain.errors import ConfigError
    from scaletrain.training import Trainer

    cfg = TrainConfig(model=ModelConfig(name="mlp"), epochs=1, batch_size=16, progress=False, save_model=False)
    cfg.tracking.record, cfg.distributed.strategy, cfg.optim.optimizer = False, "fsdp", "sgd"
    import os
    launcher_env = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    try:
        with pytest.raises(ConfigError, match="SGD cannot update sharded .* use AdamW \\(--optimizer adamw"):
            Trainer(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)), cfg)
        # The trainer that refused tore down the process group it had set up, and its environment.
        assert not dist.is_initialized()
        assert {k: os.environ.get(k) for k in launcher_env} == launcher_env
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
