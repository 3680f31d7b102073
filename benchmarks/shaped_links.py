"""The scaling predictor against measured runs over links shaped like a cluster's.

Each "host" is a network namespace with one veth into a bridge; both ends of every veth are
shaped with tbf to the link rate (full duplex), so a host sends and receives at that rate. The
benchmark first measures the compute a host has: n processes training the model at once on this
machine's cores, none communicating. Then, on each set of hosts, it

1. probes the links: gloo's all-reduce, all-gather, reduce-scatter and broadcast and a
   point-to-point send/recv, 1 KiB to 16 MiB. The all-reduce fitted to t = a + b * size gives
   the bus bandwidth and the per-hop latency; the others against it give gloo's algorithm
   factors; the point-to-point fit gives a parameter server's link;
2. trains with `scaletrain train` on every host (SCALETRAIN_CLUSTER; DDP, FSDP, ZeRO, a parameter
   server on one more host, or tensor parallelism over the hosts), and reads the step time from
   the chief's steady-state images/sec;
3. predicts that step time with `prediction/scaling.py` from the measured compute and the probed
   link figures;

and prints measured beside predicted. The MLP has many weights and little compute, so the links
dominate. Which points the links bind and which the cores do is checked, not assumed: the same
hosts are probed unshaped, and a shaped link binds where it carries at most half of that.

    sudo .venv/bin/python benchmarks/shaped_links.py --rates 1000,10000 --hosts 2,4,8 --out shaped.json
    .venv/bin/python benchmarks/shaped_links.py --predict-again shaped.json --out shaped.json

Needs root (namespaces, tc). tbf shapes the rate; per-packet latency (netem) is not in every
kernel, and this benchmark does not add any: the latency the predictor is given is the probed one.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
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
from benchmarks.link_switch import switched_hosts  # noqa: E402  (the repo on the path first)

PORT = 29617
# The probe sizes, bytes (float32): 128-512 KiB are what tensor parallelism sends per layer (gpt-tiny at
# batch 16: 0.5 MiB), where gloo on hosts sharing cores strays furthest from one straight line.
SIZES = [2**10, 2**16, 2**17, 2**18, 2**19, 2**20, 2**22, 2**24]
MODEL = ["--model", "mlp", "--model-option", "hidden=[1024,1024]", "--data", "synthetic", "--num-samples", "2048",
         "--no-progress", "--no-record", "--lr", "0.01", "--no-eval-each-epoch"]
# Tensor parallelism splits a transformer's blocks: the char-gpt recipe's model on 512 windows.
TP_MODEL = ["--model", "gpt-tiny", "--data", "char-corpus", "--seq-len", "64", "--train-subset", "512",
            "--no-progress", "--no-record", "--no-eval-each-epoch", "--no-save-model"]


def model_args(strategy: str) -> list[str]:
    return TP_MODEL if strategy == "tensor" else MODEL


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@contextmanager
def shaped_hosts(n: int, rate_mbit: int | None, burst: int | None = None):
    """n namespaces on one bridge; each veth end shaped to rate_mbit (None: unshaped). `burst`:
    tbf's bucket, bytes (None: ~2 ms at the rate, at least 64 KiB)."""
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
                bucket = burst or max(64 * 1024, int(rate_mbit * 1e6 / 8 * 0.002))
                tbf = ["tbf", "rate", f"{rate_mbit}mbit", "burst", str(bucket), "latency", "100ms"]
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
    failed = [(rank, p.returncode, out) for rank, (p, out) in enumerate(zip(procs, outputs, strict=True)) if p.returncode != 0]
    if failed:
        # Every failed host's end: the first by rank is often a peer of the one that failed first.
        raise RuntimeError("\n".join(f"host {rank} failed (exit {code}):\n{out[-1500:]}" for rank, code, out in failed))
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

    def timed(op) -> float:
        op()                                    # warm-up: connections and buffers
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            op()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    result = {name: {} for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "p2p")}
    for size in SIZES:
        t = torch.ones(size // 4)
        shard = torch.empty(size // 4 // world)
        result["all_reduce"][size] = timed(lambda: dist.all_reduce(t))
        # The sharded strategies' collectives, at the same full-tensor size: each rank gathers the
        # whole tensor from the shards, or reduces the whole tensor into its shard.
        result["all_gather"][size] = timed(lambda: dist.all_gather_into_tensor(t, shard))
        result["reduce_scatter"][size] = timed(lambda: dist.reduce_scatter_tensor(shard, t))
        result["broadcast"][size] = timed(lambda: dist.broadcast(t, 0))

        def ping_pong():
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            elif rank == 1:
                dist.recv(t, 0)
                dist.send(t, 0)
        result["p2p"][size] = timed(ping_pong) / 2      # one way
    # A collective is done when every rank has its result: each entry is the slowest rank's median.
    # (The root of a broadcast returns once its sends are queued, long before the others receive:
    # its own time alone made a 16 MiB broadcast over 1 Gbit/s look 3x faster than the link.)
    everyone = [None] * world
    dist.all_gather_object(everyone, result)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        slowest = {kind: {size: max(r[kind][size] for r in everyone) for size in result[kind]} for kind in result}
        print(json.dumps({**slowest, "world": world}))


def fit(probed: dict) -> tuple[float, float]:
    """(intercept s, slope s/byte) of t = a + b * size over the probe sizes."""
    sizes = [int(size) for size in probed]
    times = [probed[size] for size in probed]
    mean_s, mean_t = statistics.fmean(sizes), statistics.fmean(times)
    slope = sum((s - mean_s) * (t - mean_t) for s, t in zip(sizes, times, strict=True)) / sum((s - mean_s) ** 2 for s in sizes)
    return mean_t - slope * mean_s, slope


def fit_link(probed: dict, world: int, around: int | None = None) -> tuple[float, float]:
    """(bus bandwidth bytes/s, per-hop latency s) from the all-reduce probe: a ring all-reduce moves
    2(N-1)/N * size per rank in 2(N-1) hops. `around`: fitted only over the probe sizes from a
    quarter to twice that message size, for a strategy that sends one size many times a step
    (tensor parallelism's per-layer all-reduces): one line over 1 KiB to 16 MiB is set by the
    large sizes and misses the middle by up to 2x on hosts that share cores."""
    sizes = probed["all_reduce"]
    if around is not None:
        near = {size: t for size, t in sizes.items() if around / 4 <= int(size) <= around * 2}
        sizes = near if len(near) >= 2 else sizes
    intercept, slope = fit(sizes)
    return 2 * (world - 1) / world / slope, max(intercept, 0.0) / (2 * (world - 1))


def algorithm_factors(probed: dict, message: int | None = None) -> dict:
    """Each collective's time against the ideal ring's at the same bytes, the ring priced by this
    link's own all-reduce (prediction/scaling.py's ALGORITHM_FACTORS, measured here): the median over
    the sizes from 1 MiB up, where bandwidth, not latency, sets the time; given the strategy's
    `message` (the bytes one collective moves), over the probe sizes from a quarter of it up. A
    whole-model all-gather between 2 hosts over tbf runs 1.3-1.5x the ring at 16 MiB, 1.0x at
    4 MiB: each host sends and receives at once, and the ACKs of what it receives wait behind what
    it sends. (One size alone is noisy: a 16 MiB all-gather over tbf took 83-108 ms in three
    probes of the same 2 hosts.)"""
    from scaletrain.prediction.scaling import RING_VOLUME
    sizes = [size for size in probed["all_reduce"] if int(size) >= max(2**20, (message or 0) // 4)]
    return {kind: statistics.median(probed[kind][size] / (probed["all_reduce"][size] * RING_VOLUME[kind]
                                                          / RING_VOLUME["all_reduce"]) for size in sizes)
            for kind in ("all_gather", "reduce_scatter", "broadcast")}


def cpu_ticks() -> list[int]:
    """This machine's cores' time so far, by state (/proc/stat: user, nice, system, idle, ...)."""
    return [int(ticks) for ticks in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]


def idle_share(before: list[int], after: list[int]) -> float:
    """How much of the cores' time between two cpu_ticks() readings was idle (or waiting on I/O)."""
    spent = [b - a for a, b in zip(before, after, strict=True)]
    return (spent[3] + spent[4]) / sum(spent)


def _run_dirs(workdir: Path, n: int) -> list[Path]:
    tag = uuid.uuid4().hex[:6]
    return [workdir / f"host{rank}-{tag}" for rank in range(n)]


def _step_time(run_dir: Path, batch: int) -> float:
    """Seconds per optimizer step from the run's steady-state images/sec (warm-up excluded)."""
    return batch / json.loads((run_dir / "summary.json").read_text())["images_per_sec"]


def _steps_per_epoch(run_dir: Path) -> int:
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary["optimizer_steps"] // summary["epochs_run"]


def train_step_time(hosts, per_host_batch: int, epochs: int, workdir: Path, strategy: str,
                    servers: int = 0) -> tuple[float, int]:
    """Seconds per optimizer step of `scaletrain train` over these hosts (the first len(hosts) -
    servers are workers, the rest parameter servers: --strategy ps), and its steps per epoch."""
    workers = len(hosts) - servers
    addresses = [f"{addr}:{PORT + 1}" for *_, addr in hosts]
    cluster = {"worker": addresses[:workers], **({"ps": addresses[workers:]} if servers else {})}
    roles = [("worker", i) for i in range(workers)] + [("ps", i) for i in range(servers)]
    run_dirs = _run_dirs(workdir, len(hosts))
    # Data parallelism: every worker takes the per-host batch; tensor parallelism: one replica, its
    # batch split over nobody (every host computes its slice of each layer on the whole batch).
    batch = per_host_batch if strategy == "tensor" else per_host_batch * workers
    extra = (["--tensor-parallel", str(workers)] if strategy == "tensor"
             else ["--num-ps", str(servers)] if servers else [])
    args = lambda rank: [sys.executable, "-m", "scaletrain", "train", *model_args(strategy),  # noqa: E731
                         "--epochs", str(epochs), "--batch-size", str(batch), "--run-dir", str(run_dirs[rank]),
                         "--strategy", strategy, *extra]
    spec = lambda rank: json.dumps({"cluster": cluster,  # noqa: E731
                                    "task": {"type": roles[rank][0], "index": roles[rank][1]}})
    _in_hosts(hosts, args, lambda rank: {"SCALETRAIN_CLUSTER": spec(rank)} if len(hosts) > 1 else {})
    return _step_time(run_dirs[0], batch), _steps_per_epoch(run_dirs[0])


def concurrent_step_time(n: int, per_host_batch: int, epochs: int, workdir: Path, model: list[str] = MODEL) -> float:
    """One process's step while n - 1 others train beside it on the same cores, none communicating:
    the compute a host has when n hosts share this machine (n = 1: one process alone). The chief's
    (the first) step; all n start together and run the same steps."""
    run_dirs = _run_dirs(workdir, n)
    procs = [subprocess.Popen([sys.executable, "-m", "scaletrain", "train", *model, "--epochs", str(epochs),
                               "--batch-size", str(per_host_batch), "--run-dir", str(run_dir)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}) for run_dir in run_dirs]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"a concurrent run failed (exit {proc.returncode}):\n{err[-3000:]}")
    return statistics.median(_step_time(run_dir, per_host_batch) for run_dir in run_dirs)


def model_tensor_bytes() -> list[int]:
    return [p.numel() * p.element_size() for p in _model().parameters()]


@functools.cache
def model_blocks() -> int:
    """MODEL's repeated blocks (none: the MLP is one unit to fsdp and zero2)."""
    from scaletrain.prediction.measure import count_blocks
    return count_blocks(_model())


def _model():
    from scaletrain.models import build_model
    return build_model("mlp", input_shape=(3, 32, 32), num_classes=10, hidden=[1024, 1024])


def on_one_thread(measure):
    """`measure()` on one thread, as each host has (OMP_NUM_THREADS=1), this process's count kept."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return measure()
    finally:
        torch.set_num_threads(threads)


def shard_copy_per_byte(tensor_bytes: list[int]) -> float:
    """FSDP2's copies around its collectives, per byte, on one thread as each host has."""
    from scaletrain.prediction.measure import shard_copy_seconds_per_byte
    return on_one_thread(lambda: shard_copy_seconds_per_byte(tensor_bytes, 2))


def tensor_parallel_traffic(batch: int) -> dict:
    """TP_MODEL's per-step all-reduces, split share and DTensor's own work per step, as `scaletrain
    scaling --strategy tensor` counts and measures them, on one thread as each host has."""
    out = subprocess.run([sys.executable, "-m", "scaletrain", "scaling", *TP_MODEL, "--batch-size", str(batch),
                          "--strategy", "tensor", "--tensor-parallel", "2", "--max-devices", "2", "--json"],
                         check=True, capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    record = json.loads(out)[0]
    return {key: record[key] for key in ("allreduces", "allreduce_bytes", "split_share", "dtensor_overhead_s")}


def predict_point(name: str, n: int, compute_s: float, batch: int, tensor_bytes: list[int], probed: dict,
                  per_byte: tuple[float, float], tp: dict | None = None, shared_cores: bool = False,
                  core_share: float = 1.0, servers: int = 1, copy_s_per_byte: float = 0.0,
                  steps_per_epoch: int | None = None):
    """The predictor's step time for strategy `name` on n workers (and `servers` parameter
    servers), from the probed link.
    `core_share`: how much slower a host computes when n of them share this machine (the
    compute of n at once over one alone); DTensor's own work is compute too. `steps_per_epoch`: the
    measured run's, for the pull that ends a parameter server's epoch (None: files from before it
    was recorded, when every notice cost a shard, too)."""
    from scaletrain.distributed.strategies.registry import STRATEGIES
    from scaletrain.prediction.hardware import Interconnect
    from scaletrain.prediction.scaling import (
        SHARDED_KINDS,
        ScalingInputs,
        predict,
        predict_parameter_server,
        predict_tensor_parallel,
        strategy_traffic,
    )
    if name == "tensor":
        message = tp["allreduce_bytes"] / tp["allreduces"]
        bandwidth, hop = fit_link(probed, n, around=message)
        link = Interconnect("probed", bandwidth, hop, "all-reduce probe around the message size")
        return predict_tensor_parallel(compute_s, n, tp["split_share"], tp["allreduces"], tp["allreduce_bytes"],
                                       link, tp.get("dtensor_overhead_s", 0.0) * core_share).step_time_s
    if name == "ps":
        intercept, slope = fit(probed["p2p"])
        link = Interconnect("probed p2p", 1 / slope, max(intercept, 0.0), "point-to-point probe")
        return predict_parameter_server(compute_s, batch, tensor_bytes, n, servers, link, *per_byte,
                                        steps_per_epoch=steps_per_epoch).step_time_s
    bandwidth, hop = fit_link(probed, n)
    link = Interconnect("probed", bandwidth, hop, "all-reduce probe")
    blocks = model_blocks()
    traffic = strategy_traffic(STRATEGIES.get(name), blocks=blocks)
    # A sharded collective's message: one unit's bytes (the whole model when it has no blocks).
    sharded = any(kind in SHARDED_KINDS for kind, _, _ in traffic["collectives"])
    traffic["algorithm"] = algorithm_factors(probed, sum(tensor_bytes) // max(blocks, 1) if sharded else None)
    inputs = ScalingInputs(step_time_s=compute_s, per_device_batch=batch, grad_bytes=sum(tensor_bytes), intra=link,
                           network=link, devices_per_host=1, tensor_bytes=tuple(tensor_bytes),
                           shared_cores=shared_cores, shard_copy_s_per_byte=copy_s_per_byte * core_share,
                           **traffic)
    return predict(inputs, n).step_time_s


def link_bound(row: dict, rows: list[dict]) -> bool:
    """Whether the shaped link, not this machine's cores, sets the pace of `row`'s point: its probed
    bandwidth is at most half what the same hosts move unshaped (where the cores carry the bytes
    as fast as they can). Unshaped points are bound by the cores; without an unshaped point to
    compare with, the link is assumed to bind."""
    if row["rate_mbit"] is None:
        return False
    free = [r["bus_bandwidth_Bps"] for r in rows if r["rate_mbit"] is None and r["hosts"] == row["hosts"]]
    return not free or row["bus_bandwidth_Bps"] <= 0.5 * free[0]


def add_predictions(result: dict) -> None:
    """Every point's predicted step and error, with the current predictor. Where the cores, not the
    link, bind, the communication runs on the compute's cores and nothing hides (shared_cores)."""
    tensor_bytes = model_tensor_bytes()
    for row in result["points"]:
        row["link_bound"] = link_bound(row, result["points"])
        alone = result["tensor_parallel_compute_s" if row["strategy"] == "tensor" else "compute_s"]
        row["predicted_step_s"] = predict_point(row["strategy"], row["hosts"], row["compute_s"],
                                                result["per_host_batch"], tensor_bytes, row["probe"],
                                                (result["update_s_per_byte"], message_per_byte(result, row["hosts"])),
                                                result.get("tensor_parallel"),
                                                shared_cores=not row["link_bound"],
                                                core_share=row["compute_s"] / alone["1"],
                                                servers=row.get("servers") or 1,
                                                copy_s_per_byte=result["shard_copy_s_per_byte"],
                                                steps_per_epoch=row.get("steps_per_epoch"))
        row["error"] = row["predicted_step_s"] / row["measured_step_s"] - 1
        print(f"{row['strategy']}, {link_label(row['rate_mbit'], row.get('latency_ms'))}, {row['hosts']} workers "
              f"({'the link binds' if row['link_bound'] else 'the cores bind'}): measured "
              f"{row['measured_step_s'] * 1e3:.1f} ms, predicted {row['predicted_step_s'] * 1e3:.1f} ms "
              f"({row['error']:+.0%})")


def server_per_byte(total_bytes: int, counts: list[int]) -> tuple[float, dict[str, float]]:
    """A parameter server's update (the run's optimizer: MODEL's defaults), and its own work on a
    message at each worker count, each per byte, on one thread as each host has (prediction/measure.py)."""
    from scaletrain.config import OptimConfig
    from scaletrain.prediction.measure import optimizer_seconds_per_byte, server_seconds_per_byte
    return on_one_thread(lambda: (optimizer_seconds_per_byte(OptimConfig(lr=0.01), total_bytes),
                                  {str(n): server_seconds_per_byte(total_bytes, workers=n) for n in counts}))


def message_per_byte(result: dict, workers: int) -> float:
    """The server's own work per message byte at `workers` (a single figure in older files)."""
    figure = result["message_s_per_byte"]
    return figure[str(workers)] if isinstance(figure, dict) else figure


def predict_again(source: Path, out: Path) -> None:
    result = json.loads(source.read_text())
    if "message_s_per_byte" not in result:      # a file from before both were measured
        counts = sorted({row["hosts"] for row in result["points"]})
        result["update_s_per_byte"], result["message_s_per_byte"] = server_per_byte(result["grad_bytes"], counts)
    if "shard_copy_s_per_byte" not in result:   # measured now, on this machine, and kept in --out
        result["shard_copy_s_per_byte"] = shard_copy_per_byte(model_tensor_bytes())
    add_predictions(result)
    out.write_text(json.dumps(result, indent=2))
    print(f"written to {out}")


def link_label(rate, latency) -> str:
    return (f"{rate:,} Mbit/s" if rate else "unshaped") + (f" + {latency:g} ms" if latency is not None else "")


def measure_hosts(all_hosts, n: int, servers: int, rate, latency, strategies, args, workdir, compute, tp_compute):
    """Probes the first n hosts, then trains each strategy on them (a parameter server on the
    `servers` hosts after them): one row per strategy."""
    hosts = all_hosts[:n]
    probed = probe(hosts)
    rows = []
    for name in strategies:
        on = all_hosts if name == "ps" else hosts
        # The cores' idle share over the runs: a point where they idle while the step is slow waits on
        # the link (tensor parallelism at 4 hosts over 1 Gbit/s: 54 % idle), not on this machine.
        before = cpu_ticks()
        runs = [train_step_time(on, args.batch, args.epochs, workdir, name, servers if name == "ps" else 0)
                for _ in range(args.repeats)]
        cores_idle = idle_share(before, cpu_ticks())
        times = [t for t, _ in runs]
        measured = statistics.median(times)
        compute_s = tp_compute[n] if name == "tensor" else compute[n]
        bandwidth, hop = fit_link(probed, n)
        row = {"strategy": name, "rate_mbit": rate, "latency_ms": latency, "hosts": n,
               "servers": servers if name == "ps" else 0, "bus_bandwidth_Bps": bandwidth, "hop_latency_s": hop,
               "p2p_bandwidth_Bps": 1 / fit(probed["p2p"])[1], "factors": algorithm_factors(probed),
               "probe": probed, "compute_s": compute_s, "measured_step_s": measured, "measured_runs_s": times,
               "steps_per_epoch": runs[0][1], "cores_idle": cores_idle}
        rows.append(row)
        print(f"{name}, {link_label(rate, latency)}, {n} workers: bus {bandwidth * 8 / 1e6:,.0f} Mbit/s, "
              f"{hop * 1e6:.0f} us/hop, factors " + " ".join(f"{k} {v:.2f}" for k, v in row["factors"].items())
              + f"; step measured {measured * 1e3:.1f} ms ({', '.join(f'{t * 1e3:.1f}' for t in times)}), "
              f"cores {cores_idle:.0%} idle", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rates", default="1000,10000", help="link rates in Mbit/s (comma-separated)")
    parser.add_argument("--hosts", default="2,4,8", help="worker counts (comma-separated)")
    parser.add_argument("--strategies", default="ddp,fsdp,ps",
                        help="ddp, fsdp, zero2, zero1, ps, tensor (comma-separated; ps adds one server host; "
                             "tensor splits gpt-tiny's blocks over the hosts, 4 heads: up to 4)")
    parser.add_argument("--latency-ms", default=None,
                        help="one-way latencies to add at each rate (comma-separated, ms): the hosts are then joined "
                             "by benchmarks/link_switch.py instead of tbf-shaped veths (this kernel has no netem); "
                             "'tbf' in the list also runs the tbf-shaped veths, to compare the two")
    parser.add_argument("--servers", type=int, default=1, help="parameter servers, each on a host of its own")
    parser.add_argument("--unshaped", action=argparse.BooleanOptionalAction, default=True,
                        help="also run on the unshaped bridge")
    parser.add_argument("--batch", type=int, default=16, help="per-host batch")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="training runs per point (median, min-max)")
    parser.add_argument("--out", default="shaped_links.json")
    parser.add_argument("--predict-again", metavar="FILE",
                        help="no measuring: recompute FILE's predictions with the current predictor, from the "
                             "probes and compute times it holds, and write them to --out")
    args = parser.parse_args()
    if args.probe_worker:
        return probe_worker()
    # SIGTERM as an exit, so that the hosts' namespaces and the switch are cleaned up (finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.predict_again:
        return predict_again(Path(args.predict_again), Path(args.out))
    import torch

    from benchmarks.common import environment
    workdir = Path(tempfile.mkdtemp(prefix="shaped-"))
    tensor_bytes = model_tensor_bytes()
    S = sum(tensor_bytes)
    counts = [int(h) for h in args.hosts.split(",")]
    per_byte = server_per_byte(S, counts)
    # The compute each host has: n processes training at once on this machine's cores, no links.
    strategies = args.strategies.split(",")
    compute = {n: statistics.median(concurrent_step_time(n, args.batch, args.epochs, workdir) for _ in range(2))
               for n in sorted({1, *counts})} if set(strategies) - {"tensor"} else {1: 0.0}
    print(f"gradients {S / 2**20:.1f} MiB; compute per step at batch {args.batch}: "
          + ", ".join(f"{n} at once {t * 1e3:.2f} ms" for n, t in compute.items()), flush=True)
    tp, tp_compute = None, {}
    if "tensor" in strategies:
        tp = tensor_parallel_traffic(args.batch)
        tp_compute = {n: statistics.median(concurrent_step_time(n, args.batch, args.epochs, workdir, TP_MODEL)
                                           for _ in range(2)) for n in sorted({1, *counts})}
        print(f"tensor parallel: {tp}; the whole model's step: "
              + ", ".join(f"{n} at once {t * 1e3:.2f} ms" for n, t in tp_compute.items()), flush=True)
    result = {"environment": environment(torch.device("cpu")), "one_process_step_s": compute[1],
              "compute_s": {str(n): t for n, t in compute.items()}, "grad_bytes": S, "per_host_batch": args.batch,
              "update_s_per_byte": per_byte[0], "message_s_per_byte": per_byte[1],
              "shard_copy_s_per_byte": shard_copy_per_byte(tensor_bytes), "tensor_parallel": tp,
              "tensor_parallel_compute_s": {str(n): t for n, t in tp_compute.items()}, "points": []}
    rates = ([None] if args.unshaped else []) + [int(r) for r in args.rates.split(",")]
    # tbf shapes the rate alone; an added latency needs the user-space switch (link_switch.py).
    latencies = [None if ms == "tbf" else float(ms) for ms in args.latency_ms.split(",")] if args.latency_ms else [None]
    for rate in rates:
        for latency in latencies if rate else [None]:
            for n in counts:
                servers = args.servers if "ps" in strategies else 0
                joined = (switched_hosts(n + servers, rate, latency) if latency is not None
                          else shaped_hosts(n + servers, rate))
                with joined as all_hosts:
                    result["points"] += measure_hosts(all_hosts, n, servers, rate, latency, strategies, args, workdir,
                                                      compute, tp_compute)
                # What is measured so far, in case the rest does not finish (no predictions yet).
                Path(args.out).write_text(json.dumps({**result, "partial": True}, indent=2))
    add_predictions(result)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
