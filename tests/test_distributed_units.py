"""Units of the distributed layer that need no second process: cluster spec, batch plan, LR
scaling, sharding arithmetic, the checkpoint store's publishing rules, resume in one process."""

from __future__ import annotations

import json
import sys
from itertools import pairwise

import pytest
import torch

from scaletrain.checkpoint import Checkpointer, CheckpointStore
from scaletrain.cli.main import main
from scaletrain.data.sharding import eval_range, rank_positions
from scaletrain.distributed.batching import divide_batch
from scaletrain.distributed.cluster import parse_cluster_spec
from scaletrain.distributed.env import dist_env
from scaletrain.distributed.launch import strip_launcher_flags, torchrun_arguments
from scaletrain.errors import ConfigError
from scaletrain.models import build_model
from scaletrain.optim.schedules import LRSchedule
from tests.conftest import small_config
from tests.helpers import fit


def _spec(cluster, task):
    return json.dumps({"cluster": cluster, "task": task})


def test_cluster_spec_maps_to_rank_world_size_and_rendezvous():
    spec = parse_cluster_spec(_spec({"chief": ["a:1000"], "worker": ["b:1001", "c:1002"]},
                                    {"type": "worker", "index": 1}))
    assert (spec.rank, spec.world_size, spec.master_addr, spec.master_port) == (2, 3, "a", 1000)
    env = {"SCALETRAIN_CLUSTER": _spec({"worker": ["h0:29500", "h1:29500"]}, {"type": "worker", "index": 1})}
    d = dist_env(env)
    assert (d.rank, d.world_size, env["MASTER_ADDR"], env["MASTER_PORT"]) == (1, 2, "h0", "29500")


