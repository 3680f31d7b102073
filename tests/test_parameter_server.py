"""Parameter-server training over real torchrun processes and gloo (issue 13, in progress)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
import torch

from tests.processes import DIGITS_MLP, cli_env, metrics, run
from scaletrain.distributed.strategies.parameter_server import balance
from scaletrain.errors import ConfigError

pytestmark = pytest.mark.timeout(300)

COMMON = [*DIGITS_MLP, "--epochs", "2", "--batch-size", "64", "--seed", "3"]


def _weights(run_dir):
    return torch.load(run_dir / "model.pt", weights_only=True)


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


def test_async_parameter_servers_learn_and_the_staleness_bound_holds(tmp_path):
    base = [*DIGITS_MLP, "--batch-size", "66", "--nproc", "4", "--strategy", "ps", "--ps-mode", "async"]
    free = run(["train", *base, "--epochs", "3", "--run-dir", str(tmp_path / "a")], tmp_path)
    assert free.returncode == 0, free.stderr
    logs = metrics(tmp_path / "a")
    assert logs[-1]["val_accuracy"] >= 0.9
    assert sum(m["ps_pushes"] for m in logs) == 3 * logs[-1]["optimizer_steps"]   # every worker step, one push
    bounded = run(["train", *base, "--epochs", "2", "--max-staleness", "0", "--run-dir", str(tmp_path / "b")],
                  tmp_path)
    assert bounded.returncode == 0, bounded.stderr
    logs = metrics(tmp_path / "b")
    assert all(m["ps_staleness_max"] == 0 for m in logs) and sum(m["ps_dropped"] for m in logs) > 0


@pytest.mark.parametrize("extra,message", [
    (["--nproc", "1"], "needs more processes than servers"),
    (["--nproc", "3", "--backup-workers", "2", "--batch-size", "64"], "leaves no gradient to apply"),
    (["--nproc", "3", "--max-staleness", "2"], "apply to --ps-mode async"),
    (["--nproc", "3", "--checkpoint-every", "5"], "does not support --checkpoint-every yet"),
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


def test_a_cluster_spec_with_a_ps_task_trains_like_nproc(tmp_path):
    """Three tasks started on their own, as on three hosts (here on loopback): chief, worker, ps."""
    ports = _free_ports(3)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"], "ps": [f"127.0.0.1:{ports[2]}"]}
    args = [sys.executable, "-m", "scaletrain", "train", *COMMON, "--strategy", "ps", "--run-dir", str(tmp_path / "r")]
    tasks = [subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=cli_env(SCALETRAIN_CLUSTER=json.dumps({"cluster": cluster,
                                                                         "task": {"type": role, "index": 0}})))
             for role in ("chief", "worker", "ps")]
    outputs = [task.communicate(timeout=240)[0] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0, 0], outputs
    assert "2 worker(s) + 1 parameter server(s), sync" in outputs[0]
    assert [m["optimizer_steps"] for m in metrics(tmp_path / "r")] == [20, 40]
    wrong = run(["train", *COMMON, "--strategy", "ddp", "--run-dir", str(tmp_path / "w")], tmp_path,
                SCALETRAIN_CLUSTER=json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}))
    assert wrong.returncode == 2 and "lists 1 ps task(s); train with --strategy ps --num-ps 1" in wrong.stderr
