"""Fast by default (issue 64): what each precision sets, what `auto` chooses on which device, the
memory format and cuDNN search chosen from the device and the data, the thread count chosen from
the machine's load, each stated on the run's first lines and kept in its record; and the eager
step's cost against a hand loop's, counted in operations (BENCHMARKS.md has the timings)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from scaletrain.config import OptimConfig, PrecisionConfig, TrainConfig
from scaletrain.precision import get_policy
from scaletrain.precision.hardware import DeviceFacts, auto_precision, settle_precision
from scaletrain.training import threads
from scaletrain.training.counters import DeviceCounters
from scaletrain.training.defaults import (
    choose_channels_last,
    choose_cudnn_benchmark,
    fixed_batch_shapes,
    settle_precision_here,
)
from scaletrain.training.threads import AdaptiveThreads, CpuSample, choose_threads, others_busy, threads_for
from tests.conftest import small_config
from tests.helpers import fit, make_mlp

H200 = DeviceFacts("cuda", "NVIDIA H200", (9, 0))
A100 = DeviceFacts("cuda", "NVIDIA A100", (8, 0))
T4 = DeviceFacts("cuda", "Tesla T4", (7, 5))
CPU = DeviceFacts("cpu", "cpu", cpu_flags=frozenset({"avx2"}))
CUDA = torch.device("cuda")


# ------------------------------------------------------------------ precision
@pytest.fixture
def backend():
    """torch's process-wide float32 settings, put back as they were after the test."""
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             torch.get_float32_matmul_precision())
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])


@pytest.mark.parametrize("name, conv, matmul, matmul_precision", [
    ("fp32", True, False, "highest"),          # PyTorch's own defaults (and Lightning's 32-true)
    ("fp32-strict", False, False, "highest"),  # IEEE float32 everywhere
    ("tf32", True, True, "high"),
    ("bf16-mixed", True, True, "high"),        # its float32 islands may use TF32
])
def test_each_policy_sets_the_backend_flags_it_names(backend, name, conv, matmul, matmul_precision):
    torch.backends.cudnn.allow_tf32 = not conv
    torch.backends.cuda.matmul.allow_tf32 = not matmul
    policy = get_policy(name)
    policy.configure_backend()
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
            torch.get_float32_matmul_precision()) == (conv, matmul, matmul_precision)
    assert policy.backend_flags() == {"cudnn.allow_tf32": conv, "cuda.matmul.allow_tf32": matmul,
                                      "float32_matmul_precision": matmul_precision}


@pytest.mark.usefixtures("processes")
def test_fp32_is_what_pytorch_does_with_no_flags():
    """A fresh interpreter's torch.backends flags are exactly what `fp32` sets."""
    code = ("import json, torch; print(json.dumps([torch.backends.cudnn.allow_tf32, "
            "torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()]))")
    fresh = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                      check=True).stdout)
    flags = get_policy("fp32").backend_flags()
    assert fresh == [flags["cudnn.allow_tf32"], flags["cuda.matmul.allow_tf32"], flags["float32_matmul_precision"]]


@pytest.mark.parametrize("facts, chosen, because", [
    (H200, "bf16-mixed", "computes bfloat16 natively (compute capability 9.0)"),
    (A100, "bf16-mixed", "compute capability 8.0"),
    (T4, "fp32", "no native bfloat16"),
    (CPU, "fp32", "on a CPU the default is float32"),
])
def test_auto_precision_follows_the_hardware(facts, chosen, because):
    name, why = auto_precision(facts)
    assert name == chosen and because in why
    assert settle_precision("auto", facts) == (chosen, f"auto: {why}")
    assert settle_precision("fp16-mixed", facts) == ("fp16-mixed", None)   # a named policy keeps it


def test_auto_is_the_default_and_never_reaches_a_policy_lookup():
    assert TrainConfig().precision.policy == "auto"
    with pytest.raises(ValueError, match="settle it"):
        get_policy("auto")
    cfg = TrainConfig(device="cpu")
    assert settle_precision_here(cfg).value == "fp32" and cfg.precision.policy == "fp32"


def test_the_trainer_settles_auto_itself(tmp_path, digits):
    """The Python API: a config left at auto trains with the device's policy and says why."""
    cfg = small_config(tmp_path, epochs=1, precision=PrecisionConfig(policy="auto"))
    trainer = fit(cfg, digits)
    assert trainer.policy.name == "fp32" and trainer.config.precision.policy == "fp32"
    assert cfg.precision.policy == "auto"      # the caller's configuration stays as they wrote it
    precision = next(s for s in trainer.settings if s.name == "precision")
    assert precision.value == "fp32" and precision.why.startswith("auto:")


