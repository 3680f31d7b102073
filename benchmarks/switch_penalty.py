"""Does a window of one precision slow the next window of another? (issue 95's lead)

The probe's arms take turns window by window: fp32 (the reference), its second copy (the noise)
and bf16-mixed. On the small GPT one probe read the fp32 copy ±42 % against itself, the slow
window being the fp32 copy's right after the bf16 copy's. If switching precision costs the next
window (caches, weight layouts, the core's clock), the noise and the verdict are biased.

Here three copies of the run, built as the probe builds them (training/probe_settings.py), train
windows in a fixed pattern, and the fp32 copy's window time is compared by what ran just before it:
its own second copy (fp32 after fp32) or the bf16 copy (fp32 after bf16). Pairs alternate
(B A, C A, B A, C A, ...) so the machine's drift falls on both.

    python benchmarks/switch_penalty.py --case small-gpt --pairs 20 --window 4
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.no_flags import CASES  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=sorted(CASES), default="small-gpt")
    p.add_argument("--pairs", type=int, default=20, help="pairs of each kind (fp32 after fp32, fp32 after bf16)")
    p.add_argument("--window", type=int, default=4, help="steps a window")
    args = p.parse_args()
    import torch

    from scaletrain.cli.main import build_parser
    from scaletrain.cli.train import config_from_args
    from scaletrain.data import load_dataset
    from scaletrain.training.build import set_thread_pools, task_for
    from scaletrain.training.probe_settings import _arm_maker
    parser = build_parser()
    cfg = config_from_args(parser.parse_args(["train", *CASES[args.case].cli(), "--no-progress"]))
    dataset = load_dataset(cfg.data, seed=cfg.seed)
    task = task_for(cfg, dataset)
    threads = set_thread_pools(cfg).setting.value
    make_arm = _arm_maker(cfg, dataset, task, threads, None, torch.device("cpu"))
    arms = {"A": make_arm("fp32"), "B": make_arm("fp32"), "C": make_arm("bf16-mixed")}
    for arm in arms.values():
        arm.window(2)    # allocation and kernel selection
    after = {"B": [], "C": []}
    for i in range(2 * args.pairs):
        before = "B" if i % 2 == 0 else "C"
        arms[before].window(args.window)
        took, _ = arms["A"].window(args.window)
        after[before].append(took / args.window)
    for arm in arms.values():
        arm.close()
    ratio = [c / b for b, c in zip(after["B"], after["C"], strict=True)]
    print(json.dumps({"after_fp32_ms": [round(1000 * t, 2) for t in after["B"]],
                      "after_bf16_ms": [round(1000 * t, 2) for t in after["C"]]}))
    print(f"\n## {args.case}: the fp32 copy's step by what ran before it, {args.pairs} pairs of {args.window}-step "
          f"windows, {threads} thread(s)")
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"fp32 after fp32: {statistics.median(after['B']) * 1000:.2f} ms a step "
          f"({min(after['B']) * 1000:.2f}-{max(after['B']) * 1000:.2f})")
    print(f"fp32 after bf16: {statistics.median(after['C']) * 1000:.2f} ms a step "
          f"({min(after['C']) * 1000:.2f}-{max(after['C']) * 1000:.2f})")
    print(f"after bf16 / after fp32, pair by pair: {statistics.median(ratio):.3f} ({min(ratio):.3f}-{max(ratio):.3f})")


if __name__ == "__main__":
    main()
