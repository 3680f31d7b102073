"""Parameter-server training over real torchrun processes and gloo (issue 13)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed.checkpoint as dcp

from benchmarks.common import slow_worker  # worker 1 slow on purpose: the tests' plugin model
from scaletrain.checkpoint.safe_reader import SafeFileSystemReader, SafeLoadPlanner
from scaletrain.distributed.strategies.ps.strategy import balance
from scaletrain.errors import ConfigError
from tests.processes import (
    DIGITS_MLP,
    PLUGINS,
    children,
    cli_env,
    committed_steps,
    kill_group,
    metrics,
    outputs_of,
    run,
    start,
    summary,
    wait_for,
)

pytestmark = pytest.mark.timeout(300)

COMMON = [*DIGITS_MLP, "--epochs", "2", "--batch-size", "64", "--seed", "3"]


def _weights(run_dir):
    return torch.load(run_dir / "model.pt", weights_only=True)


@pytest.mark.usefixtures("processes")
def test_sync_parameter_servers_equal_ddp_with_one_and_two_servers(tmp_path):
    ddp = run(["train", *COMMON, "--nproc", "2", "--strategy", "ddp", "--run-dir", str(tmp_path / "ddp")], tmp_path)
    assert ddp.returncode == 0, ddp.stderr
    for servers in (1, 2):
        ps = run(["train", *COMMON, "--nproc", str(2 + servers), "--strategy", "ps", "--num-ps", str(servers),
                  "--run-dir", str(tmp_path / f"ps{servers}")], tmp_path)
        assert ps.returncode == 0, ps.stderr
        assert f"2 worker(s) + {servers} parameter server(s), sync" in ps.stdout
        a, b = _weights(tmp_path / "ddp"), _weights(tmp_path / f"ps{servers}")
        assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=1e-6) for k in a)
        keys = ("train_loss", "val_loss", "val_accuracy", "optimizer_steps")
        assert [m[k] for m in metrics(tmp_path / "ddp") for k in keys] == \
               pytest.approx([m[k] for m in metrics(tmp_path / f"ps{servers}") for k in keys], rel=1e-6)
        assert all(m["ps_dropped"] == 0 and m["ps_staleness_max"] == 0 for m in metrics(tmp_path / f"ps{servers}"))


# Counts the bytes each process hands to c10d's point-to-point sends (every message of the parameter
# server protocol), in sent-<RANK>.json beside the run.
_COUNTING_SENDS = """
import json, os
if os.environ.get("RANK") is not None and os.environ.get("COUNT_SENDS_IN"):
    import torch.distributed as dist
    _sent = {"bytes": 0, "messages": 0}
    def _counting(send):
        def counted(tensor, *args, **kwargs):
            _sent["bytes"] += tensor.numel() * tensor.element_size()
            _sent["messages"] += 1
            with open(os.path.join(os.environ["COUNT_SENDS_IN"], f"sent-{os.environ['RANK']}.json"), "w") as fh:
                json.dump(_sent, fh)
            return send(tensor, *args, **kwargs)
        return counted
    dist.send, dist.isend = _counting(dist.send), _counting(dist.isend)
"""


@pytest.mark.usefixtures("processes")
def test_a_push_is_one_message_and_a_notice_costs_a_header_not_a_shard(tmp_path):
    """A worker sends its servers one message per step, a header of 6 floats and the gradient (two
    messages cost a small model ~1 ms a step in hand-overs), and at meetings and each epoch's end a
    few notices. A notice is a header alone: the link carries the gradients and nothing of their
    size more (a notice padded to the shard's size cost 4-5 shards an epoch per worker)."""
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "sitecustomize.py").write_text(_COUNTING_SENDS)
    result = run(["train", *COMMON, "--nproc", "3", "--strategy", "ps", "--run-dir", str(tmp_path / "r")], tmp_path,
                 PYTHONPATH=os.pathsep.join([str(tmp_path / "hooks"), str(PLUGINS)]), COUNT_SENDS_IN=str(tmp_path))
    assert result.returncode == 0, result.stderr
    steps = summary(tmp_path / "r")["optimizer_steps"]
    model_bytes = 4 * ((64 * 64 + 64) + (64 * 10 + 10))
    for rank in (0, 1):
        sent = json.loads((tmp_path / f"sent-{rank}.json").read_text())
        gradients = steps * model_bytes + (model_bytes if rank == 0 else 0)    # the chief sends the initial values
        notices = sent["messages"] - steps - (rank == 0)                         # each push: one message
        assert notices >= 2 * 2, sent                                            # meetings and epoch ends, 2 epochs
        assert sent["bytes"] == gradients + 6 * 4 * (steps + notices), sent


