"""Extra part (its own call, `--parts no_flags`: a call brings back 8 files, and the default
parts fill them): issue 95's whole-run table on the GPU. WRN-16-10 on synthetic 28x28x1 images,
1,200 steps of 512 (48 epochs), each side a fresh process timed from its start to its exit
(benchmarks/no_flags.py runs them), one round:

- **no flags**: `scaletrain train` naming only the workload; the probe decides what it measures
  (the precisions this GPU computes natively, CUDA graphs; compile only where 5 % of the run holds
  one, which this run's does not) within 5 % of the run, from an empty cache;
- **bf16-mixed named**: the rule's choice named (channels_last and cudnn.benchmark by rule);
- **tutorial**: PyTorch's tutorial loop (fp32: TF32 convolutions), batches moved to the GPU;
- **Lightning**: `L.Trainer(max_epochs=48)` with its defaults.

Each row: the whole process's wall time, the precision it ran, the probe's seconds and what the
start line said, the validation accuracy. The notes hold no flags' speed over each other side's.
About 3 minutes on an H200 (estimated from the first GPU run's rates, not yet run).
"""

from __future__ import annotations

from benchmarks.gpu.kit import Part, case

TITLE = "no_flags"
LIMIT_S = 300.0
SIDES = {"no flags": [], "bf16-mixed named": ["--precision", "bf16-mixed"], "tutorial": "tutorial",
         "Lightning": "Lightning"}


def run(part: Part) -> None:
    from benchmarks.no_flags import run_side
    name = "wrn-toy" if part.rehearse else "wrn-16-10"
    part.plan(list(SIDES))
    walls = {}
    for side, how in SIDES.items():
        def one(how=how):
            found = run_side(name, how)
            return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in found.items()}
        row = case(part, side, one, workload=name)
        if row["status"] == "passed":
            walls[side] = row["wall_s"]
    if "no flags" in walls:
        part.note(no_flags_speed_over={side: round(wall / walls["no flags"], 3) for side, wall in walls.items()
                                       if side != "no flags"})
