"""Part g: everything that compiles, last, since each case spends about a minute compiling.
The compiled half of seed 000/001's table (part c's model, batch and measurement: bf16-mixed
compiled and compiled + CUDA-graph fusing first, then the other precisions), and part d's compiled
pair: a hand-written bf16 + channels_last + torch.compile loop against scaletrain with the same
settings plus CUDA-graph fusing. The compilation time of each is reported as its warm-up.
"""

from __future__ import annotations

from benchmarks.gpu import peers, precision
from benchmarks.gpu.kit import Part, Skip, case

TITLE = "compiled"
LIMIT_S = 200.0

ORDER = ([("bf16-mixed", "compiled", True, False), ("bf16-mixed", "compiled + graphs", True, True)]
         + [(p, "compiled", True, False) for p in ("tf32", "fp16-mixed", "fp32")]
         + [(p, "compiled + graphs", True, True) for p in ("tf32", "fp16-mixed", "fp32")])


def run(part: Part) -> None:
    s = peers.sizes(part)

    def compiled(fn):
        def run_it():
            if part.rehearse:
                raise Skip("the rehearsal does not compile (minutes on a CPU; the suite tests compile)")
            return fn()
        return run_it

    # The peers first: one pair answers "is scaletrain's compiled step as fast as a hand one".
    case(part, "hand loop, bf16 + channels_last + compile", compiled(lambda: peers.hand_loop(part, s, True, tf32=None)),
         kind="peer")
    case(part, "scaletrain, bf16-mixed + channels_last + compile + CUDA-graph fusing",
         compiled(lambda: peers.scaletrain_loop(part, s, "bf16-mixed", channels_last=True, compiled=True,
                                                graphs=part.cuda)), kind="peer")
    precision.table(part, ORDER)
