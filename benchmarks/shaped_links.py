"""The DDP scaling predictor against measured runs over links shaped like a cluster's.

Each "host" is a network namespace with one veth into a bridge; both ends of every veth are
shaped with tbf to the link rate (full duplex), so a host sends and receives at that rate. On
each set of hosts the benchmark

1. probes the links: a gloo all-reduce at several sizes (fitted to t = a + b * size, giving the
   bus bandwidth and the per-hop latency the predictor uses) and a point-to-point send/recv;
2. trains the same small model data-parallel with `scaletrain train` (one process per host,
   SCALETRAIN_CLUSTER), and reads the step time from the run's steady-state images/sec;
3. predicts that step time with `planning/scaling.py` from the one-process step time (measured
   the same way, no shaping) and the probed link figures;

and prints measured beside predicted. The model is an MLP with many weights and little compute
(the gradient all-reduce dominates), so the 2 cores are not the bottleneck: the same runs on an
unshaped bridge are reported too (their step time is the compute-and-CPU floor).

    .venv/bin/python benchmarks/shaped_links.py      # as root --rates 1000,4000 --hosts 2,4 --out shaped.json

Needs root (namespaces, tc). tbf shapes the rate; per-packet latency (netem) is not in every
kernel, and this benchmark does not add any: the latency the predictor is given is the probed one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PORT = 29617
SIZES = [2**10, 2**16, 2**20, 2**22, 2**24]      # all-reduce probe sizes, bytes (float32)
MODEL = ["--model", "mlp", "--model-option", "hidden=[1024,1024]", "--data", "synthetic", "--num-samples", "2048",
         "--no-progress", "--no-record", "--lr", "0.01", "--no-eval-each-epoch"]


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@contextmanager
def shaped_hosts(n: int, rate_mbit: int | None):
    """n namespaces on one bridge; each veth end shaped to rate_mbit (None: unshaped)."""
    tag = uuid.uuid4().hex[:4]
    bridge = f"stbr{tag}"
    hosts = [(f"sth{tag}{i}", f"sh{tag}{i}", f"sb{tag}{i}", f"10.78.{int(tag[:2], 16) % 200}.{i + 1}")
             for i in range(n)]
    try:
        sh("ip", "link", "add", bridge, "type", "bridge")
        sh("ip", "link", "set", bridge, "up")
        for ns, inner, outer, addr in hosts:
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "link", "set", outer, "master", bridge)
            sh("ip", "link", "set", outer, "up")
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", inner)
            sh("ip", "-n", ns, "link", "set", inner, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            if rate_mbit:
                # A burst of ~2 ms at the rate (at least 64 KiB) keeps tbf from starving large segments.
                burst = max(64 * 1024, int(rate_mbit * 1e6 / 8 * 0.002))
                tbf = ["tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "100ms"]
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", inner, "root", *tbf)
                sh("tc", "qdisc", "add", "dev", outer, "root", *tbf)
        yield hosts
    finally:
        for ns, _, outer, _ in hosts:
            subprocess.run(["ip", "link", "del", outer], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def _in_hosts(hosts, argv_of, env_of, timeout: float = 600) -> list[str]:
    procs = []
    for rank, (ns, inner, _, _) in enumerate(hosts):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": inner, "PYTHONUNBUFFERED": "1",
               **env_of(rank)}
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, *argv_of(rank)], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO))
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, out in zip(procs, outputs):
        if p.returncode != 0:
            raise RuntimeError(f"a host failed (exit {p.returncode}):\n{out[-3000:]}")
    return outputs


def probe(hosts, repeats: int = 5) -> dict:
    """All-reduce times per size (median of `repeats`) and one point-to-point send/recv per size."""
    master = hosts[0][3]
    outputs = _in_hosts(hosts, lambda rank: [sys.executable, __file__, "--probe-worker"],
                        lambda rank: {"RANK": str(rank), "WORLD_SIZE": str(len(hosts)), "MASTER_ADDR": master,
                                      "MASTER_PORT": str(PORT), "PROBE_REPEATS": str(repeats)})
    return json.loads(outputs[0].strip().splitlines()[-1])


def probe_worker() -> None:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    repeats = int(os.environ["PROBE_REPEATS"])
    allreduce, p2p = {}, {}
    for size in SIZES:
        t = torch.ones(size // 4)
        dist.all_reduce(t)                      # warm-up: connections and buffers
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - start)
        allreduce[size] = statistics.median(times)
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            elif rank == 1:
                dist.recv(t, 0)
                dist.send(t, 0)
            times.append((time.perf_counter() - start) / 2)     # one way
        p2p[size] = statistics.median(times)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"allreduce_s": allreduce, "p2p_s": p2p, "world": world}))


def fit_link(probed: dict, world: int) -> tuple[float, float]:
    """(bus bandwidth bytes/s, per-hop latency s) from t = a + b * size over the probe sizes:
    a ring all-reduce moves 2(N-1)/N * size per rank in 2(N-1) hops."""
    sizes = [int(s) for s in probed["allreduce_s"]]
    times = [probed["allreduce_s"][s] for s in probed["allreduce_s"]]
    mean_s, mean_t = statistics.fmean(sizes), statistics.fmean(times)
    slope = sum((s - mean_s) * (t - mean_t) for s, t in zip(sizes, times)) / sum((s - mean_s) ** 2 for s in sizes)
    intercept = mean_t - slope * mean_s
    bandwidth = 2 * (world - 1) / world / slope
    return bandwidth, max(intercept, 0.0) / (2 * (world - 1))


def train_step_time(hosts, per_host_batch: int, epochs: int, workdir: Path, strategy: str) -> float:
    """Seconds per optimizer step of `scaletrain train` over these hosts (steady-state images/sec)."""
    workers = [f"{addr}:{PORT + 1}" for *_, addr in hosts]
    run_dirs = [workdir / f"host{rank}-{uuid.uuid4().hex[:6]}" for rank in range(len(hosts))]
    args = lambda rank: [sys.executable, "-m", "scaletrain", "train", *MODEL, "--epochs", str(epochs),  # noqa: E731
                         "--batch-size", str(per_host_batch * len(hosts)), "--run-dir", str(run_dirs[rank]),
                         "--strategy", strategy]
    spec = lambda rank: json.dumps({"cluster": {"worker": workers},  # noqa: E731
                                    "task": {"type": "worker", "index": rank}})
    _in_hosts(hosts, args, lambda rank: {"SCALETRAIN_CLUSTER": spec(rank)} if len(hosts) > 1 else {})
    summary = json.loads((run_dirs[0] / "summary.json").read_text())
    return per_host_batch * len(hosts) / summary["images_per_sec"]


def one_process_step_time(per_host_batch: int, epochs: int, workdir: Path) -> float:
    run_dir = workdir / f"one-{uuid.uuid4().hex[:6]}"
    subprocess.run([sys.executable, "-m", "scaletrain", "train", *MODEL, "--epochs", str(epochs), "--batch-size",
                    str(per_host_batch), "--run-dir", str(run_dir)], check=True, capture_output=True, cwd=REPO,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    return per_host_batch / json.loads((run_dir / "summary.json").read_text())["images_per_sec"]


def grad_bytes() -> int:
    from scaletrain.models import build_model
    model = build_model("mlp", input_shape=(3, 32, 32), num_classes=10, hidden=[1024, 1024])
    return sum(p.numel() * p.element_size() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rates", default="1000,4000", help="link rates in Mbit/s (comma-separated)")
    parser.add_argument("--hosts", default="2,4", help="host counts (comma-separated)")
    parser.add_argument("--strategies", default="ddp,fsdp", help="data-parallel strategies (comma-separated)")
    parser.add_argument("--batch", type=int, default=16, help="per-host batch")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default="shaped_links.json")
    args = parser.parse_args()
    if args.probe_worker:
        return probe_worker()
    from benchmarks.common import environment
    from scaletrain.planning.hardware import Interconnect
    from scaletrain.distributed.strategies.registry import STRATEGIES
    from scaletrain.planning.scaling import ScalingInputs, predict, strategy_traffic
    import torch
    workdir = Path(tempfile.mkdtemp(prefix="shaped-"))
    S = grad_bytes()
    t1 = statistics.median(one_process_step_time(args.batch, args.epochs, workdir) for _ in range(3))
    print(f"one process: {t1 * 1e3:.2f} ms per step at batch {args.batch}; gradients {S / 2**20:.1f} MiB", flush=True)
    rows = []
    strategies = args.strategies.split(",")
    for rate in [None, *(int(r) for r in args.rates.split(","))]:
        for n in (int(h) for h in args.hosts.split(",")):
            with shaped_hosts(n, rate) as hosts:
                probed = probe(hosts)
                bandwidth, hop = fit_link(probed, n)
                measured = {name: statistics.median(train_step_time(hosts, args.batch, args.epochs, workdir, name)
                                                    for _ in range(2)) for name in strategies}
            link = Interconnect("probed", bandwidth, hop, "probed")
            for name in strategies:
                point = predict(ScalingInputs(step_time_s=t1, per_device_batch=args.batch, grad_bytes=S, intra=link,
                                              network=link, devices_per_host=1,
                                              **strategy_traffic(STRATEGIES.get(name))), n)
                row = {"strategy": name, "rate_mbit": rate, "hosts": n, "bus_bandwidth_Bps": bandwidth,
                       "hop_latency_s": hop, "p2p_1MiB_s": probed["p2p_s"][str(2**20)],
                       "allreduce_s": probed["allreduce_s"], "measured_step_s": measured[name],
                       "predicted_step_s": point.step_time_s, "error": point.step_time_s / measured[name] - 1}
                rows.append(row)
                print(f"{name}, {rate or 'unshaped'} Mbit/s, {n} hosts: link {bandwidth * 8 / 1e6:,.0f} Mbit/s bus, "
                      f"{hop * 1e6:.0f} us/hop; step measured {measured[name] * 1e3:.1f} ms, predicted "
                      f"{point.step_time_s * 1e3:.1f} ms ({row['error']:+.0%})", flush=True)
    result = {"environment": environment(torch.device("cpu")), "one_process_step_s": t1, "grad_bytes": S,
              "per_host_batch": args.batch, "points": rows}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
