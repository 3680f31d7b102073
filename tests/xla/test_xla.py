"""XLA devices through torch_xla, run for real on XLA on a CPU (`PJRT_DEVICE=CPU`): the path a TPU
user takes, up to the chip. `make test-xla` runs these in .venv-xla (scripts/setup-xla.sh); the
main environment has no torch_xla, so there they are skipped (its refusal of `--device xla` is
tested in tests/test_cli.py)."""

from __future__ import annotations

import importlib.util
import os

if importlib.util.find_spec("torch_xla"):     # (the main environment's workers keep their own)
    os.environ.setdefault("PJRT_DEVICE", "CPU")   # before torch_xla is imported

import pytest  # noqa: E402
import torch  # noqa: E402

# Each CLI run here compiles its graphs afresh: up to minutes a run on the 2-core CPU under load.
pytestmark = pytest.mark.timeout(1800)

torch_xla = pytest.importorskip("torch_xla")
import torch_xla.debug.metrics as met  # noqa: E402

# The XLA runtime first: autograd's engine sizes its device queues at the first backward, so a CPU
# training earlier in this process would leave the XLA device out (one process trains on one kind
# of device in a run; these tests train on both, to compare).
torch_xla.device()

from scaletrain.config import DataConfig, ModelConfig, OptimConfig, PrecisionConfig, TrainConfig  # noqa: E402
from scaletrain.data import load_dataset  # noqa: E402
from scaletrain.errors import ConfigError  # noqa: E402
from scaletrain.models import build_model  # noqa: E402
from scaletrain.training import Trainer  # noqa: E402
from tests.processes import committed_steps, metrics, run  # noqa: E402

# Sequences for the registry's 1-D convnet (the default recipe's model), and flat features for the MLP.
SEQUENCES = DataConfig(name="synthetic", shape=[1, 24], num_samples=384, num_classes=4)


def config(device: str, model: str = "cnn1d", **fields) -> TrainConfig:
    data = SEQUENCES if model == "cnn1d" else DataConfig(name="synthetic", shape=[24], num_samples=384, num_classes=4)
    cfg = TrainConfig(**{"model": ModelConfig(name=model), "data": data,
                         "optim": OptimConfig(optimizer="adamw", lr=3e-3), "precision": PrecisionConfig(policy="fp32"),
                         "epochs": 2, "batch_size": 32, "progress": False, "device": device, "save_model": False,
                         **fields})
    cfg.tracking.record = False
    return cfg


