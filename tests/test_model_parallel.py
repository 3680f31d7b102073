"""Model parallelism with real torchrun processes over gloo: every pipeline schedule, tensor
parallelism and their compositions with data parallelism train exactly like one device; pipeline
checkpoints reshard to one device and back; the exported model is the plain full model; bad
layouts get one line; a raising stage ends the job."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from scaletrain.config import TrainConfig
from scaletrain.distributed.partition import balanced_starts, stage_layers
from scaletrain.errors import ConfigError
from scaletrain.models import build_model
from scaletrain.options import from_mapping
from tests.processes import (
    PLUGINS,
    assert_a_raising_rank_ends_the_job,
    metrics,
    python,
    run,
    run_here,
    torchrun,
)

pytestmark = pytest.mark.timeout(300)

WORKER = str(PLUGINS / "model_parallel_worker.py")
# name: (processes, distributed settings)
LAYOUTS = {
    "gpipe": (2, {"strategy": "pipeline", "stages": 2, "schedule": "gpipe", "microbatches": 4}),
    "1f1b": (2, {"strategy": "pipeline", "stages": 2, "schedule": "1f1b", "microbatches": 4}),
    "interleaved-1f1b": (2, {"strategy": "pipeline", "stages": 2, "schedule": "interleaved-1f1b", "microbatches": 4}),
    "tensor": (2, {"strategy": "tensor", "tensor_parallel": 2}),
    "pipeline x data": (4, {"strategy": "pipeline", "stages": 2, "schedule": "1f1b", "microbatches": 2}),
    "tensor x data": (4, {"strategy": "tensor", "tensor_parallel": 2}),
    "pipeline x tensor": (4, {"strategy": "pipeline", "stages": 2, "tensor_parallel": 2, "microbatches": 4}),
}


def _results(folder, n):
    parts = [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(n)]
    grads = {}
    for part in parts:   # each stage has its own parameters' gradients (replicas agree)
        grads.update(part["grads"])
    return {**parts[0], "grads": grads}


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    folder = tmp_path_factory.mktemp("single")
    result = python([WORKER, "{}", folder], folder)
    assert result.returncode == 0, result.stderr[-3000:]
    return _results(folder, 1)


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_model_parallel_training_equals_one_device(single, tmp_path, layout):
    n, settings = LAYOUTS[layout]
    result = torchrun(n, [WORKER, json.dumps(settings), tmp_path], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    got = _results(tmp_path, n)
    # Per-step losses of the last epoch (a schedule averages its micro-batch losses: the same mean).
    assert got["losses"] == pytest.approx(single["losses"], abs=1e-5)
    for a, b in zip(single["history"], got["history"], strict=True):
        for key in ("train_loss", "train_accuracy", "val_loss", "val_perplexity", "val_accuracy"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), key
    assert single["weights"].keys() == got["weights"].keys()   # rank 0 exports the whole model
    for name, value in single["weights"].items():
        assert torch.allclose(value, got["weights"][name], atol=1e-5), name
    assert single["grads"].keys() == got["grads"].keys()
    for name, value in single["grads"].items():
        assert torch.allclose(value, got["grads"][name], atol=1e-5), name


# A WideResNet and a ViT as pipelines (seed 002's towers on two devices): cut by their layers'
# measured costs, equal to one device. The WideResNet's BatchNorm normalises each micro-batch by its
# own statistics, so its one-device reference accumulates the same 4 micro-batches. Both train with
# SGD: some of their parameters have a gradient that is rounding noise only (a convolution's bias
# before a BatchNorm; attention's key bias, which the softmax cancels), and AdamW scales noise to
# full steps, so two orders of summation would move those weights apart; SGD keeps the steps tiny.
# The WideResNet's reference runs the pipeline's very micro-batches in its order, so the two agree
# bitwise (tolerance 0): any rounding of its own, such as a clip factor computed another way,
# shows. (A float32 norm of norms made exactly that drift, past 1e-5 on AVX2 CPUs only.) The ViT's
# reference takes the whole batch at once: its sums are ordered otherwise, equal within 1e-5.
SEQUENCES = {
    "wrn": ({"model": "wrn", "options": {"depth": 10, "width": 2, "dropout": 0.0}, "data": "digits",
             "optimizer": "sgd", "lr": 0.05}, {"grad_accum_steps": 4}, 0.0),
    "vit": ({"model": "vit", "options": {"dim": 32, "depth": 3, "heads": 4, "patch_size": 4}, "data": "digits",
             "optimizer": "sgd", "lr": 0.05}, {}, 1e-5),
}


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("name", SEQUENCES)
def test_a_sequence_of_blocks_is_staged_by_cost_and_trains_like_one_device(tmp_path, name):
    model, reference, tol = SEQUENCES[name]
    settings = {"strategy": "pipeline", "stages": 2, "schedule": "1f1b", "microbatches": 4}
    one = python([WORKER, "{}", tmp_path, json.dumps({**model, **reference})], tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    single = _results(tmp_path, 1)
    (tmp_path / "rank0.pt").unlink()
    piped = torchrun(2, [WORKER, json.dumps(settings), tmp_path, json.dumps(model)], tmp_path)
    assert piped.returncode == 0, piped.stderr[-3000:]
    got = _results(tmp_path, 2)
    assert "% of FLOPs" in got["layout"]    # cut by the measured costs
    assert got["losses"] == pytest.approx(single["losses"], abs=tol, rel=0)
    for a, b in zip(single["history"], got["history"], strict=True):
        for key in ("train_loss", "train_accuracy", "val_loss", "val_accuracy"):
            assert a[key] == pytest.approx(b[key], abs=tol, rel=0), key
    assert single["weights"].keys() == got["weights"].keys()
    for key, value in single["weights"].items():
        assert torch.allclose(value.float(), got["weights"][key].float(), atol=tol, rtol=0), key
    for key, value in single["grads"].items():
        assert torch.allclose(value, got["grads"][key], atol=tol, rtol=0), key


# ------------------------------------------------------------------ cutting the model into stages
def test_balanced_starts_minimise_the_largest_stage():
    assert balanced_starts([1, 1, 1, 10], 2) == [0, 3]
    assert balanced_starts([5, 5, 5, 5], 2) == [0, 2]
    assert balanced_starts([3, 1, 1, 1, 3], 3) == [0, 1, 4]
    with pytest.raises(ValueError):
        balanced_starts([1, 2], 3)


def test_gpt_is_cut_on_its_blocks_or_where_the_user_says():
    model = build_model("gpt", (16,), 50, dim=32, depth=4, heads=4)
    stages = stage_layers(model, 2)
    assert [name for name, _ in stages[0]][0] == "embed" and [name for name, _ in stages[1]][-1] == "head"
    assert sum(len(s) for s in stages) == 6
    sizes = [sum(p.numel() for _, m in s for p in m.parameters()) for s in stages]
    assert max(sizes) < 0.6 * sum(sizes)
    named = stage_layers(model, 3, ["blocks.1", "blocks.3"])
    assert [[n for n, _ in s] for s in named] == [["embed", "blocks.0"], ["blocks.1", "blocks.2"], ["blocks.3", "head"]]
    with pytest.raises(ConfigError, match="no layer named blocks.9; the layers are: embed, blocks.0"):
        stage_layers(model, 2, ["blocks.9"])
    with pytest.raises(ConfigError, match="in forward order"):
        stage_layers(model, 3, ["blocks.3", "blocks.1"])
    with pytest.raises(ConfigError, match="cannot be cut into 7 pipeline stages"):
        stage_layers(model, 7)


def test_a_model_is_cut_by_its_layers_flops_not_their_parameters():
    """A WideResNet's early blocks hold few parameters and do much of the work: cut by parameter
    count, the first stage would take nearly all the FLOPs."""
    from scaletrain.models.layer_costs import meta_layer_costs
    from scaletrain.tasks import TASKS
    costs = meta_layer_costs(lambda: build_model("wrn-16-4", (1, 28, 28), 10), (1, 28, 28), 10,
                             TASKS["classification"](), 16)
    with torch.device("meta"):
        model = build_model("wrn-16-4", (1, 28, 28), 10)
    flops = {c.name: c.flops for c in costs}

    def flop_shares(stages):
        return [sum(flops[n] for n, _ in s) / sum(flops.values()) for s in stages]
    by_cost, by_params = flop_shares(stage_layers(model, 2, costs=costs)), flop_shares(stage_layers(model, 2))
    assert max(by_cost) < 0.6 < max(by_params)
    # The layer costs are what torch counts: a 3x3 convolution is 2 * Cin * Cout * 9 FLOPs a pixel.
    stem = next(c for c in costs if c.name == "features.0")
    assert stem.flops == 2 * 1 * 16 * 9 * 28 * 28 * 16
    assert stem.state_bytes == 4 * 4 * sum(p.numel() for p in model.features[0].parameters())
    assert stem.held_bytes > 16 * 16 * 28 * 28 * 4      # it keeps its input and activations for the backward


@pytest.mark.usefixtures("processes")
def test_the_planner_and_the_training_cut_alike(tmp_path):
    result = run_here(["plan-memory", "--model", "wrn-10-2", "--data", "digits", "--strategy", "pipeline",
                       "--stages", "2", "--microbatches", "4", "--batch-size", "64", "--json"], tmp_path)
    assert result.returncode == 0, result.stderr
    planned = [stage["layers"] for stage in json.loads(result.stdout)]
    trained = run(["train", "--model", "wrn-10-2", "--data", "digits", "--epochs", "1", "--train-subset", "128",
                   "--batch-size", "64", "--no-progress", "--no-record", "--run-dir", str(tmp_path / "run"),
                   *PIPELINE], tmp_path)
    assert trained.returncode == 0, trained.stderr
    layout = next(line for line in trained.stdout.splitlines() if line.startswith("layout:"))
    assert planned == ["features.0..features.2", "features.3..head.2"]
    assert all(f"{span} (" in layout for span in planned)


def test_a_model_that_is_not_a_sequence_of_layers_is_a_clear_error():
    plain = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    assert [[n for n, _ in s] for s in stage_layers(plain, 2, ["2"])] == [["0", "1"], ["2"]]
    with pytest.raises(ConfigError, match="MLP cannot be cut into pipeline stages: it is not a sequence of layers"):
        stage_layers(build_model("mlp", (8,), 2), 2)


def test_a_batch_that_does_not_split_into_the_micro_batches_is_refused_with_the_config():
    """Found with the configuration, before any process or run folder exists (it was found by the
    first step, inside a started run)."""
    cfg = {"batch_size": 128, "distributed": {"strategy": "pipeline", "stages": 3, "microbatches": 6}}
    with pytest.raises(ConfigError, match="--batch-size 128 does not split into 6 equal micro-batches; use a "
                                          "multiple of 6, or --microbatches that divides 128"):
        from_mapping(TrainConfig, cfg).validate()
    from_mapping(TrainConfig, {**cfg, "batch_size": 96}).validate()


@pytest.mark.parametrize("settings, message", [
    ({"strategy": "pipeline", "stages": 4, "microbatches": 2},
     "--microbatches 2 is fewer than --stages 4: stages would idle and 1F1B cannot fill the pipeline; use "
     "--microbatches 4 or more"),
    ({"strategy": "pipeline", "stages": 1}, "--strategy pipeline needs --stages 2 or more"),
    ({"strategy": "ddp", "stages": 2}, "--stages needs --strategy pipeline"),
    ({"strategy": "ddp", "split_points": ["blocks.1"]}, "--split-points needs --strategy pipeline"),
    ({"strategy": "ddp", "tensor_parallel": 2}, "--tensor-parallel needs --strategy tensor"),
    ({"strategy": "pipeline", "stages": 2, "split_points": ["blocks.1", "blocks.2"]},
     "--split-points names 2 layer(s); 2 pipeline stages need 1"),
])
def test_inconsistent_model_parallel_settings_are_one_line(settings, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_mapping(TrainConfig, {"distributed": settings}).validate()


# ------------------------------------------------------------------------------- through the CLI
GPT = ["--model", "gpt", "--model-option", "dim=32", "--model-option", "depth=4", "--model-option", "heads=4",
       "--data", "char-corpus", "--seq-len", "16", "--train-subset", "256", "--batch-size", "32", "--lr", "0.003",
       "--no-progress", "--no-record"]
PIPELINE = ["--nproc", "2", "--strategy", "pipeline", "--stages", "2", "--microbatches", "4"]


def _epochs(path):
    return [(m["train_loss"], m["val_loss"]) for m in metrics(path)]


@pytest.mark.usefixtures("processes")
def test_pipeline_checkpoint_reshards_to_one_device_and_back_and_exports_the_full_model(tmp_path):
    common = [*GPT, "--epochs", "2", "--checkpoint-every", "12"]   # 8 steps per epoch: 12 is mid-epoch 2
    piped = run(["train", *common, *PIPELINE, "--run-dir", str(tmp_path / "piped")], tmp_path)
    assert piped.returncode == 0, piped.stderr[-3000:]
    assert "layout: 1 replica(s) x 2 stage(s) x 1 tensor-parallel, 1f1b over 4 micro-batches; stage 0: " \
           "embed..blocks.1" in piped.stdout
    # The exported model.pt is the plain full model.
    state = torch.load(tmp_path / "piped" / "model.pt")
    build_model("gpt", (16,), 103, dim=32, depth=4, heads=4).load_state_dict(state)
    single = run(["train", *common, "--run-dir", str(tmp_path / "single")], tmp_path)
    assert single.returncode == 0, single.stderr[-3000:]
    # A pipeline's mid-epoch checkpoint resumed on one device, and one device's by a pipeline.
    for name, checkpoint, layout in (("one", "piped", []), ("back", "single", PIPELINE)):
        ckpt = tmp_path / checkpoint / "checkpoints" / "step-000000012"
        resumed = run(["train", *common, *layout, "--run-dir", str(tmp_path / name), "--resume", str(ckpt)], tmp_path)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"resumed from {ckpt}" in resumed.stdout
    for name in ("single", "one", "back"):
        for a, b in zip(_epochs(tmp_path / "piped"), _epochs(tmp_path / name), strict=True):
            assert a == pytest.approx(b, abs=1e-5), name


@pytest.mark.usefixtures("processes")
def test_fewer_microbatches_than_stages_fails_before_any_process_starts(tmp_path):
    result = run(["train", *GPT, "--nproc", "2", "--strategy", "pipeline", "--stages", "2", "--microbatches", "1",
                  "--run-dir", str(tmp_path / "r")], tmp_path, timeout=60)
    assert result.returncode == 2
    assert "--microbatches 1 is fewer than --stages 2" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.usefixtures("processes")
def test_a_raising_stage_ends_the_whole_job_promptly(tmp_path):
    assert_a_raising_rank_ends_the_job(["train", *GPT, *PIPELINE, "--model", "faulty_models:raising_gpt", "--epochs",
                                        "50", "--run-dir", str(tmp_path / "r")], tmp_path,
                                       "injected failure in the last block on rank 1", rank=1)


@pytest.mark.usefixtures("processes")
def test_scaling_predicts_a_pipeline_from_one_device(tmp_path):
    result = run(["scaling", *GPT, "--strategy", "pipeline", "--stages", "2", "--step-time-ms", "100", "--json"],
                 tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    points = json.loads(result.stdout)
    # A cut of the gpt sends the residual stream: batch 32 x 16 tokens x 32 features x 4 bytes.
    assert {p["boundary_bytes"] for p in points} == {32 * 16 * 32 * 4}
    assert [p["microbatches"] for p in points] == [2, 4, 8, 16]
    for p in points:
        m = p["microbatches"]
        assert p["bubble_fraction"] == pytest.approx(1 / (m + 1))
        assert p["compute_s"] == pytest.approx(0.05)
        assert p["step_time_s"] == pytest.approx(0.05 * (m + 1) / m + p["transfer_s"])
        assert p["transfer_s"] > 0            # (its size is the probed link's: the machine's, not this claim)


@pytest.mark.usefixtures("processes")
def test_plan_memory_lays_out_each_stage(tmp_path):
    from scaletrain.memory.pipeline_plan import plan_pipeline
    from scaletrain.memory.planner import PlanRequest
    req = PlanRequest(model="gpt", model_options={"dim": 32, "depth": 4, "heads": 4}, input_shape=(16,),
                      num_classes=103, task="language-model", batch_size=64, devices=2)
    gpipe, one_f = plan_pipeline(req, 2, 8, "gpipe"), plan_pipeline(req, 2, 8, "1f1b")
    whole = build_model("gpt", (16,), 103, dim=32, depth=4, heads=4)
    assert sum(s.params for s in gpipe) == sum(p.numel() for p in whole.parameters())
    assert [s.in_flight for s in gpipe] == [8, 8] and [s.in_flight for s in one_f] == [2, 1]
    # 1F1B's last stage holds one micro-batch where GPipe holds all eight (plus one's backward peak).
    assert one_f[1].activation_bytes == gpipe[1].activation_bytes - 7 * gpipe[1].held_bytes
    assert one_f[1].activation_bytes < gpipe[1].activation_bytes / 4
    assert one_f[0].activation_bytes < gpipe[0].activation_bytes / 3
    # Through the CLI, as JSON; interleaving is not planned (one line).
    cli = run(["plan-memory", *GPT, "--batch-size", "64", "--strategy", "pipeline", "--stages", "2",
               "--microbatches", "8", "--json"], tmp_path, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert [s["in_flight"] for s in json.loads(cli.stdout)] == [2, 1]
    bad = run_here(["plan-memory", *GPT, "--strategy", "pipeline", "--stages", "2", "--schedule", "interleaved-1f1b"],
                   tmp_path)
    assert bad.returncode == 2 and "plan-memory lays out the gpipe and 1f1b schedules" in bad.stderr
