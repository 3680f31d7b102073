"""The default recipe's speed under another process's load: scaletrain's default thread count (no
--threads, no OMP_NUM_THREADS) against 1 thread, torch's default of one per core, and one per core
with OpenMP's passive wait policy, with 0, 1 or more busy loops beside it (one busy loop on the
2-core CPU is the laptop or shared box with one core taken).

    python benchmarks/threads_under_load.py --loads 0,1 --repeats 5
    python benchmarks/threads_under_load.py --loads 3 --arms auto,1 --repeats 3

Each run is `scaletrain train` (the default recipe) as a process of its own, arms interleaved
(A B C D, B C D A, ...) so the machine's drift hits every arm alike; the busy loops run for the
whole of a load's rounds. Reported per arm and load: steady-state images/sec (the summary's:
epochs after the first), time to 94 % and training time, median (min-max); and the auto arm's
speed over the 1-thread arm's, paired by round (issue 64's goal under one busy loop: >= 0.8).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import environment  # noqa: E402

ARMS = {
    "auto": ([], {}),                                   # scaletrain's default: no flag, no OMP_NUM_THREADS
    "1": (["--threads", "1"], {}),
    "cores": (["--threads", str(len(os.sched_getaffinity(0)))], {}),    # torch's own default
    "cores-passive": (["--threads", str(len(os.sched_getaffinity(0)))], {"OMP_WAIT_POLICY": "PASSIVE"}),
}


def busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def one(arm: str, seed: int, folder: Path, extra: list[str]) -> dict:
    flags, env_extra = ARMS[arm]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    env.update(env_extra)
    summary = folder / "summary.json"
    argv = [sys.executable, "-m", "scaletrain", "train", *flags, *extra, "--seed", str(seed), "--run-dir",
            str(folder / "run"), "--summary-json", str(summary), "--no-progress", "--no-record"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{arm}: scaletrain train exited {done.returncode}: {done.stderr.strip()[-400:]}")
    s = json.loads(summary.read_text())
    settings = next((line for line in done.stdout.splitlines() if line.startswith("settings:")), "")
    threads = next((part.split("(")[0].strip() for part in settings.split(";") if part.strip().startswith("threads")),
                   "?")
    return {"images_per_sec": s["images_per_sec"], "time_to_94": s["time_to_target_s"], "train_s": s["train_time_s"],
            "threads": threads}


def spread(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{statistics.median(values):,.2f} ({min(values):,.2f}-{max(values):,.2f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loads", default="0,1", help="busy loops beside the runs, one series per value")
    p.add_argument("--arms", default="auto,1,cores,cores-passive")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--extra", default="", help="flags every run gets, e.g. '--epochs 3'")
    args = p.parse_args()
    arms = args.arms.split(",")
    print(json.dumps(environment(__import__("torch").device("cpu"))), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for load in map(int, args.loads.split(",")):
            loops = busy_loops(load)
            try:
                rows: dict[str, list[dict]] = {a: [] for a in arms}
                for r in range(args.repeats):
                    order = arms[r % len(arms):] + arms[:r % len(arms)]
                    for arm in order:
                        row = one(arm, r, Path(tmp) / f"{load}-{arm}-{r}", args.extra.split())
                        rows[arm].append(row)
                        print(f"load {load} round {r} {arm}: {json.dumps(row)}", flush=True)
            finally:
                for loop in loops:
                    loop.kill()
                    loop.wait()
            print(f"\n# {load} busy loop(s), {args.repeats} rounds")
            for arm in arms:
                rs = rows[arm]
                print(f"{arm:14s} images/s {spread([x['images_per_sec'] for x in rs])}  time to 94 % "
                      f"{spread([x['time_to_94'] for x in rs])} s  training {spread([x['train_s'] for x in rs])} s  "
                      f"threads {sorted({x['threads'] for x in rs})}")
            if "auto" in arms and "1" in arms:
                ratios = sorted(a["images_per_sec"] / b["images_per_sec"] for a, b in zip(rows["auto"], rows["1"], strict=True))
                print(f"auto / 1 thread, paired by round: {statistics.median(ratios):.2f} "
                      f"({ratios[0]:.2f}-{ratios[-1]:.2f})", flush=True)


if __name__ == "__main__":
    main()
