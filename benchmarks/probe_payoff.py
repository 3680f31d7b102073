"""Does the probe pay? `scaletrain train` with no flags (the probe deciding the precision, from an
empty cache each time: its whole cost) beside the same run with each precision named, as whole
processes, interleaved round by round (A B C, B C A, ...). Each run's figure is its whole wall time
(summary.json's wall_time_s: from the command's start to its end, the probe included) and its test
accuracy; a round's ratio is no flags' over each named run's.

    python benchmarks/probe_payoff.py --rounds 5                          # the default recipe (not probed: too short)
    python benchmarks/probe_payoff.py --rounds 3 -- --epochs 20           # long enough to probe
    python benchmarks/probe_payoff.py --recipe none --rounds 3 -- --model gpt --data char-corpus ...
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


RECIPE = ["--recipe", "mnist1d-cnn"]


def one_run(extra: list[str], named: list[str], cache: str | None = None) -> dict:
    with tempfile.TemporaryDirectory() as root:
        run = Path(root) / "run"
        # The probe's cache empty each time (its whole cost) unless `cache` is given (a decision kept
        # from an earlier run); the data set's cache shared (data/cache.py).
        env = {**os.environ, "XDG_CACHE_HOME": cache or str(Path(root) / "cache"),
               "SCALETRAIN_CACHE_DIR": os.environ.get("SCALETRAIN_CACHE_DIR", str(Path.home() / ".cache" / "scaletrain"))}
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "scaletrain", "train", *RECIPE, "--no-progress",
                               "--run-dir", str(run), "--store", str(Path(root) / "runs.db"), *extra, *named],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
        summary = json.loads((run / "summary.json").read_text())
        settings = next(line for line in done.stdout.splitlines() if line.startswith("settings:"))
        return {"wall_s": summary["wall_time_s"], "process_s": time.perf_counter() - started,
                "probe_s": summary["probe_s"], "precision": summary["precision"],
                "test_accuracy": summary["test_accuracy"], "why": settings.split(";")[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--recipe", default="mnist1d-cnn", help="the recipe every side starts from; none: only the flags")
    p.add_argument("extra", nargs="*", help="flags after --, given to every side")
    args = p.parse_args()
    global RECIPE
    RECIPE = [] if args.recipe == "none" else ["--recipe", args.recipe]
    sides = {"no flags": [], "no flags, cached": [], "fp32 named": ["--precision", "fp32"],
             "bf16-mixed named": ["--precision", "bf16-mixed"]}
    names = list(sides)
    kept = tempfile.mkdtemp(prefix="probe-cache-")
    one_run(args.extra, [], kept)      # untimed: the decision the cached side starts from
    found: dict[str, list[dict]] = {n: [] for n in names}
    loads = []
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            loads.append(os.getloadavg()[0])
            result = one_run(args.extra, sides[name], kept if name == "no flags, cached" else None)
            found[name].append(result)
            print(json.dumps({"round": r, "side": name, **result}), flush=True)
    import torch

    from benchmarks.step_cost import cpu_name
    print(f"\n## {' '.join(RECIPE) or 'no recipe'} {' '.join(args.extra)}: whole runs, {args.rounds} rounds")
    print(f"# {cpu_name()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}, "
          f"1-min load {min(loads):.2f}-{max(loads):.2f}")

    def spread(values, fmt=".3f"):
        return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"
    for n in names:
        runs = found[n]
        chosen = sorted({x['precision'] for x in runs})
        print(f"{n:17s} wall {spread([x['wall_s'] for x in runs], '.2f')} s, probe "
              f"{spread([x['probe_s'] for x in runs], '.2f')} s, test acc "
              f"{spread([x['test_accuracy'] for x in runs])}, ran {', '.join(chosen)}")
    for n in names[1:]:
        ratios = [a["wall_s"] / b["wall_s"] for a, b in zip(found[names[0]], found[n], strict=True)]
        print(f"no flags / {n:17s} {spread(ratios)}")
    print("no flags said: " + found[names[0]][-1]["why"])


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
