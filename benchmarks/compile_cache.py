"""A compiled run's warm-up, cold and from the compile cache: `scaletrain train --compile` twice
in a new, empty cache folder (XDG_CACHE_HOME; parallelize.py keeps inductor's cache there), the
first compiling from nothing, the second reading what the first kept. Each figure is the run's
own compile / warm-up (summary.json's warmup_s) and its whole wall time; pairs repeat in new
folders, and the figures are medians with ranges.

    python benchmarks/compile_cache.py --pairs 3
    python benchmarks/compile_cache.py --pairs 3 -- --recipe char-gpt --epochs 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(cache: Path, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as root:
        run = Path(root) / "run"
        env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
        env.update(XDG_CACHE_HOME=str(cache),
                   SCALETRAIN_CACHE_DIR=os.environ.get("SCALETRAIN_CACHE_DIR", str(Path.home() / ".cache" / "scaletrain")))
        done = subprocess.run([sys.executable, "-m", "scaletrain", "train", "--compile", "--epochs", "1", "--no-progress",
                               "--run-dir", str(run), "--store", str(Path(root) / "runs.db"), *extra],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
        summary = json.loads((run / "summary.json").read_text())
        return {"warmup_s": summary["warmup_s"], "wall_s": summary["wall_time_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("extra", nargs="*", help="flags for scaletrain train (after --)")
    args = parser.parse_args()
    cold, warm = [], []
    for n in range(args.pairs):
        with tempfile.TemporaryDirectory() as cache:
            first, second = one_run(Path(cache), args.extra), one_run(Path(cache), args.extra)
        cold.append(first)
        warm.append(second)
        print(f"pair {n + 1}: warm-up {first['warmup_s']:.2f} s cold, {second['warmup_s']:.2f} s from the cache; "
              f"wall {first['wall_s']:.2f} s, {second['wall_s']:.2f} s", flush=True)

    def spread(rows, key):
        values = [r[key] for r in rows]
        return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"
    print(f"warm-up: cold {spread(cold, 'warmup_s')}, from the cache {spread(warm, 'warmup_s')}")
    print(f"wall:    cold {spread(cold, 'wall_s')}, from the cache {spread(warm, 'wall_s')}")


if __name__ == "__main__":
    main()
