"""What one all-reduce costs on the shaped links when collectives come as tensor parallelism sends
them: many of one size a step, with compute (here: idle time, so the cores are free) between.

shaped_links.py's probe times each all-reduce alone, after a barrier. Tensor parallelism at 4 hosts
over 1 Gbit/s missed its prediction by -59 %; this separates the link from the cores. Each host
(a network namespace, shaped_links.shaped_hosts or link_switch.switched_hosts) runs `--count`
all-reduces of `--size` bytes, `--gap-ms` apart (a sleep: no compute, no contention for the cores),
`--repeats` times, after a barrier each time; the slowest host's median per all-reduce is printed
beside the wire time a ring needs at the link's rate, 2(N-1)/N * size / rate.

    sudo .venv/bin/python benchmarks/gapped_collectives.py --hosts 2,4 --rate 1000 --gap-ms 0,5
    sudo .venv/bin/python benchmarks/gapped_collectives.py --hosts 4 --rate 1000 --gap-ms 5 --burst 65536,250000

Needs root (namespaces, tc).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PORT = 29641


def worker() -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    count, gap, repeats = int(os.environ["COUNT"]), float(os.environ["GAP_S"]), int(os.environ["REPEATS"])
    tensor = torch.ones(int(os.environ["SIZE"]) // 4)
    for _ in range(3):                      # warm-up: connections and buffers
        dist.all_reduce(tensor)
    per_allreduce = []
    for _ in range(repeats):
        dist.barrier()
        inside = 0.0
        for _ in range(count):
            if gap:
                time.sleep(gap)
            start = time.perf_counter()
            dist.all_reduce(tensor)
            inside += time.perf_counter() - start
        per_allreduce.append(inside / count)
    # An all-reduce is done when every host has the sum: the slowest host's median.
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, statistics.median(per_allreduce))
    rank = dist.get_rank()
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(max(everyone)))


def measure(hosts, size: int, count: int, gap_s: float, repeats: int) -> float:
    from benchmarks.shaped_links import _in_hosts
    env = lambda rank: {"RANK": str(rank), "WORLD_SIZE": str(len(hosts)), "MASTER_ADDR": hosts[0][3],  # noqa: E731
                        "MASTER_PORT": str(PORT), "SIZE": str(size), "COUNT": str(count), "GAP_S": str(gap_s),
                        "REPEATS": str(repeats)}
    outputs = _in_hosts(hosts, lambda rank: [sys.executable, __file__, "--worker"], env)
    return json.loads(outputs[0].strip().splitlines()[-1])


def numbers(low: float, kind=int):
    """An argparse type: comma-separated numbers, each at least `low` (a bad one: one line, exit 2)."""
    def parse(text: str) -> list:
        try:
            values = [kind(part) for part in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
        if any(v < low for v in values):
            raise argparse.ArgumentTypeError(f"{text!r}: each must be at least {low:g}")
        return values
    return parse


def number(low: float, kind=int):
    """An argparse type: one number, at least `low`."""
    def parse(text: str):
        values = numbers(low, kind)(text)
        if len(values) != 1:
            raise argparse.ArgumentTypeError(f"{text!r}: one number, please")
        return values[0]
    return parse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--hosts", type=numbers(2), default=[2, 4], help="host counts (comma-separated)")
    parser.add_argument("--rate", type=number(1), default=1000, help="link rate, Mbit/s")
    parser.add_argument("--link", choices=["tbf", "switch"], default="tbf",
                        help="tbf-shaped veths on a bridge, or benchmarks/link_switch.py (no added latency)")
    parser.add_argument("--burst", type=numbers(1500), default=None,
                        help="tbf bursts to compare, bytes (comma-separated; default: shaped_links.py's)")
    parser.add_argument("--gap-ms", type=numbers(0, float), default=[0.0, 5.0], help="idle time before each "
                                                                                     "all-reduce, ms (comma-separated)")
    parser.add_argument("--size", type=number(4), default=2**19, help="bytes per all-reduce (gpt-tiny at batch 16: "
                                                                      "512 KiB)")
    parser.add_argument("--count", type=number(1), default=16, help="all-reduces in a row (gpt-tiny's step: 16)")
    parser.add_argument("--repeats", type=number(1), default=10)
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    if args.worker:
        return worker()
    from benchmarks.link_switch import switched_hosts
    from benchmarks.shaped_links import shaped_hosts
    if args.out and not Path(args.out).resolve().parent.is_dir():
        parser.error(f"--out {args.out}: its folder does not exist")
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces and tc): run it with sudo")
    bursts = args.burst or [None]
    rows = []
    for n in args.hosts:
        for burst in bursts if args.link == "tbf" else [None]:
            joined = (shaped_hosts(n, args.rate, burst) if args.link == "tbf"
                      else switched_hosts(n, args.rate, 0.0))
            with joined as hosts:
                for gap_ms in args.gap_ms:
                    per = measure(hosts, args.size, args.count, gap_ms / 1e3, args.repeats)
                    wire = 2 * (n - 1) / n * args.size / (args.rate * 1e6 / 8)
                    rows.append({"hosts": n, "link": args.link, "rate_mbit": args.rate, "burst": burst,
                                 "gap_ms": gap_ms, "size": args.size, "count": args.count,
                                 "allreduce_s": per, "wire_s": wire})
                    print(f"{n} hosts, {args.link}{f' burst {burst}' if burst else ''}, gap {gap_ms:g} ms: "
                          f"{per * 1e3:.1f} ms per all-reduce, wire {wire * 1e3:.1f} ms ({per / wire:.1f}x)",
                          flush=True)
    if args.out:
        import torch

        from benchmarks.common import environment
        Path(args.out).write_text(json.dumps({"environment": environment(torch.device("cpu")), "rows": rows},
                                             indent=2))


if __name__ == "__main__":
    main()