# -------------------------------------------------------------- memory format, cuDNN
def test_channels_last_follows_the_device_and_the_model():
    assert choose_channels_last(None, CUDA, convolutions_2d=True).value is True
    assert choose_channels_last(None, CUDA, convolutions_2d=False).value is False
    assert choose_channels_last(None, torch.device("cpu"), convolutions_2d=True).value is False
    given = choose_channels_last(False, CUDA, convolutions_2d=True)     # --no-channels-last wins
    assert given.value is False and given.why is None


def test_cudnn_benchmark_follows_the_device_and_the_batch_shapes(digits):
    assert choose_cudnn_benchmark(None, CUDA, fixed_shapes=True).value is True
    assert choose_cudnn_benchmark(None, CUDA, fixed_shapes=False).value is False
    assert choose_cudnn_benchmark(None, torch.device("cpu"), fixed_shapes=True).value is False
    assert choose_cudnn_benchmark(False, CUDA, fixed_shapes=True).value is False
    from scaletrain.data.user import TorchSplit
    assert fixed_batch_shapes(digits.train)
    assert fixed_batch_shapes(TorchSplit(list(range(4)), "train"))
    assert not fixed_batch_shapes(TorchSplit(list(range(4)), "train", collate_fn=lambda batch: batch))


def test_the_trainer_applies_the_memory_format_it_chose(tmp_path):
    from scaletrain.config import DataConfig, ModelConfig
    from scaletrain.data import load_dataset
    from scaletrain.models import build_model
    data_cfg = DataConfig(name="synthetic", shape=[3, 8, 8], num_samples=64)
    data = load_dataset(data_cfg)
    for given, expected in ((None, False), (True, True)):     # on the CPU auto is off; a flag is obeyed
        cfg = small_config(tmp_path, epochs=1, channels_last=given, model=ModelConfig(name="resnet"), data=data_cfg,
                           batch_size=16)
        trainer = fit(cfg, data, model=build_model("resnet", (3, 8, 8), 10))
        conv = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.Conv2d))
        assert conv.weight.is_contiguous(memory_format=torch.channels_last) is expected
        assert trainer.setting("channels_last") is expected
        assert trainer.setting("cudnn.benchmark") is False and torch.backends.cudnn.benchmark is False


# ---------------------------------------------------------------------- threads
def test_the_thread_count_is_the_cores_other_work_leaves():
    assert threads_for(2, 0.0) == 2
    assert threads_for(2, 0.4) == 2
    assert threads_for(2, 0.6) == 1          # one busy loop shares a core: that core is taken
    assert threads_for(2, 3.0) == 1          # never fewer than one
    assert threads_for(8, 2.5) == 6          # 5.5 left, rounded half up
    before, after = CpuSample(10.0, 100.0, 5.0), CpuSample(12.0, 103.0, 6.0)
    assert others_busy(before, after) == pytest.approx(1.0)   # 3 busy core-seconds, 1 of them ours, over 2 s


def test_a_thread_count_that_is_given_is_kept(monkeypatch):
    saved = torch.get_num_threads()
    try:
        assert choose_threads(1).setting.value == 1 and torch.get_num_threads() == 1
        assert not choose_threads(1).adaptive
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        choice = choose_threads(None)
        assert choice.setting.why == "OMP_NUM_THREADS=1" and not choice.adaptive
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert choose_threads(None, pinned=True).setting.why.startswith("--devices")
    finally:
        torch.set_num_threads(saved)


@pytest.mark.usefixtures("processes")
@pytest.mark.skipif(len(threads.usable_cores()) < 2, reason="one core: nothing to leave to another process")
def test_a_busy_core_is_left_to_the_process_that_keeps_it_busy(monkeypatch):
    """Real load: a busy loop per core but one beside this process. The choice leaves them their
    cores (whatever else the machine runs, never more than the one left)."""
    import os
    import signal
    import time
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = len(threads.usable_cores())
    # Another process's loops, not this one's children (a run's own children, its loader workers,
    # are its own work): started in the background of a shell that exits at once.
    started = subprocess.run(["sh", "-c", " ".join([f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & "
                                                    "echo $!;"] * (cores - 1))], capture_output=True, text=True)
    loops = [int(pid) for pid in started.stdout.split()]
    saved = torch.get_num_threads()
    try:
        monkeypatch.setattr(threads, "_START", None)      # measured now, over MIN_WINDOW_S
        time.sleep(0.5)                                    # the loops running
        choice = choose_threads(None)
        assert choice.adaptive and choice.setting.value == 1 == torch.get_num_threads()
        assert "busy with other work" in choice.setting.why
    finally:
        for pid in loops:
            os.kill(pid, signal.SIGKILL)
        torch.set_num_threads(saved)