@pytest.mark.usefixtures("processes")
def test_async_parameter_servers_learn_and_the_staleness_bound_holds(tmp_path):
    base = [*DIGITS_MLP, "--batch-size", "66", "--nproc", "4", "--strategy", "ps", "--ps-mode", "async"]
    free = run(["train", *base, "--epochs", "3", "--sync-warmup-epochs", "1", *slow_worker(0.002),
                "--checkpoint-every", "1000", "--run-dir", str(tmp_path / "a")], tmp_path)
    assert free.returncode == 0, free.stderr
    logs = metrics(tmp_path / "a")
    assert logs[-1]["val_accuracy"] >= 0.9
    assert sum(m["ps_pushes"] for m in logs) == 3 * logs[-1]["optimizer_steps"]   # every worker step, one push
    assert all(sum(m["ps_staleness_counts"]) == m["ps_pushes"] for m in logs)      # none dropped: all counted
    # The warm-up epoch is sync (nothing stale); then the slowed worker's gradients arrive late.
    assert logs[0]["ps_staleness_max"] == 0 and sum(sum(m["ps_staleness_counts"][1:]) for m in logs[1:]) > 0
    # The saved model is the servers' final state (the final checkpoint's weights, which the servers
    # wrote), not the chief's last pull from before the other workers' last updates.
    saved = _weights(tmp_path / "a")
    final = {"model": {k: torch.zeros_like(v) for k, v in saved.items()}}
    checkpoint = max((tmp_path / "a" / "checkpoints").glob("step-*"))
    dcp.load(final, storage_reader=SafeFileSystemReader(str(checkpoint)), planner=SafeLoadPlanner())
    assert all(torch.equal(saved[k], final["model"][k]) for k in saved)
    bounded = run(["train", *base, "--epochs", "2", "--max-staleness", "0", "--run-dir", str(tmp_path / "b")],
                  tmp_path)
    assert bounded.returncode == 0, bounded.stderr
    logs = metrics(tmp_path / "b")
    assert all(m["ps_staleness_max"] == 0 for m in logs) and sum(m["ps_dropped"] for m in logs) > 0
    assert all(m["ps_staleness_counts"][0] == m["ps_pushes"] - m["ps_dropped"] for m in logs)
    # The run report plots the distribution beside the usual plots (the store in this folder holds both runs).
    report = run(["runs", "report", "-o", str(tmp_path / "report.html")], tmp_path)
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "report.html").read_text()
    assert page.count("<svg") == 7 and "Staleness of the applied gradients" in page


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_backups_drop_exactly_the_stalled_workers_share_and_never_wait_for_it(tmp_path, mode):
    """Worker 1 sleeps 1.5 s in each step's forward: with one backup, each epoch ends once workers 0 and 2
    have finished their 19 steps; worker 1's single push of the epoch arrives after that and is
    dropped, and the rest of its share is never trained. The epoch lasts one of worker 1's steps
    (the epoch's end waits for the step it is in), not its 19 (28.5 s). The delay leaves the fast
    workers' 19 steps room on a loaded 2-core machine (at 0.5 s, CI once saw them take longer)."""
    result = run(["train", *DIGITS_MLP, "--batch-size", "66", "--epochs", "1", "--nproc", "4", "--strategy", "ps",
                  "--ps-mode", mode, "--backup-workers", "1", *slow_worker(1.5),
                  "--run-dir", str(tmp_path / "r")], tmp_path)
    assert result.returncode == 0, result.stderr
    logs = metrics(tmp_path / "r")
    assert [m["optimizer_steps"] for m in logs] == [19]            # positions agree: 19 steps an epoch
    for m in logs:
        # Worker 1's pushes within the epoch: 1 on a quiet machine; more once the fast workers' 19
        # steps outlast its 1.5 s under load (async applies those that come while they train). The
        # one in flight when the epoch ends is dropped, and the epoch never waits for the rest of
        # its share: most of worker 1's 19 steps are never taken (had it waited, all 19 would have
        # been pushed). Counted, not timed: how long the epoch took is the load's.
        late, worker_1 = m["ps_dropped"], m["ps_pushes"] - 2 * 19
        assert 1 <= late <= worker_1 < 19 / 2, (late, worker_1)
        assert m["samples"] == m["ps_pushes"] * 22                 # what was trained, worker 1's batches included