def users_model(input_shape, num_classes) -> torch.nn.Module:
    """A model of the user's own, as the Python API takes it: any nn.Module."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(input_shape[-1], 16), torch.nn.GELU(),
                               torch.nn.LayerNorm(16), torch.nn.Linear(16, num_classes))


def train(cfg: TrainConfig, users: bool = False) -> tuple[Trainer, list[dict]]:
    dataset = load_dataset(cfg.data, seed=cfg.seed)
    torch.manual_seed(cfg.seed)
    if users:
        model = users_model(dataset.input_shape, dataset.num_classes)
    else:
        model = build_model(cfg.model.name, dataset.input_shape, dataset.num_classes, **cfg.model.options)
    trainer = Trainer(model, cfg)
    return trainer, trainer.fit(dataset)


@pytest.mark.parametrize("model", ["cnn1d", "mlp", "users"])
def test_one_xla_device_trains_as_the_cpu_does(model):
    """The registry's models and a user's own nn.Module through the same Trainer, step and
    metrics: the same data order (drawn
    on the host), the same initial weights, the same training losses as the CPU's to float32
    rounding (XLA's convolution rounds differently from oneDNN's: 3e-6 apart after 24 steps).
    The labels are noise, so the validation loss of a model memorising them magnifies that
    rounding (1e-3 apart by the second epoch): it is held to 1e-2."""
    registered = "mlp" if model == "users" else model   # (the user's takes the MLP's data)
    _, on_cpu = train(config("cpu", model=registered), users=model == "users")
    trainer, on_xla = train(config("xla", model=registered), users=model == "users")
    assert trainer.device.type == "xla"
    for a, b in zip(on_cpu, on_xla, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=2e-5)
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-2)


def test_fused_steps_are_one_graph_per_execution_and_the_step_never_reads_back():
    """`--steps-per-execution 4` on an XLA device: four training steps trace into one graph, run
    once (one execution), compiled once (the next chunk reuses it), with nothing read back to the
    host inside the steps (no transfer from the device, no scalar read)."""
    trainer, _ = train(config("xla", epochs=1, steps_per_execution=4))
    dataset = load_dataset(SEQUENCES, seed=0)
    batches = iter(trainer.loader(dataset.train, train=True))
    chunk = [next(batches) for _ in range(4)]

    def counts():
        return {"executions": (met.metric_data("ExecuteTime") or (0,))[0],
                "compiles": (met.metric_data("CompileTime") or (0,))[0],
                "reads": (met.metric_data("TransferFromDeviceTime") or (0,))[0],
                "scalars": met.counter_value("aten::_local_scalar_dense") or 0}

    from scaletrain.accelerators import xla
    trainer.end_execution()   # what fit() left pending, in a graph of its own
    for x, y in chunk:        # the first chunk may compile
        trainer.train_step(x, y)
    trainer.end_execution()
    xla.wait()                # a graph runs asynchronously: its execution is counted when it ends
    before = counts()
    for x, y in chunk:
        trainer.train_step(x, y)
    during = counts()
    trainer.end_execution()
    xla.wait()
    after = counts()
    assert during == before, "a training step ran or read something back before the chunk's end"
    assert after["executions"] - before["executions"] == 1     # the four steps: one graph, run once
    assert after["compiles"] == before["compiles"]             # ...compiled once, for every chunk
    assert (after["reads"], after["scalars"]) == (before["reads"], before["scalars"])


def test_bf16_mixed_runs_through_xla_autocast():
    trainer, history = train(config("xla", precision=PrecisionConfig(policy="bf16-mixed"), epochs=3))
    x, _ = next(iter(trainer.loader(load_dataset(SEQUENCES, seed=0).train, train=True)))
    with torch.no_grad(), trainer.policy.autocast(trainer.device):
        assert trainer.eval_forward(x).dtype == torch.bfloat16
    assert history[-1]["train_loss"] < history[0]["train_loss"]


@pytest.mark.parametrize(("fields", "message"), [
    ({"distributed": {"strategy": "ddp"}}, "--strategy ddp does not run on XLA devices; use --strategy single"),
    ({"precision": PrecisionConfig(policy="fp16-mixed")}, "use --precision bf16-mixed"),
    ({"compile": True}, "XLA compiles every step's graph already; drop --compile"),
    ({"optim": OptimConfig(optimizer="sgd")}, "--optimizer sgd on an XLA device"),
])
def test_what_an_xla_device_cannot_run_is_one_line_before_it_opens(fields, message):
    cfg = config("xla")
    for name, value in fields.items():
        if name == "distributed":
            cfg.distributed.strategy = value["strategy"]
        else:
            setattr(cfg, name, value)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Trainer(build_model("cnn1d", (1, 24), 4), cfg)


CLI = ["train", "--device", "xla", "--model", "cnn1d", "--data", "synthetic", "--shape", "1,24", "--num-classes", "4",
       "--num-samples", "384", "--batch-size", "32", "--optimizer", "adamw", "--no-progress", "--no-record"]


@pytest.mark.usefixtures("processes")
def test_a_run_resumed_mid_epoch_on_an_xla_device_equals_the_whole_run(tmp_path):
    common = [*CLI, "--epochs", "3", "--precision", "bf16-mixed", "--checkpoint-every", "7"]
    full = run([*common, "--run-dir", tmp_path / "full"], tmp_path, timeout=900, PJRT_DEVICE="CPU")
    assert full.returncode == 0, full.stderr[-3000:]
    assert "on xla:0 (XLA on a CPU, 1 device(s); not a TPU)" in full.stdout   # the start line says what ran
    steps = committed_steps(tmp_path / "full" / "checkpoints")
    mid = tmp_path / "full" / "checkpoints" / f"step-{steps[0]:09d}"
    resumed = run([*common, "--run-dir", tmp_path / "cut", "--resume", mid], tmp_path, timeout=900, PJRT_DEVICE="CPU")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    keys = ("train_loss", "val_loss", "val_accuracy", "lr")
    assert [[m[k] for k in keys] for m in metrics(tmp_path / "full")] == \
        [[m[k] for k in keys] for m in metrics(tmp_path / "cut")]


@pytest.mark.usefixtures("processes")
def test_spmd_over_four_xla_devices_equals_one_device_with_the_whole_batch(tmp_path):
    """--strategy spmd: the batch sharded over 4 XLA devices (a 1-D mesh), parameters replicated;
    XLA's partitioner adds the gradients' all-reduce. The figures are one device's on the global
    batch, to float32 rounding."""
    spmd = run([*CLI, "--epochs", "2", "--strategy", "spmd", "--run-dir", tmp_path / "spmd"], tmp_path, timeout=900,
               PJRT_DEVICE="CPU", CPU_NUM_DEVICES="4")
    assert spmd.returncode == 0, spmd.stderr[-3000:]
    assert "(XLA on a CPU, 4 device(s); not a TPU)" in spmd.stdout and "spmd over 4 XLA device(s)" in spmd.stdout
    one = run([*CLI, "--epochs", "2", "--run-dir", tmp_path / "one"], tmp_path, timeout=900, PJRT_DEVICE="CPU",
              CPU_NUM_DEVICES="1")
    assert one.returncode == 0, one.stderr[-3000:]
    for a, b in zip(metrics(tmp_path / "one"), metrics(tmp_path / "spmd"), strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=2e-5)
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-2)   # noise labels: see above
    refused = run([*CLI, "--strategy", "spmd", "--batch-size", "30", "--run-dir", tmp_path / "odd"], tmp_path,
                  timeout=900, PJRT_DEVICE="CPU", CPU_NUM_DEVICES="4")
    assert refused.returncode == 2 and "does not split over the 4 XLA devices" in refused.stderr, refused.stderr[-2000:]
