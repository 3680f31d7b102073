"""The system knobs autotune may turn: settings that change how fast a model trains, not what it
learns. Each is a config key with the values worth trying for this model on this machine; the
given configuration's own value always comes first, so the baseline is a candidate like any other.

A knob that changes the arithmetic (precision, 16-bit gradient all-reduce) is marked `numerics`:
its candidates are compared with the baseline's loss under a looser tolerance (search.py) and
flagged in the table. Under --nproc the strategy is a knob too: every data-parallel layout the
memory planner knows (ddp, ZeRO stages, FSDP, HSDP) trains the same model with the same steps,
only their memory and communication differ; search.py drops those the model or the process count
rule out, with the strategy's own reason.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import os
from dataclasses import dataclass

import torch
from torch import nn

from scaletrain.config import TrainConfig
from scaletrain.distributed.strategies.registry import plannable_strategies, strategy_class
from scaletrain.models.blocks import has_repeated_blocks
from scaletrain.options import get_path, set_path
from scaletrain.precision import POLICIES
from scaletrain.precision.hardware import DeviceFacts, precision_warnings
from scaletrain.training.preflight import meta_model


@dataclass(frozen=True, slots=True)
class Knob:
    key: str                    # dotted config key
    values: tuple               # the baseline's value first
    numerics: bool = False      # changes the arithmetic, not only its speed
    # Tried first, each value alone on the baseline, before the sampler models the rest: the knob
    # most likely to matter (precision: "up to 3x", seed 000), whose values a small budget must see.
    first: bool = False

    @property
    def label(self) -> str:
        """The knob's short name (--knobs, the table): the key's last part, `precision` for its policy."""
        return "precision" if self.key == "precision.policy" else self.key.rsplit(".", 1)[-1]


def _strategies(cfg: TrainConfig) -> tuple:
    """The given strategy first (`auto` stands for ddp here), then every other data-parallel
    layout the planner can lay out."""
    own = cfg.distributed.strategy
    same = strategy_class(cfg.distributed, cfg.distributed.nproc).name
    return (own, *(name for name in plannable_strategies() if name not in (own, same)))


def _with_baseline_first(cfg: TrainConfig, key: str, values) -> tuple:
    own = get_path(cfg, key)
    return (own, *(v for v in dict.fromkeys(values) if v != own))


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What the knobs need to know about the model, from one build on the meta device."""
    repeated_blocks: bool
    convolutions_2d: bool


def model_facts(cfg: TrainConfig, input_shape, outputs: int) -> ModelFacts:
    model = meta_model(cfg, (input_shape, outputs))
    return ModelFacts(repeated_blocks=bool(cfg.memory.block_classes) or has_repeated_blocks(model),
                      convolutions_2d=any(isinstance(m, nn.Conv2d) for m in model.modules()))


def _precisions(device: torch.device, options) -> tuple[str, ...]:
    """Every registered policy worth a trial on `device`: never one that is float32 with less TF32
    than PyTorch's default (fp32-strict: slower by construction; it stays the baseline where it is
    given). Off CUDA, TF32 does not exist, so tf32 is fp32 there, and fp16 autocast has no fast
    kernels: neither is worth a trial. Nor is one the device cannot run for real (fp8 off float8
    tensor cores: emulated, it is only slower). `options`: the configuration's PrecisionConfig."""
    default = POLICIES["fp32"]
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    for_real = dataclasses.replace(options, fp8_emulate=False)
    out = []
    for name, p in POLICIES.items():
        if not p.computes_in_16_bit and not p.tf32_convolutions:     # IEEE float32 everywhere
            continue
        if device.type != "cuda" and (p.loss_scaling or (not p.computes_in_16_bit and p != default)):
            continue
        if p.problem(for_real, device.type, capability) is not None:
            continue
        out.append(name)
    return tuple(out)