@pytest.mark.usefixtures("processes")
def test_servers_checkpoint_through_dcp_and_a_run_resumes_bitwise_after_a_dead_server(tmp_path):
    """The servers write the parameters and AdamW's state into the run's DCP checkpoint: a run
    whose parameter server is SIGKILLed after a checkpoint and restarted by torchrun
    (--max-restarts) resumes from it and ends bitwise where the uninterrupted run ends."""
    args = lambda name: ["train", *COMMON, "--nproc", "3", "--strategy", "ps", "--checkpoint-every", "5",
                         "--run-dir", str(tmp_path / name)]
    full = run(args("full"), tmp_path)
    assert full.returncode == 0, full.stderr
    slow = [a if a != "mlp" else "faulty_models:slow_mlp" for a in args("restarted")]
    proc = start([*slow, "--model-option", "delay_s=0.02", "--max-restarts", "1"], tmp_path, tmp_path / "log")
    try:
        wait_for(lambda: any(s >= 15 for s in committed_steps(tmp_path / "restarted" / "checkpoints")), 120,
                 "a checkpoint at step 15")
        server = wait_for(lambda: children(proc.pid)[2:], 10, "the server")[0]   # ranks 0, 1 work; rank 2 serves
        os.kill(server, signal.SIGKILL)
        assert proc.wait(timeout=180) == 0, (tmp_path / "log").read_text()[-3000:]
    finally:
        kill_group(proc)
    assert summary(tmp_path / "restarted")["restarts"] == 1
    assert summary(tmp_path / "restarted")["resumed_from"] is not None
    keys = ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr", "optimizer_steps")
    assert [[m[k] for k in keys] for m in metrics(tmp_path / "full")] == \
           [[m[k] for k in keys] for m in metrics(tmp_path / "restarted")]
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "restarted")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.usefixtures("processes")
def test_a_dead_server_ends_the_job_with_one_line(tmp_path):
    slow = ["train", *COMMON, "--model", "faulty_models:slow_mlp", "--model-option", "delay_s=0.05", "--nproc", "3",
            "--strategy", "ps", "--run-dir", str(tmp_path / "r")]
    proc = start(slow, tmp_path, tmp_path / "log")
    try:
        server = wait_for(lambda: children(proc.pid)[2:], 60, "the server")[0]
        wait_for(lambda: "parameter server(s)" in (tmp_path / "log").read_text(), 60, "training to start")
        time.sleep(1)
        os.kill(server, signal.SIGKILL)
        assert proc.wait(timeout=120) == 128 + signal.SIGKILL   # the server's own ending, as a shell reports it
    finally:
        kill_group(proc)
    log = (tmp_path / "log").read_text()
    assert log.strip().splitlines()[-1].startswith("scaletrain: error: parameter server (rank 2) failed with exit "
                                                   "code -9"), log[-3000:]
    # The workers the agent stopped afterwards did not turn the job's failure into an interruption.
    assert json.loads((tmp_path / "r" / "run.json").read_text())["status"] == "failed"


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("extra,message", [
    (["--nproc", "1"], "needs more processes than servers"),
    (["--nproc", "3", "--backup-workers", "2", "--batch-size", "64"], "leaves no gradient to apply"),
    (["--nproc", "3", "--max-staleness", "2"], "apply to --ps-mode async"),
    (["--nproc", "3", "--sync-warmup-epochs", "1"], "apply to --ps-mode async"),
    (["--nproc", "3", "--clip-grad-norm", "1"], "does not support --clip-grad-norm yet"),
])
def test_bad_parameter_server_setups_are_one_line(tmp_path, extra, message):
    result = run(["train", *DIGITS_MLP, "--strategy", "ps", "--epochs", "1", *extra,
                  "--run-dir", str(tmp_path / "r")], tmp_path)
    assert result.returncode != 0 and message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr.split("scaletrain: error")[-1]


def test_servers_get_whole_tensors_balanced_by_size():
    assert balance([100, 10, 60, 50], 2) == [[0, 1], [2, 3]]   # 110 and 110
    assert balance([5, 5, 5], 3) == [[0], [1], [2]]
    with pytest.raises(ConfigError, match="--num-ps 5 is more than the model's 4 parameter tensors"):
        balance([1, 2, 3, 4], 5)


