"""Data parallelism with real processes: torchrun's elastic agent, gloo, DCP checkpoints on disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from scaletrain.models import build_model
from tests.processes import (
    DIGITS_MLP,
    PLUGINS,
    assert_a_raising_rank_ends_the_job,
    children,
    cli_env,
    committed_steps,
    free_port,
    kill_group,
    kill_slowed_run_after_checkpoint,
    metrics,
    outputs_of,
    run,
    start,
    summary,
    torchrun,
    wait_for,
)

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("processes")]


def _weights(path):
    return torch.load(path, weights_only=True)


def _same(a: dict, b: dict, atol: float = 0.0) -> bool:
    if atol == 0.0:
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=atol, rtol=0) for k in a)


LEAVE_RIGHT_AFTER_A_COLLECTIVE = """
import datetime, os, sys
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from scaletrain.distributed.strategies.process_group import destroy_process_group
rank, port = int(sys.argv[1]), int(sys.argv[2])
store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=datetime.timedelta(seconds=30))
for round in range(60):
    dist.init_process_group("gloo", store=dist.PrefixStore(f"round{round}", store), rank=rank, world_size=2)
    ddp = DistributedDataParallel(nn.Linear(2, 2))
    dist.broadcast_object_list([None if rank else "stop"], src=0)   # a pruning verdict
    destroy_process_group()
    del ddp   # DDP's reducer held the group's last reference: its destructor joins gloo's threads
