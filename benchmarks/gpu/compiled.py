"""Part g: everything that compiles, last, since each case spends about a minute compiling.
First part d's equal-settings table with torch.compile: scaletrain, a hand loop and Lightning each
given bf16-mixed + channels_last + compile (peer_arms.py; compilation inside the untimed first
epoch, its time reported as the warm-up where the side reports one); then the compiled half of
seed 000/001's table (part c's model, batch and measurement: bf16-mixed compiled and compiled +
CUDA-graph fusing first, then the other precisions).
"""

from __future__ import annotations

from benchmarks.gpu import peers, precision
from benchmarks.gpu.kit import Part, Skip, case
from benchmarks.peer_arms import ARMS, Equal

TITLE = "compiled"
LIMIT_S = 200.0
EQUAL_COMPILED = Equal(precision="bf16-mixed", channels_last=True, compile=True)

ORDER = ([("bf16-mixed", "compiled", True, False), ("bf16-mixed", "compiled + graphs", True, True)]
         + [(p, "compiled", True, False) for p in ("tf32", "fp16-mixed", "fp32")]
         + [(p, "compiled + graphs", True, True) for p in ("tf32", "fp16-mixed", "fp32")])


def run(part: Part) -> None:
    s = peers.sizes(part)
    c = peers.wrn_case(part, s)
    flops = peers.flops_per_sample(s, part.device) if part.cuda else None

    def compiled(side):
        def run_it():
            if part.rehearse:
                raise Skip("the rehearsal does not compile (minutes on a CPU; the suite tests compile)")
            return peers.throughput(part, c, peers.run_arm(side, c, EQUAL_COMPILED), EQUAL_COMPILED.precision, flops)
        return run_it

    # The peers first: is scaletrain's compiled step as fast as a hand one and Lightning's.
    for side in ARMS:
        case(part, f"equal settings ({EQUAL_COMPILED.label}): {side}", compiled(side), kind="equal settings",
             side=side)
    precision.table(part, ORDER)
