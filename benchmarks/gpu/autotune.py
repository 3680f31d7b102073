"""Part f: `scaletrain autotune` on WRN-16-2 (CIFAR-sized synthetic data, batch 256) with
`--budget-s 70` inside the part's 80 seconds: up to 8 candidates of 2 epochs of 10 measured steps,
each its own process (5 took 75 s on the H200), compile left out of the search (part `compiled`
measures it; a compiling candidate costs 10-20 s more). The command, its table and its best
configuration come back.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from benchmarks.gpu.kit import Part, case
from scaletrain.distributed.env import scaletrain_command  # the CLI started as scaletrain starts its children

TITLE = "autotune"
LIMIT_S = 80.0
ROOT = Path(__file__).resolve().parents[2]


def command(part: Part, folder: Path) -> list[str]:
    """scaletrain's arguments (started as scaletrain starts its own children)."""
    if part.rehearse:   # (no confirmation round: 3 more cold processes; tests/test_autotune.py confirms on a CPU)
        size = ["--model", "wrn-10-1", "--shape", "3,8,8", "--num-samples", "256", "--batch-size", "32",
                "--trials", "2", "--steps", "3", "--knobs", "steps_per_execution", "--confirm-rounds", "0"]
    else:
        size = ["--model", "wrn-16-2", "--shape", "3,32,32", "--num-samples", "2560", "--batch-size", "256",
                "--trials", "8", "--budget-s", "70", "--steps", "10", "--knobs", "precision,steps_per_execution,channels_last,"
                "activation_checkpointing,grad_accum_steps"]
    return ["autotune", "--data", "synthetic", *size, "--window-epochs", "2",
            "--out", str(folder / "autotune"), "--store", str(folder / "runs.db"), "--no-progress"]


def tune(part: Part) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="scaletrain-gpu-autotune-"))
    args = command(part, folder)
    part.note(command="scaletrain " + " ".join(args))
    done = subprocess.run([*scaletrain_command(), *args], cwd=ROOT, capture_output=True, text=True, timeout=max(part.left_s() - 5, 10))
    print(done.stdout[-4000:], done.stderr[-2000:], flush=True)
    if done.returncode:
        raise RuntimeError(f"autotune exited {done.returncode}: "
                           f"{(done.stderr.strip() or done.stdout.strip() or 'no output').splitlines()[-1]}")
    result = json.loads((folder / "autotune" / "autotune.json").read_text())
    best = next((line for line in done.stdout.splitlines() if line.startswith("best:")), None)
    return {"best": best, "result": result}


def run(part: Part) -> None:
    row = case(part, "autotune", lambda: tune(part))
    result = row.pop("result", None)
    if result is not None:
        trials = result.get("trials") or result.get("rows") or []
        tried = [t for t in trials if t.get("outcome") != "not tried"]
        part.note(trials=len(tried), candidates_not_tried=len(trials) - len(tried))
        for trial in tried:
            part.add({"case": "trial", "status": trial.get("outcome"), **{k: v for k, v in trial.items() if not isinstance(v, (dict, list))},
                      **{f"param {k}": v for k, v in (trial.get("params") or {}).items()}})