print("left", round + 1, "groups")
"""


def test_leaving_the_group_right_after_a_collective_never_hangs():
    """Seen in the suite: a pruned `--nproc 2` trial's rank 1 hung at exit until SIGKILL (gloo's
    thread freeing the verdict's broadcast waited for the GIL, held by the main thread joining
    that thread). With a plain dist.destroy_process_group() this loop hangs within ~20 rounds."""
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, "-c", LEAVE_RIGHT_AFTER_A_COLLECTIVE, str(rank), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env())
             for rank in (0, 1)]
    outs = outputs_of(ranks, 60)
    assert [r.returncode for r in ranks] == [0, 0] and all("left 60 groups" in out for out in outs), outs


def test_two_ranks_with_batch_b_equal_one_rank_with_batch_2b(tmp_path):
    common = DIGITS_MLP + ["--epochs", "3", "--seed", "1"]
    one = run(["train", *common, "--batch-size", "64", "--run-dir", str(tmp_path / "one")], tmp_path)
    two = run(["train", *common, "--nproc", "2", "--per-replica-batch-size", "32", "--run-dir", str(tmp_path / "two")],
              tmp_path)
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    assert "global batch 64 = 2 replica(s) x 32" in two.stdout
    for a, b in zip(metrics(tmp_path / "one"), metrics(tmp_path / "two"), strict=True):
        for key in ("train_loss", "train_accuracy", "val_loss", "val_accuracy"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), key
    assert _same(_weights(tmp_path / "one" / "model.pt"), _weights(tmp_path / "two" / "model.pt"), atol=1e-5)
    # Only the chief printed, and the run folder holds exactly the chief's files.
    assert two.stdout.count("Run summary") == 1 and two.stdout.count("scaletrain: mlp") == 1
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == [".lock", "config.json", "metrics.jsonl", "model.pt",
                                                                     "run.json", "run_id", "summary.json"]
    s = summary(tmp_path / "two")
    assert (s["strategy"], s["world_size"], s["batch_size"], s["per_replica_batch_size"]) == ("ddp", 2, 64, 32)


def test_exported_model_loads_into_the_bare_model_without_a_process_group(tmp_path):
    result = run(["train", *DIGITS_MLP, "--epochs", "2", "--nproc", "2", "--lr-scaling", "linear", "--lr-schedule", "constant",
                  "--lr-scaling-warmup-epochs", "0.5", "--run-dir", str(tmp_path / "r")], tmp_path)
    assert result.returncode == 0, result.stderr
    # Linear LR scaling: 2 replicas double the LR once the warm-up is over.
    assert "lr: 0.003 x 2 (linear scaling for 2 replicas) = 0.006" in result.stdout
    assert [m["lr"] for m in metrics(tmp_path / "r")] == pytest.approx([0.006, 0.006])
    assert not torch.distributed.is_initialized()
    state = _weights(tmp_path / "r" / "model.pt")
    assert not any(k.startswith("module.") for k in state)
    model = build_model("mlp", (64,), 10, hidden=[64])
    model.load_state_dict(state, strict=True)


def test_replicas_stay_identical_and_sharded_eval_counts_every_sample_once(tmp_path):
    result = torchrun(2, [PLUGINS / "ddp_worker.py", tmp_path], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    r0, r1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert _same(r0["state"], r1["state"])
    assert r0["eval"] == r1["eval"]
    # The same weights evaluated in one process, on the whole test split (359 samples: odd, so
    # the two ranks' ranges differ in size and any padding would show).
    from scaletrain.config import DataConfig, TrainConfig
    from scaletrain.data import load_dataset
    from scaletrain.training import Trainer
    dataset = load_dataset(DataConfig(name="digits"))
    model = build_model("mlp", dataset.input_shape, dataset.num_classes, hidden=[64])
    model.load_state_dict(r0["state"])
    single = Trainer(model, TrainConfig(device="cpu", batch_size=64, progress=False)).evaluate(dataset)
    assert single["accuracy"] == r0["eval"]["accuracy"]
    assert single["loss"] == pytest.approx(r0["eval"]["loss"], rel=1e-6)


def _run_with_checkpoints(tmp_path, name, extra=(), nproc=2):
    args = ["train", *DIGITS_MLP, "--model-option", "dropout=0.1", "--epochs", "3", "--batch-size", "64",
            "--augment", "shift", "--shift", "1", "--checkpoint-every", "7", "--keep-checkpoints", "2",
            "--nproc", str(nproc), "--run-dir", str(tmp_path / name), *extra]
    return args


def test_devices_pin_each_process_to_its_core(tmp_path):
    """--devices on a CPU host: process i runs on core devices[i] alone, with one thread."""
    out, cores = tmp_path / "placed", sorted(os.sched_getaffinity(0))
    first, second = cores[1], cores[0]   # in the opposite order to the default's
    result = run(["train", "--model", "faulty_models:placement_mlp", "--model-option", f"out={out}", "--data", "digits",
                  "--no-progress", "--epochs", "1", "--nproc", "2", "--devices", f"{first},{second}"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    placed = [json.loads((tmp_path / f"placed.{rank}").read_text()) for rank in (0, 1)]
    assert placed == [{"cores": [first], "threads": 1}, {"cores": [second], "threads": 1}]
    for flags, message in ((["--devices", f"{first},{cores[-1] + 5}"], f"may use cores {cores[0]}-"),
                           (["--devices", "0,1"], "names 2 device(s) for --nproc 3"),
                           (["--devices", "1,1"], "names a device twice")):
        nproc = ["--nproc", "3"] if "--nproc 3" in message else ["--nproc", "2"]
        refused = run(["train", *DIGITS_MLP, "--epochs", "1", *nproc, *flags], tmp_path)
        assert refused.returncode == 2 and message in refused.stderr and "Traceback" not in refused.stderr


def test_powersgd_is_the_plain_all_reduce_in_its_warm_up_then_departs_boundedly(tmp_path):
    common = ["train", *DIGITS_MLP, "--epochs", "3", "--nproc", "2"]
    runs = {"plain": [], "warming": ["--grad-compression", "powersgd", "--powersgd-warmup", "1000"],
            "rank1": ["--grad-compression", "powersgd", "--powersgd-rank", "1", "--powersgd-warmup", "2"]}
    for name, flags in runs.items():
        result = run(common + flags + ["--run-dir", str(tmp_path / name)], tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
    plain, warming, rank1 = (metrics(tmp_path / name) for name in runs)
    # Within its warm-up the hook all-reduces whole buckets: the plain run's numbers.
    for a, b in zip(plain, warming, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)
    # Compressed to rank 1 from the third step, it changes the numbers and still learns.
    assert rank1[-1]["train_loss"] != pytest.approx(plain[-1]["train_loss"], rel=1e-3)
    assert rank1[-1]["train_loss"] < rank1[0]["train_loss"]
    assert rank1[-1]["val_accuracy"] == pytest.approx(plain[-1]["val_accuracy"], abs=0.1)


@pytest.mark.parametrize("saving", ["--async-save", "--no-async-save"])
def test_killed_run_resumed_equals_uninterrupted_run_bitwise(tmp_path, saving):
    full = run(_run_with_checkpoints(tmp_path, "full", [saving]), tmp_path)
    assert full.returncode == 0, full.stderr
    # The same run, slowed down, SIGKILLed (launcher and workers) once a mid-run checkpoint is committed.
    kill_slowed_run_after_checkpoint(_run_with_checkpoints(tmp_path, "cut", [saving]), tmp_path, tmp_path / "cut",
                                     step=21, delay_s=0.02)
    assert not (tmp_path / "cut" / "model.pt").exists()
    # A bare resume continues with the run's own model (the slow one: the same weights and
    # arithmetic) on the processes it recorded (the launcher takes --nproc out of its workers').
    resumed = run(["train", "--run-dir", str(tmp_path / "cut"), "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout and "ddp x 2" in resumed.stdout
    keys = ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr", "optimizer_steps")
    assert [[m[k] for k in keys] for m in metrics(tmp_path / "full")] == \
           [[m[k] for k in keys] for m in metrics(tmp_path / "cut")]
    assert _same(_weights(tmp_path / "full" / "model.pt"), _weights(tmp_path / "cut" / "model.pt"))
    # Keep the newest 2 complete checkpoints (the final state is one of them).
    assert len(committed_steps(tmp_path / "cut" / "checkpoints")) == 2


def test_sigkilled_worker_is_restarted_and_the_run_completes(tmp_path):
    run_dir = tmp_path / "r"
    args = ["train", *DIGITS_MLP, "--model", "faulty_models:slow_mlp", "--model-option", "delay_s=0.02",
            "--epochs", "3", "--batch-size", "32", "--nproc", "2", "--max-restarts", "1",
            "--checkpoint-every", "10", "--run-dir", str(run_dir)]
    proc = start(args, tmp_path, tmp_path / "log")
    try:
        wait_for(lambda: committed_steps(run_dir / "checkpoints"), 120, "a first checkpoint")
        workers = wait_for(lambda: children(proc.pid), 10, "the workers")
        os.kill(workers[-1], signal.SIGKILL)
        assert proc.wait(timeout=180) == 0, (tmp_path / "log").read_text()[-3000:]
    finally:
        kill_group(proc)
    s = summary(run_dir)
    assert s["restarts"] == 1 and s["resumed_from"] is not None
    assert s["epochs_run"] == 3 and len(metrics(run_dir)) == 3


def test_a_raising_rank_ends_the_whole_job_promptly(tmp_path):
    assert_a_raising_rank_ends_the_job(["train", *DIGITS_MLP, "--model", "faulty_models:raising_mlp", "--epochs", "50",
                                        "--nproc", "2", "--run-dir", str(tmp_path / "r")], tmp_path,
                                       "injected failure on rank 1", rank=1)


def test_a_hanging_rank_is_detected_by_the_collective_timeout(tmp_path):
    # (A hang left to the 600 s first-step timeout would outlast the guard's 240 s.)
    result = run(["train", *DIGITS_MLP, "--model", "faulty_models:hanging_mlp", "--epochs", "50",
                  "--nproc", "2", "--step-timeout-s", "3", "--run-dir", str(tmp_path / "r")], tmp_path, timeout=240)
    assert result.returncode != 0
    # The healthy rank gave up in its collective after exactly the step timeout (3 s, not the
    # 600 s first-step timeout), and the launcher named it; any other early crash fails here.
    assert "Timed out waiting 3000ms" in result.stderr, result.stderr[-2000:]
    assert "scaletrain: error: worker rank 0 failed" in result.stderr


def test_bf16_gradient_compression_trains_close_to_full_precision(tmp_path):
    common = ["train", *DIGITS_MLP, "--epochs", "2", "--nproc", "2"]
    plain = run(common + ["--run-dir", str(tmp_path / "plain")], tmp_path)
    packed = run(common + ["--grad-compression", "bf16", "--run-dir", str(tmp_path / "bf16")], tmp_path)
    assert plain.returncode == 0 and packed.returncode == 0, packed.stderr
    a, b = metrics(tmp_path / "plain")[-1], metrics(tmp_path / "bf16")[-1]
    assert a["train_loss"] != b["train_loss"]  # the hook really ran: bf16 rounding changes the numbers
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=0.05)
    assert b["val_accuracy"] == pytest.approx(a["val_accuracy"], abs=0.05)


@pytest.mark.parametrize("saving", ["--async-save", "--no-async-save"])
def test_kill_during_a_checkpoint_write_leaves_the_newest_complete_one_readable(tmp_path, saving):
    run_dir = tmp_path / "r"
    ckpts = run_dir / "checkpoints"
    args = ["train", *DIGITS_MLP, "--model-option", "hidden=[1024,1024]", "--epochs", "20", "--batch-size", "64",
            "--checkpoint-every", "1", "--keep-checkpoints", "2", "--run-dir", str(run_dir), saving]

    def caught_mid_write():
        done = committed_steps(ckpts)
        if not done:
            return None
        for folder in ckpts.glob("step-*"):
            if int(folder.name[5:]) > done[-1] and not (folder / "COMMITTED").exists() and any(folder.iterdir()):
                return folder
        return None

    proc = start(args, tmp_path, tmp_path / "log")
    try:
        partial = wait_for(caught_mid_write, 120, "a checkpoint folder being written", poll=0.001)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        kill_group(proc)
    assert not (partial / "COMMITTED").exists()
    newest = committed_steps(ckpts)[-1]
    assert newest < int(partial.name[5:])
    resumed = run(args + ["--resume", "auto", "--epochs", "1"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"step-{newest:09d}" in resumed.stdout


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_one_rank_ddp_equals_single_device_training(tmp_path, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    common = ["train", *DIGITS_MLP, "--epochs", "2", "--device", device]
    single = run(common + ["--strategy", "single", "--run-dir", str(tmp_path / "single")], tmp_path)
    ddp = run(common + ["--strategy", "ddp", "--run-dir", str(tmp_path / "ddp")], tmp_path)
    assert single.returncode == 0 and ddp.returncode == 0, ddp.stderr
    assert summary(tmp_path / "ddp")["strategy"] == "ddp"
    for a, b in zip(metrics(tmp_path / "single"), metrics(tmp_path / "ddp"), strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-6)
        assert a["val_accuracy"] == pytest.approx(b["val_accuracy"], abs=1e-6)


def test_sync_batchnorm_makes_two_ranks_equal_one_rank_with_a_batchnorm_model(tmp_path):
    # cnn1d has BatchNorm: without synchronised statistics 2 x 32 normalises over 32 samples and
    # drifts from 1 x 64; with them the two runs match.
    common = ["train", "--model", "cnn1d", "--model-option", "channels=16", "--data", "mnist1d", "--num-samples",
              "1200", "--epochs", "2", "--batch-size", "64", "--no-progress", "--lr", "0.003"]
    one = run(common + ["--run-dir", str(tmp_path / "one")], tmp_path)
    synced = run(common + ["--nproc", "2", "--sync-batchnorm", "--run-dir", str(tmp_path / "sync")], tmp_path)
    local = run(common + ["--nproc", "2", "--run-dir", str(tmp_path / "local")], tmp_path)
    assert one.returncode == 0 and synced.returncode == 0 and local.returncode == 0, synced.stderr
    a, b, c = (metrics(tmp_path / name) for name in ("one", "sync", "local"))
    for x, y in zip(a, b, strict=True):
        assert x["train_loss"] == pytest.approx(y["train_loss"], abs=1e-4)
        assert x["val_loss"] == pytest.approx(y["val_loss"], abs=1e-4)
    assert abs(a[-1]["train_loss"] - c[-1]["train_loss"]) > 1e-3  # the test can tell the difference
    w1, w2 = _weights(tmp_path / "one" / "model.pt"), _weights(tmp_path / "sync" / "model.pt")
    assert _same(w1, w2, atol=1e-3)  # the exported BatchNorm state loads into the plain model
    build_model("cnn1d", (1, 40), 10, channels=16).load_state_dict(w2)


def _epoch_figures(path):
    return [(m["train_loss"], m["train_accuracy"], m["val_loss"], m["val_accuracy"]) for m in metrics(path)]


def test_ddp_checkpoint_from_two_ranks_resumes_on_one_rank_mid_epoch(tmp_path):
    """A different world size: the replicated state loads as is, and rank 0 takes both saved
    ranks' loss and accuracy sums of the unfinished epoch, so the epoch's figures still count
    every sample once."""
    common = ["train", *DIGITS_MLP, "--epochs", "2", "--batch-size", "64", "--no-save-model", "--no-record"]
    full = run([*common, "--nproc", "2", "--strategy", "ddp", "--checkpoint-every", "30",
                "--run-dir", str(tmp_path / "two")], tmp_path)
    assert full.returncode == 0, full.stderr
    ckpt = tmp_path / "two" / "checkpoints" / "step-000000030"   # mid-way through epoch 2 (20 steps each)
    one = run([*common, "--strategy", "ddp", "--run-dir", str(tmp_path / "one"), "--resume", str(ckpt)], tmp_path)
    assert one.returncode == 0, one.stderr
    assert f"resumed from {ckpt}" in one.stdout
    for a, b in zip(_epoch_figures(tmp_path / "two"), _epoch_figures(tmp_path / "one"), strict=True):
        assert a == pytest.approx(b, abs=1e-6)


def test_resume_with_fused_steps_lands_on_the_same_step_and_result(tmp_path):
    """steps_per_execution 4 with a checkpoint every 10 steps: saves fall where an execution
    crossing a multiple of 10 ends (12, 20, 32, ...), and a resume from one equals the whole run."""
    common = ["train", *DIGITS_MLP, "--epochs", "2", "--batch-size", "64", "--no-record",
              "--steps-per-execution", "4", "--checkpoint-every", "10"]
    full = run([*common, "--run-dir", str(tmp_path / "full")], tmp_path)
    assert full.returncode == 0, full.stderr
    # 20 steps an epoch: saved at 12, 20, 32 and 40 (the final state); the newest 3 are kept.
    assert committed_steps(tmp_path / "full" / "checkpoints") == [20, 32, 40]
    mid = tmp_path / "full" / "checkpoints" / "step-000000032"
    resumed = run([*common, "--run-dir", str(tmp_path / "cut"), "--resume", str(mid)], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert _epoch_figures(tmp_path / "full") == _epoch_figures(tmp_path / "cut")
    assert _same(_weights(tmp_path / "full" / "model.pt"), _weights(tmp_path / "cut" / "model.pt"))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_compile_under_a_data_parallel_strategy_trains_like_eager(tmp_path, strategy):
    common = ["train", *DIGITS_MLP, "--epochs", "1", "--batch-size", "64", "--no-record", "--no-save-model",
              "--nproc", "2", "--strategy", strategy]
    eager = run([*common, "--run-dir", str(tmp_path / "eager")], tmp_path)
    compiled = run([*common, "--compile", "--run-dir", str(tmp_path / "compiled")], tmp_path, timeout=400)
    assert eager.returncode == 0 and compiled.returncode == 0, compiled.stderr
    assert summary(tmp_path / "compiled")["compile"] is True
    for a, b in zip(_epoch_figures(tmp_path / "eager"), _epoch_figures(tmp_path / "compiled"), strict=True):
        assert a == pytest.approx(b, abs=1e-4)
