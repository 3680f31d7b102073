"""How soon a stopped training is gone, every process of it: a run whose loader workers hang in a
user's read (tests/plugins/hung_stream.py) is stopped once it has trained a step and its workers
hang, by SIGTERM to the CLI (one process, 2 loader workers) or to the launcher of `--nproc 2`, and
the time from the signal to the moment no process names its run folder is read. tests/test_trust.py checks that they end (and the
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


def one_stop(work: Path, name: str, extra: list[str], stop: signal.Signals = signal.SIGTERM) -> float:
    """Seconds from the signal `stop` to the last process of the run gone (killed after 60 s). A
    SIGKILLed launcher's ranks get SIGTERM from the kernel as it dies (distributed/env.py)."""
    run_dir, marks = work / name, work / f"{name}.marks"
    marks.mkdir()
    argv = [sys.executable, "-m", "scaletrain", "train", "--model", "faulty_models:stepping_mlp",
            "--model-option", f"marks={marks}", "--data", "hung_stream:splits",
            "--data-option", "n=2048", "--data-option", "reads=80", "--num-workers", "2", "--epochs", "2",
            "--batch-size", "16", "--no-progress", "--no-record", "--run-dir", str(run_dir), *extra]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HUNG_STREAM_MARKS=str(marks),
               PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))
    ranks = 2 if "--nproc" in extra else 1
    log = work / f"{name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # Stopped as tests/test_trust.py stops it: each rank's first step ended, every loader worker
        # hung in a read (the plugins mark both). The signal lands in a step or in the wait for the
        # next batch, as it happens.
        def stuck():
            names = [p.name for p in marks.iterdir()]
            return (sum(n.startswith("stepped-") for n in names) == ranks
                    and sum(n.startswith("hung-") for n in names) == 2 * ranks)
        deadline = time.monotonic() + 120
        while not stuck() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if proc.poll() is not None or not stuck():
            raise RuntimeError(f"the run did not train and hang: {log.read_text()[-500:]}")
        sent = time.monotonic()
        proc.send_signal(stop)
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
        for label, extra, stop in (("one process, 2 loader workers", [], signal.SIGTERM),
                                   ("--nproc 2, 2 loader workers each", ["--nproc", "2"], signal.SIGTERM),
                                   ("--nproc 2, the launcher SIGKILLed", ["--nproc", "2"], signal.SIGKILL)):
            took = [one_stop(Path(tmp), f"{label[:3]}{stop}{i}".replace(" ", ""), extra, stop) for i in range(args.tries)]
            results[label] = {"median_s": round(statistics.median(took), 2), "max_s": round(max(took), 2),
                              "tries": [round(t, 2) for t in took]}
            print(f"{label}: {stop.name} to every process gone: median {results[label]['median_s']} s, "
                  f"max {results[label]['max_s']} s over {args.tries} tries", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
