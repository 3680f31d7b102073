"""The real multi-host check: two network namespaces joined by a veth pair stand in for two hosts;
each runs `scaletrain train --nproc 1` with its SCALETRAIN_CLUSTER task, and torchrun's c10d
rendezvous and gloo's all-reduce cross the (virtual) wire between them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest
import torch

from tests.processes import DIGITS_MLP, cli_env, metrics, outputs_of, summary

pytestmark = pytest.mark.usefixtures("processes")   # every test here starts processes


def _can_make_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` command"
    name = f"stprobe{uuid.uuid4().hex[:6]}"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create network namespaces here: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


REASON = _can_make_namespaces()


@pytest.fixture
def two_hosts():
    tag = uuid.uuid4().hex[:5]
    hosts = [(f"sta{tag}", f"va{tag}", "10.77.0.1"), (f"stb{tag}", f"vb{tag}", "10.77.0.2")]
    sh = lambda *cmd: subprocess.run(cmd, check=True, capture_output=True)  # noqa: E731
    try:
        for ns, _, _ in hosts:
            sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", hosts[0][1], "type", "veth", "peer", "name", hosts[1][1])
        for ns, dev, addr in hosts:
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield hosts
    finally:
        for ns, _, _ in hosts:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_two_hosts_train_together_through_a_cluster_spec(two_hosts, tmp_path):
    workers = [f"{addr}:29561" for _, _, addr in two_hosts]
    procs = []
    for index, (ns, dev, _) in enumerate(two_hosts):
        spec = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
        env = cli_env(SCALETRAIN_CLUSTER=spec, GLOO_SOCKET_IFNAME=dev)
        run_dir = tmp_path / f"host{index}"  # no shared file system between "hosts"
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "scaletrain", "train", *DIGITS_MLP, "--epochs", "2",
             "--batch-size", "64", "--nproc", "1", "--run-dir", str(run_dir)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path))
    outputs = outputs_of(procs, 180)
    assert [p.returncode for p in procs] == [0, 0], "\n\n".join(o[-3000:] for o in outputs)
    # Host 0 holds the chief (rank 0): it alone wrote the run files.
    s = summary(tmp_path / "host0")
    assert (s["world_size"], s["per_replica_batch_size"], s["strategy"]) == (2, 32, "ddp")
    assert len(metrics(tmp_path / "host0")) == 2 and not (tmp_path / "host1" / "summary.json").exists()
    assert torch.load(tmp_path / "host0" / "model.pt", weights_only=True)
