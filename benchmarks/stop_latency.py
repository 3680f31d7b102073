"""How soon a stopped training is gone, every process of it: a run whose loader workers hang in a
user's read (tests/plugins/hung_stream.py) is stopped once it trains, by SIGTERM to the CLI (one
process, 2 loader workers) or to the launcher of `--nproc 2`, and the time from the signal to the
moment no process names its run folder is read. tests/test_trust.py checks that they end (and the
run is recorded interrupted); this says how soon. Before issue 66 the single run took 11-12 s (the
DataLoader joined each hung worker for 5 s), and 1 try in 5 over 20 s.

  python benchmarks/stop_latency.py --tries 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "tests" / "plugins"


def _processes_of(folder: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if folder in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def one_stop(work: Path, name: str, extra: list[str]) -> float:
    """Seconds from SIGTERM to the last process of the run gone (the run is killed after 60 s)."""
    run_dir = work / name
    argv = [sys.executable, "-m", "scaletrain", "train", "--model", "mlp", "--data", "hung_stream:splits",
            "--data-option", "n=2048", "--data-option", "reads=80", "--num-workers", "2", "--epochs", "2",
            "--batch-size", "16", "--no-progress", "--no-record", "--run-dir", str(run_dir), *extra]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))
    log = work / f"{name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "settings:" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is not None or "settings:" not in log.read_text():
            raise RuntimeError(f"the run did not start: {log.read_text()[-500:]}")
        time.sleep(2.5)                       # its first steps taken, its loader workers hung by now
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        while _processes_of(str(run_dir)) and time.monotonic() - sent < 60:
            time.sleep(0.02)
        return time.monotonic() - sent
    finally:
        for pid in _processes_of(str(run_dir)):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tries", type=int, default=5)
    args = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, extra in (("one process, 2 loader workers", []), ("--nproc 2, 2 loader workers each", ["--nproc", "2"])):
            took = [one_stop(Path(tmp), f"{label[:3]}{i}".replace(" ", ""), extra) for i in range(args.tries)]
            results[label] = {"median_s": round(statistics.median(took), 2), "max_s": round(max(took), 2),
                              "tries": [round(t, 2) for t in took]}
            print(f"{label}: SIGTERM to every process gone: median {results[label]['median_s']} s, "
                  f"max {results[label]['max_s']} s over {args.tries} tries", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
