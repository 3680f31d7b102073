"""Does a probe slow the steps a process trains after it? (issue 95's small-GPT gap)

With no flags the small GPT's whole run took 1.2-3.0 s longer than `--precision bf16-mixed`
named, beyond the probe's own seconds, in 4 rounds of 5 (BENCHMARKS.md). If the probe's copies
leave something behind (a fragmented heap, threads, caches), the run's own steps would be slower
after it. Here each round is two fresh processes, one after the other (their order alternating):
one probes first (the run's own probe, `probed_settings`, with `--probe-share 1`), the other does
not; then each trains the run's copy in the precision the probe chose (bf16-mixed named) three
times, 60 steps each after 5 untimed, and reports each copy's median step time over 10-step
windows.

    python benchmarks/probe_aftermath.py --case small-gpt --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.no_flags import CASES  # noqa: E402


def child(case: str, probe_first: bool) -> dict:
    import copy

    import torch

    from scaletrain.cli.main import build_parser
    from scaletrain.cli.train import config_from_args
    from scaletrain.data import load_dataset
    from scaletrain.training.build import build_training, set_thread_pools, task_for
    from scaletrain.training.defaults import Setting
    from scaletrain.training.probe import Arm
    from scaletrain.training.probe_settings import probed_settings
    cfg = config_from_args(build_parser().parse_args(["train", *CASES[case].cli(), "--no-progress",
                                                      "--precision", "bf16-mixed", "--no-compile"]))
    cfg.tracking.record, cfg.checkpoint.every = False, 0
    dataset = load_dataset(cfg.data, seed=cfg.seed)
    task = task_for(cfg, dataset)
    set_thread_pools(cfg)
    probe_s, chose = 0.0, None
    if probe_first:
        asked = copy.deepcopy(cfg)
        asked.precision.policy, asked.probe_share = "fp32", 1.0
        started = time.perf_counter()
        probed_settings(asked, dataset, task, [Setting("precision", "fp32", "auto: the rule")], "aftermath",
                        torch.device("cpu"), say=lambda _line: None)
        probe_s, chose = time.perf_counter() - started, asked.precision.policy

    def copy_step_s() -> float:
        arm = Arm(build_training(copy.deepcopy(cfg), dataset=dataset, task=task, checked=True).trainer, dataset)
        arm.window(5)
        windows = [arm.window(10)[0] / 10 for _ in range(6)]
        arm.close()
        return statistics.median(windows)
    return {"probe_s": probe_s, "chose": chose, "step_ms": [round(copy_step_s() * 1000, 2) for _ in range(3)]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=sorted(CASES), default="small-gpt")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", choices=("probe", "none"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.case, args.child == "probe")))
        return
    found: dict[str, list[float]] = {"probe": [], "none": []}
    for r in range(args.rounds):
        for side in (("none", "probe") if r % 2 == 0 else ("probe", "none")):
            with tempfile.TemporaryDirectory() as cache:     # an empty probe cache: the probe measures
                done = subprocess.run([sys.executable, __file__, "--case", args.case, "--child", side],
                                      capture_output=True, text=True, check=True,
                                      env={**os.environ, "XDG_CACHE_HOME": cache})
            row = json.loads(done.stdout.strip().splitlines()[-1])
            print(json.dumps({"round": r, "side": side, **row}), flush=True)
            found[side] += row["step_ms"]
    import torch
    print(f"\n## {args.case}: the run's step in a process that probed first, and in one that did not, "
          f"{args.rounds} rounds")
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}")
    for side, label in (("none", "no probe before"), ("probe", "after a probe")):
        steps = found[side]
        print(f"{label:16s} {statistics.median(steps):.1f} ms a step ({min(steps):.1f}-{max(steps):.1f})")
    print(f"after a probe / without: {statistics.median(found['probe']) / statistics.median(found['none']):.3f}")


if __name__ == "__main__":
    main()