@pytest.mark.parametrize("text, message", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    (json.dumps({"task": {"type": "worker", "index": 0}}), "has no 'cluster' object"),
    (json.dumps({"cluster": {"worker": ["a:1"]}}), "has no 'task' object"),
    (_spec({"worker": ["a:1"]}, {"type": "worker"}), "has no task.index"),
    (_spec({"worker": ["a:1"]}, {"index": 0}), "has no task.type"),
    (_spec({"worker": ["a:1", "b:1"]}, {"type": "worker", "index": 2}), "task.index 2 out of range"),
    (_spec({"worker": ["a:1"]}, {"type": "worker", "index": "0"}), "is not an integer"),
    (_spec({"worker": ["a:1"]}, {"type": "chief", "index": 0}), "task.type 'chief' that is not"),
    (_spec({"worker": ["a:1"], "bogus": ["p:2"]}, {"type": "worker", "index": 0}), "task type(s) ['bogus']"),
    (_spec({"ps": ["p:2"]}, {"type": "ps", "index": 0}), "lists only ps tasks"),
    (_spec({"worker": ["a:1"], "ps": ["p:2"]}, {"type": "ps", "index": 1}), "cluster.ps has 1 task(s)"),
    (_spec({"worker": ["nohost"]}, {"type": "worker", "index": 0}), "'nohost' that is not host:port"),
    (_spec({"worker": []}, {"type": "worker", "index": 0}), "lists no tasks"),
])
def test_bad_cluster_specs_name_the_problem(text, message):
    with pytest.raises(ConfigError, match=None) as info:
        parse_cluster_spec(text)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_bad_cluster_spec_through_the_cli_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SCALETRAIN_CLUSTER", "{oops")
    code = main(["train", "--model", "mlp", "--data", "digits", "--epochs", "1", "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "SCALETRAIN_CLUSTER is not valid JSON" in err and err.count("\n") == 1


def test_cluster_spec_turns_nproc_into_a_multi_host_torchrun(monkeypatch):
    monkeypatch.setenv("SCALETRAIN_CLUSTER", _spec({"worker": ["h0:29400", "h1:29400"]}, {"type": "worker", "index": 1}))
    args = torchrun_arguments(4, 2, ["--epochs", "3", "--nproc", "4", "--max-restarts=2"])
    assert args[args.index("--nnodes") + 1] == "2" and args[args.index("--node-rank") + 1] == "1"
    assert args[args.index("--rdzv-endpoint") + 1] == "h0:29400"
    assert args[-3:] == ["train", "--epochs", "3"]
    assert strip_launcher_flags(["--nproc", "2", "--lr", "1", "--max-restarts=3"]) == ["--lr", "1"]


def test_batch_plan_fixes_one_size_and_derives_the_rest():
    assert divide_batch(256, None, 4).per_replica == 64
    assert divide_batch(999, 32, 4).global_batch == 128                  # per-replica fixed
    plan = divide_batch(512, 32, 4, accumulate_to_global=True)            # both fixed: accumulation
    assert (plan.global_batch, plan.per_replica, plan.accum_steps, plan.micro_batch) == (512, 128, 4, 32)
    with pytest.raises(ConfigError, match="global batch 100 does not divide across 8 replica"):
        divide_batch(100, None, 8)
    with pytest.raises(ConfigError, match="use --batch-size 96 or 104"):
        divide_batch(100, None, 8)
    with pytest.raises(ConfigError, match="use --batch-size 384 or 512"):
        divide_batch(500, 32, 4, accumulate_to_global=True)
    with pytest.raises(ConfigError, match="per-replica batch 30 is not divisible"):
        divide_batch(64, 30, 2, accum_steps=4)


def test_indivisible_global_batch_is_a_clear_error_before_launching(tmp_path, capsys):
    code = main(["train", "--model", "mlp", "--data", "digits", "--nproc", "3", "--batch-size", "64",
                 "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    # The launcher checks the plan itself: 64 over 3 replicas fails before any worker starts.
    assert code == 2 and "global batch 64 does not divide across 3 replica(s); use --batch-size 63 or 66" in err


def test_lr_scaling_ramps_from_the_base_lr_to_k_times_it():
    s = LRSchedule("constant", 0.1, total_steps=100, replica_scale=4.0, scale_warmup_steps=10)
    lrs = [s.value_at(i) for i in range(12)]
    assert lrs[0] == pytest.approx(0.1 * (1 + 3 * 0.1))
    assert lrs[9] == pytest.approx(0.4) and lrs[11] == pytest.approx(0.4)
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10], strict=True))


def test_sharding_gives_each_rank_its_slice_of_every_global_batch():
    r0, r1 = rank_positions(3, 4, 0, 2).tolist(), rank_positions(3, 4, 1, 2).tolist()
    assert r0 == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19]
    assert r1 == [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23]
    ranges = [eval_range(359, r, 4) for r in range(4)]
    assert ranges[0][0] == 0 and ranges[-1][1] == 359
    assert all(a[1] == b[0] for a, b in pairwise(ranges))


def test_incomplete_checkpoints_are_ignored_and_old_ones_pruned(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for step in (10, 20, 30):
        store.path_for(step).mkdir()
        store.commit(store.path_for(step), {"global_step": step})
    store.path_for(40).mkdir()                       # a save that died before its commit
    (store.path_for(40) / "__0_0.distcp").write_bytes(b"partial")
    assert store.latest() == store.path_for(30)
    store.prune()
    assert [p.name for p in store.complete()] == ["step-000000020", "step-000000030"]
    assert store.path_for(40).exists()                # newer than the newest complete: may still be in flight
    store.path_for(5).mkdir()                         # an old leftover is removed
    store.prune()
    assert not store.path_for(5).exists()


def test_streamed_resume_with_dropout_is_bitwise(tmp_path, digits):
    """Every new DataLoader iterator (in-process ones too) draws a seed from its generator: from
    the global one, it shifted dropout masks by one draw per epoch, and a run resumed mid-epoch (one
    more iterator after the restored RNG) differed from an uninterrupted one."""
    def config(name):
        cfg = small_config(tmp_path / name, epochs=2)
        cfg.data.placement, cfg.data.num_workers = "stream", 0
        return cfg

    def model():
        torch.manual_seed(0)
        return build_model("mlp", digits.input_shape, digits.num_classes, hidden=[64], dropout=0.3)
    store = CheckpointStore(tmp_path / "ck", keep=10)
    full = fit(config("a"), digits, model=model(), ckpt=Checkpointer(store, every=25))
    resumed = fit(config("b"), digits, model=model(), ckpt=Checkpointer(store, resume=str(store.path_for(25))))
    assert [h["train_loss"] for h in full.history] == [h["train_loss"] for h in resumed.history]
    assert all(torch.equal(a, b) for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values(), strict=True))


def test_single_process_resume_is_bitwise_and_bad_resume_paths_are_errors(tmp_path, digits):
    full_cfg = small_config(tmp_path / "a", epochs=3)
    full_cfg.checkpoint.every = 9
    store = CheckpointStore(tmp_path / "a" / "ck", keep=10)
    full = fit(full_cfg, digits, ckpt=Checkpointer(store, every=9))
    # A second run resumes from the checkpoint at step 18 (mid epoch 1) and finishes the job.
    resumed_cfg = small_config(tmp_path / "b", epochs=3)
    resumed = fit(resumed_cfg, digits, ckpt=Checkpointer(store, resume=str(store.path_for(18))))
    assert resumed.resumed_from == str(store.path_for(18))
    for a, b in zip(full.history, resumed.history, strict=True):
        assert (a["train_loss"], a["val_loss"], a["lr"]) == (b["train_loss"], b["val_loss"], b["lr"])
    assert all(torch.equal(a, b) for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values(), strict=True))
    with pytest.raises(ConfigError, match="not a complete checkpoint"):
        fit(small_config(tmp_path / "c"), digits, ckpt=Checkpointer(store, resume=str(tmp_path)))
    other = small_config(tmp_path / "d", batch_size=32)
    with pytest.raises(ConfigError, match="global_batch 64, this run has 32"):
        fit(other, digits, ckpt=Checkpointer(store, resume="auto"))