def test_adaptive_threads_follow_the_load_epoch_by_epoch(monkeypatch):
    samples = iter([CpuSample(0.0, 0.0, 0.0), CpuSample(2.0, 4.0, 2.0),    # another process took a core
                    CpuSample(2.0, 4.0, 2.0), CpuSample(4.0, 6.0, 4.0)])   # then left it
    monkeypatch.setattr(threads, "sample_cpu", lambda cores=None: next(samples))
    monkeypatch.setattr(threads, "usable_cores", lambda: [0, 1])
    saved = torch.get_num_threads()
    try:
        adaptive, logs = AdaptiveThreads(2), {}
        adaptive.on_epoch_begin(None, 0)
        adaptive.on_epoch_end(None, 0, logs)
        assert logs["threads"] == 2 and adaptive.threads == 1 == torch.get_num_threads()
        adaptive.on_epoch_begin(None, 1)
        adaptive.on_epoch_end(None, 1, logs)
        assert logs["threads"] == 1 and adaptive.threads == 2 == torch.get_num_threads()
    finally:
        torch.set_num_threads(saved)


# ------------------------------------------------------------ stated and recorded
def test_a_run_states_and_records_what_it_chose(tmp_path, monkeypatch, capsys):
    """The CLI on the CPU: auto precision written into the saved config, the start line saying each
    choice and why, the store keeping them, `runs compare` showing them."""
    from scaletrain.cli.main import main
    from scaletrain.tracking import RunStore
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    saved = torch.get_num_threads()
    try:
        code = main(["train", "--model", "mlp", "--data", "digits", "--epochs", "1", "--no-progress", "--device", "cpu",
                     "--run-dir", "run", "--store", "runs.db", "--run-id", "r1"])
    finally:
        torch.set_num_threads(saved)
    assert code == 0
    out = capsys.readouterr().out
    settings = next(line for line in out.splitlines() if line.startswith("settings:"))
    assert "precision fp32 (auto: on a CPU" in settings
    assert "channels_last off (auto" in settings and "threads " in settings and "OpenMP wait" in settings
    assert "cudnn.benchmark off (auto: no cuDNN on a CPU)" in settings
    assert json.loads((tmp_path / "run" / "config.json").read_text())["precision"]["policy"] == "fp32"
    record = RunStore(tmp_path / "runs.db").get("r1")
    recorded = record.environment["settings"]
    assert recorded["precision"]["value"] == "fp32" and recorded["precision"]["chosen"].startswith("auto:")
    assert recorded["threads"]["chosen"].startswith("auto:") and recorded["cudnn.benchmark"]["value"] is False
    capsys.readouterr()
    assert main(["runs", "compare", "r1", "--store", "runs.db"]) == 0
    assert "threads" in capsys.readouterr().out

    # A named policy is kept and named as the user's (no "auto").
    assert main(["train", "--model", "mlp", "--data", "digits", "--epochs", "1", "--no-progress", "--device", "cpu",
                 "--run-dir", "run2", "--store", "runs.db", "--precision", "fp32-strict", "--threads", "1"]) == 0
    settings = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("settings:"))
    assert "precision fp32-strict;" in settings and "threads 1;" in settings


# ----------------------------------------------------------------- the step's cost
class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def test_the_eager_step_dispatches_what_a_hand_loop_does(tmp_path, digits):
    """The trainer's step against `loss.backward(); opt.step(); opt.zero_grad()` on the same model,
    batch and fused AdamW: the same operations but two detaches (the loss and the output it keeps
    for the training metric, scored over many steps at each read); before the host counted the
    steps, a step also ran an LR lookup and copy, a loss slot write, the metric's three kernels, two
    counter increments and a second optimizer group: 17 more."""
    cfg = small_config(tmp_path, epochs=1, optim=OptimConfig(optimizer="adamw", lr=1e-3, lr_schedule="cosine"))
    trainer = fit(cfg, digits)
    x, y = next(iter(trainer.loader(digits.train, train=True)))
    trainer.counters.reset_epoch()
    with _Ops() as ours:
        trainer.train_step(x, y)
    model = make_mlp(digits)
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3), fused=True)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)

    def hand():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        schedule.step()
        opt.zero_grad(set_to_none=True)
    hand()
    with _Ops() as theirs:
        hand()

    def aten(ops):   # the profiler's markers (optimizer.step and zero_grad record themselves) are not work
        return collections.Counter({k: v for k, v in ops.items() if not k.startswith("profiler.")})
    # (torch's scheduler does more than our LR fill: it computes the cosine on the LR tensor.)
    assert aten(ours.ops) - aten(theirs.ops) == collections.Counter({"aten.detach": 2})
    assert ours.ops["aten._fused_adamw_"] == theirs.ops["aten._fused_adamw_"] == 1