def emulated_precisions(baseline: str, facts: DeviceFacts) -> dict[str, str]:
    """{policy: why} for the precisions `facts`' device only emulates (no 16-bit units: converted
    to float32 inside every kernel, slower than float32 by construction; a bf16-mixed candidate of
    the default recipe took over 20x the fp32 one's time on a CPU without bfloat16 instructions).
    The search discards them before anything runs; the given configuration's own (`baseline`) is
    always measured."""
    return {name: lines[0] for name, policy in POLICIES.items()
            if name != baseline and (lines := precision_warnings(policy, facts))}


def system_knobs(cfg: TrainConfig, device: torch.device, facts: ModelFacts, streamed: bool) -> list[Knob]:
    """The knobs worth turning for `cfg` on `device`, each with two or more values."""
    cuda = device.type == "cuda"
    knobs = [
        Knob("precision.policy", _with_baseline_first(cfg, "precision.policy", _precisions(device, cfg.precision)),
             numerics=True,
             first=True),
        Knob("compile", _with_baseline_first(cfg, "compile", (False, True))),
    ]
    if cfg.distributed.nproc <= 1 and not cuda:
        # Third, after precision and compile: on a CPU the thread count is the knob most likely to
        # matter next (a busy core halves two threads' speed: BENCHMARKS.md "Threads under load").
        # torch's default (None) is one thread per core; fewer can win for small models (less
        # sync). Under --nproc the launcher gives each worker its share of the cores.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        knobs.append(Knob("threads", _with_baseline_first(cfg, "threads", (1, cores))))
    knobs.append(Knob("steps_per_execution", _with_baseline_first(cfg, "steps_per_execution", (1, 8))))
    if facts.repeated_blocks:
        knobs.append(Knob("memory.activation_checkpointing",
                          _with_baseline_first(cfg, "memory.activation_checkpointing", (False, True))))
    replicas_batch = cfg.per_replica_batch_size or cfg.batch_size
    accumulation = [a for a in (1, 2, 4) if replicas_batch % (a * max(cfg.optim.grad_accum_steps, 1)) == 0
                    or a == cfg.optim.grad_accum_steps]
    dividing = tuple(a for a in accumulation if replicas_batch % a == 0)
    knobs.append(Knob("optim.grad_accum_steps", _with_baseline_first(cfg, "optim.grad_accum_steps", dividing)))
    if streamed:
        knobs.append(Knob("data.num_workers", _with_baseline_first(cfg, "data.num_workers", (0, 2))))
    if facts.convolutions_2d:
        knobs.append(Knob("channels_last", _with_baseline_first(cfg, "channels_last", (False, True))))
    if cfg.distributed.nproc > 1:
        knobs.append(Knob("distributed.strategy", _strategies(cfg)))
        knobs.append(Knob("distributed.grad_compression",
                          _with_baseline_first(cfg, "distributed.grad_compression", ("none", "bf16")), numerics=True))
    return [k for k in knobs if len(k.values) > 1]


def first_candidates(knobs: list[Knob], kept: list[dict]) -> list[dict]:
    """The baseline, then the baseline with one knob's value changed, for each value of each knob
    (`first` knobs, precision, before the others), among the candidates `kept`: what a search
    measures before its sampler combines knobs. Each knob is so judged alone against the given
    configuration: a knob the loss check refuses (16-bit arithmetic) cannot sink another's gain
    that only ever ran beside it (issue 64: under load no 1-thread candidate was measured without a
    refused precision, so the 1-thread gain was never seen)."""
    baseline = kept[0]
    out = [baseline]
    for knob in sorted(knobs, key=lambda k: not k.first):
        out += [c for c in kept if c[knob.key] != baseline[knob.key]
                and all(c[k] == baseline[k] for k in c if k != knob.key)]
    return out


def candidates(knobs: list[Knob]) -> list[dict]:
    """Every combination of the knobs' values, the baseline (all first values) first."""
    return [dict(zip((k.key for k in knobs), combo, strict=True))
            for combo in itertools.product(*(k.values for k in knobs))]


def apply(cfg: TrainConfig, values: dict) -> TrainConfig:
    out = copy.deepcopy(cfg)
    for key, value in values.items():
        set_path(out, key, value)
    out.validate()
    return out