def test_a_process_killed_outright_is_the_jobs_failure_though_a_peer_stamped_an_earlier_time(tmp_path, monkeypatch):
    """The agent's failures, as torch builds them: a server SIGKILLed at x.99 s (no error file: the
    agent stamps the whole second it noticed, x+1) and a worker that failed 5 ms later on the
    closed connection (its error file, written as env.hand_to_launcher writes it, says x.995 s).
    The dead server is the job's failure (seen in CI as "exit code 1"); stopped workers never are."""
    import time

    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from scaletrain.distributed.launch import _first_failure
    x = int(time.time()) - 10
    error_file = tmp_path / "error.json"
    error_file.write_text(json.dumps({"message": "RuntimeError: Connection closed by peer",
                                      "timestamp": x, "time_ns": x * 10**9 + 995_000_000}))
    worker = ProcessFailure(local_rank=0, pid=11, exitcode=1, error_file=str(error_file))
    monkeypatch.setattr(time, "time", lambda: x + 1.02)      # when the agent noticed the server
    server = ProcessFailure(local_rank=2, pid=13, exitcode=-9, error_file=str(tmp_path / "none.json"))
    stopped = ProcessFailure(local_rank=1, pid=12, exitcode=-15, error_file=str(tmp_path / "none.json"))
    monkeypatch.undo()
    assert server.timestamp == x + 1 and worker.timestamp == x
    assert _first_failure({0: worker, 1: stopped, 2: server})[0] == 2
    # Without a process killed outright: the earliest handed-over failure, never a stopped one.
    later = tmp_path / "later.json"
    later.write_text(json.dumps({"message": "ValueError: bad", "timestamp": x, "time_ns": x * 10**9 + 999_000_000}))
    assert _first_failure({0: worker, 1: stopped, 3: ProcessFailure(3, 14, 1, str(later))})[0] == 0
    assert _first_failure({1: stopped})[0] == 1



def test_powersgd_wire_elements_are_what_torchs_hook_sends():
    """The count the scaling predictor prices, against the hook's own statistics for one step."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel

    from scaletrain.distributed.comm_hooks import powersgd_wire_elements
    from scaletrain.distributed.strategies.process_group import _free_port, destroy_process_group
    store = dist.TCPStore("127.0.0.1", _free_port(), 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 2))
        shapes = [tuple(p.shape) for p in model.parameters()]
        ddp = DistributedDataParallel(model)
        state = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        for step in range(3):
            if step == 2:   # the first compressed step: count only its numbers
                state.total_numel_before_compression = state.total_numel_after_compression = 0
            ddp(torch.randn(5, 64)).sum().backward()
        assert state.total_numel_before_compression == sum(p.numel() for p in model.parameters())
        assert powersgd_wire_elements(shapes, rank=2) == state.total_numel_after_compression
        assert state.total_numel_after_compression < state.total_numel_before_compression / 2
    finally:
        destroy_process_group()


def test_a_child_command_starts_the_workers_and_trainings_and_a_bad_one_is_one_line(tmp_path, capsys, monkeypatch):
    """SCALETRAIN_CHILD_COMMAND (what the tests point at a warm interpreter) runs the launcher's
    workers as it is (torchrun's --no-python) and a sweep's trainings; one that names no
    executable is refused in one line before anything starts."""
    from scaletrain.experiments.slots import scaletrain_argv

    monkeypatch.setenv("SCALETRAIN_CHILD_COMMAND", f"{sys.executable} 'my shim.py'")
    args = torchrun_arguments(2, 0, ["--epochs", "1"])
    assert args[args.index("--no-python"):] == ["--no-python", sys.executable, "my shim.py", "train", "--epochs", "1"]
    assert scaletrain_argv("train", "--config", "a.toml") == [sys.executable, "my shim.py", "train", "--config", "a.toml"]
    monkeypatch.delenv("SCALETRAIN_CHILD_COMMAND")
    assert torchrun_arguments(2, 0, ["--epochs", "1"])[-5:] == ["-m", "scaletrain", "train", "--epochs", "1"]
    assert scaletrain_argv("train")[:3] == [sys.executable, "-m", "scaletrain"]
    for bad, said in (("/no/such/shim", "'/no/such/shim' is not an executable"), ("'open", "does not parse")):
        monkeypatch.setenv("SCALETRAIN_CHILD_COMMAND", bad)
        code = main(["train", "--model", "mlp", "--data", "digits", "--epochs", "1", "--nproc", "2",
                     "--run-dir", str(tmp_path / "r")])
        err = capsys.readouterr().err
        assert code == 2 and said in err and err.count("\n") == 1, err
        assert not (tmp_path / "r").exists()