@pytest.mark.parametrize("accumulation", [1, 2])
def test_host_indexed_counters_equal_device_indexed(tmp_path, digits, accumulation):
    """The same run counted both ways: identical epoch losses, training metric and LR."""
    histories = []
    for host in (True, False):
        cfg = small_config(tmp_path, epochs=2, optim=OptimConfig(optimizer="adamw", lr=3e-3, lr_schedule="onecycle",
                                                                   grad_accum_steps=accumulation), log_every=5)
        from scaletrain.training import Trainer
        trainer = Trainer(make_mlp(digits), cfg)
        trainer.counters = DeviceCounters(trainer.device, host_indexed=host, defer_metrics=host)
        trainer.fit(digits)
        histories.append([{k: e[k] for k in ("train_loss", "train_accuracy", "lr", "optimizer_steps")}
                          for e in trainer.history])
    assert histories[0] == histories[1]


def test_gradient_compression_on_one_process_is_said_to_change_nothing(tmp_path, digits):
    """A configuration made for several processes runs on one unchanged, and says so (issue 66:
    --grad-compression powersgd on one process was accepted in silence)."""
    from scaletrain.config import DistributedConfig
    cfg = small_config(tmp_path, epochs=1, distributed=DistributedConfig(grad_compression="powersgd"))
    trainer = fit(cfg, digits)
    assert any("--grad-compression powersgd" in a and "one process" in a for a in trainer.advice)
    plain = fit(small_config(tmp_path, epochs=1), digits)
    assert not any("--grad-compression" in a for a in plain.advice)


class _SubnormalsOnEveryThread:
    """Callback: multiplies subnormal floats on the training's own threads (a parallel op, split
    over torch's OpenMP threads) as training begins; `flushed`: how many came out zero."""

    def __init__(self):
        self.flushed = self.total = None

    def on_train_begin(self, trainer):
        x = torch.full((4_000_000,), 1e-39)     # subnormal in float32 (below 1.18e-38)
        y = x * 1.0
        self.flushed, self.total = int((y == 0).sum()), y.numel()


@pytest.mark.parametrize("flush", [True, False])
def test_denormals_are_flushed_on_every_thread_the_trainer_computes_on(tmp_path, digits, flush):
    """torch.set_flush_denormal sets its calling thread only: on 2 threads half of such a product
    stayed subnormal. The run flushes them on every OpenMP thread too, unless told not to."""
    from scaletrain.training.build import build_training
    cfg = small_config(tmp_path, epochs=1, threads=2, flush_denormal=flush)
    probe = _SubnormalsOnEveryThread()
    with build_training(cfg, dataset=digits, callbacks=[probe]) as built:
        built.trainer.fit(digits)
        setting = next(s for s in built.trainer.settings if s.name == "denormals")
    assert probe.flushed == (probe.total if flush else 0)
    assert setting.value == ("flushed" if flush else "kept")
    from scaletrain.training.denormals import flush_denormals
    flush_denormals(False)      # PyTorch's own default again, for the tests after this one


def test_compiled_graphs_are_kept_in_the_users_cache_folder_unless_the_user_named_one(tmp_path, monkeypatch):
    from scaletrain.files import keep_compiled_artifacts
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    keep_compiled_artifacts()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "scaletrain" / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/theirs")
    keep_compiled_artifacts()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/theirs"


def test_a_cpu_run_keeps_freed_blocks_for_reuse_unless_the_environment_sets_malloc(monkeypatch):
    """glibc's thresholds fixed once per process (training/allocator.py); a user's own are kept."""
    from scaletrain.training import allocator
    monkeypatch.setattr(allocator, "_done", None)
    for name in allocator.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    setting = allocator.keep_freed_memory()
    if allocator._glibc() is None:
        assert setting.value == "as is"
    else:
        assert setting.value == "freed blocks kept for reuse" and "64 MiB" in setting.why
    monkeypatch.setattr(allocator, "_done", None)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert allocator.keep_freed_memory() == allocator.Setting("malloc", "as the environment sets it",
                                                              "MALLOC_MMAP_THRESHOLD_")