@pytest.mark.usefixtures("processes")
def test_ps_flags_need_the_ps_strategy(tmp_path):
    result = run(["train", *DIGITS_MLP, "--num-ps", "2", "--epochs", "1"], tmp_path)
    assert result.returncode == 2 and "--num-ps needs --strategy ps" in result.stderr


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.usefixtures("processes")
def test_seed_002s_tf_config_with_a_ps_task_trains_like_nproc(tmp_path):
    """Seed 002's cluster (two workers and a ps task) in TF_CONFIG, as TensorFlow users write it,
    each task started on its own as on its own host (here on loopback)."""
    ports = _free_ports(3)
    cluster = {"worker": [f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"], "ps": [f"127.0.0.1:{ports[2]}"]}
    args = [sys.executable, "-m", "scaletrain", "train", *COMMON, "--strategy", "ps", "--run-dir", str(tmp_path / "r")]
    tasks = [subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=cli_env(TF_CONFIG=json.dumps({"cluster": cluster,
                                                                "task": {"type": role, "index": index}})))
             for role, index in (("worker", 0), ("worker", 1), ("ps", 0))]
    outputs = outputs_of(tasks, 240)
    assert [task.returncode for task in tasks] == [0, 0, 0], outputs
    assert "2 worker(s) + 1 parameter server(s), sync" in outputs[0]
    assert [m["optimizer_steps"] for m in metrics(tmp_path / "r")] == [20, 40]
    wrong = run(["train", *COMMON, "--strategy", "ddp", "--run-dir", str(tmp_path / "w")], tmp_path,
                TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    assert wrong.returncode == 2 and "TF_CONFIG lists 1 ps task(s); train with parameter servers (--strategy ps --num-ps 1)" in wrong.stderr


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("mode", [["--ps-mode", "async"], ["--backup-workers", "1", "--checkpoint-every", "25"]],
                         ids=["async", "backup-with-checkpoints"])
def test_a_killed_worker_does_not_stop_training(tmp_path, mode):
    """Chief, two workers and a server started as four commands (as on four hosts); worker 1 (rank
    2) is SIGKILLed once the first epoch is recorded. The others finish every epoch without it,
    record the loss, and (with checkpoints) keep saving over the processes left."""
    ports = _free_ports(4)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[2]}"],
               "ps": [f"127.0.0.1:{ports[3]}"]}
    args = [sys.executable, "-m", "scaletrain", "train", *DIGITS_MLP, "--model", "faulty_models:slow_mlp",
            "--model-option", "delay_s=0.01", "--epochs", "3", "--batch-size", "66", "--strategy", "ps",
            "--ps-roll-call-s", "3", *mode, "--run-dir", str(tmp_path / "r")]
    tasks = [subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=cli_env(SCALETRAIN_CLUSTER=json.dumps({"cluster": cluster,
                                                                         "task": {"type": role, "index": index}})))
             for role, index in (("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0))]
    try:
        wait_for(lambda: (tmp_path / "r" / "metrics.jsonl").is_file() and metrics(tmp_path / "r"), 120, "epoch 1")
        os.kill(tasks[2].pid, signal.SIGKILL)
    except BaseException:
        for task in tasks:
            task.kill()
        raise
    outputs = outputs_of(tasks, 180)
    assert [task.returncode for task in tasks] == [0, 0, -signal.SIGKILL, 0], outputs
    assert "worker rank(s) 2 lost; training goes on with 2 worker(s)" in outputs[0]
    logs = metrics(tmp_path / "r")
    assert [m["epoch"] for m in logs] == [1, 2, 3] and logs[0]["ps_workers"] == 3
    assert logs[-1]["ps_workers"] == 2 and logs[-1]["ps_workers_lost"] == 1
    assert logs[-1]["samples"] == 2 * 19 * 22 and logs[-1]["optimizer_steps"] == 3 * 19   # two workers' shares
    assert logs[-1]["val_accuracy"] > logs[0]["val_accuracy"]
    assert summary(tmp_path / "r")["epochs_run"] == 3
    if "--checkpoint-every" in mode:
        assert committed_steps(tmp_path / "r" / "checkpoints")[-1] == 3 * 19
