"""`--precision fp8`: float8 training of the model's `nn.Linear` layers through torchao, bf16
autocast for everything else (issue 93).

An H100's dense float8 peak is about twice its bf16 peak; torchtitan trains in float8 through
torchao's `convert_to_float8_training`, which swaps each chosen `nn.Linear` for a `Float8Linear`
that casts its input, weight and gradient to float8 with dynamic scales in every matrix product.
The swap keeps the layer's `weight` and `bias` parameters as they were (float32, under autocast),
and dynamic scaling holds no state: a checkpoint of an fp8 run is a bf16 run's, and the other way
round (tests/test_float8.py).

- **Recipes**: `--fp8-recipe tensorwise` (the default: one scale a tensor, cuBLAS's kernel) or
  `rowwise` (a scale a row, torchtitan's default since it measured about +10 % on 8xH100
  Llama3-8B), torchao's `Float8LinearConfig.from_recipe_name`.
- **Which layers**: a matrix product in float8 needs both of its dimensions divisible by 16
  (`torch._scaled_mm`); a layer that has not, and every layer of a module kept in float32
  (`--fp32-modules`), stays as it is, and the run's notes name them. Of the rest, `--fp8-shapes`
  says which shapes convert: torchao's own "auto filter" is a fixed table of H100 thresholds, so
  on a device with float8 tensor cores `auto` measures each distinct layer shape there, float8
  against bf16 (training/float8_shapes.py), and the run records the shapes that won; elsewhere
  (emulated) `auto` is torchao's divisibility rule, as `all` is.
- **Where**: on CUDA of compute capability 8.9 or newer (Ada, Hopper). Anywhere else only with
  `--fp8-emulate`: the same rounding computed in higher precision, for tests and correctness
  checks, and said to be "emulated, not faster".
- torchao is an optional extra (`pip install scaletrain[fp8]`); without it the flag is refused in
  one line that names the install.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch
from torch import nn

from scaletrain.precision.float32_modules import matching_modules
from scaletrain.precision.policies import PrecisionPolicy, register_policy

FP8_CAPABILITY = (8, 9)       # Ada and Hopper: float8 tensor cores
FP8_RECIPES = ("tensorwise", "rowwise")
FP8_MULTIPLE = 16             # torch._scaled_mm: both dimensions of each operand
MISSING = "--precision fp8 needs torchao: pip install 'scaletrain[fp8]' (or pip install torchao)"


def torchao_installed() -> bool:
    return importlib.util.find_spec("torchao") is not None


def torchao_float8():
    """torchao.float8, imported without the warnings torchao logs as it loads on a machine without
    its CUDA kernels (a CPU: "Failed to load ..._C_cutlass_90a.abi3.so"), which are not errors here."""
    import logging
    quiet = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        import torchao.float8
        import torchao.float8.float8_linear
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
    return torchao.float8


def shape_name(module: nn.Linear) -> str:
    """A linear layer's shape as --fp8-shapes names it: IN x OUT."""
    return f"{module.in_features}x{module.out_features}"


def named_shapes(fp8_shapes: str) -> frozenset[str] | None:
    """The shapes --fp8-shapes names (an empty set: none); None: every divisible shape (auto, all)."""
    if fp8_shapes in ("auto", "all"):
        return None
    return frozenset() if fp8_shapes == "none" else frozenset(fp8_shapes.split(","))


def convertible(module: nn.Module) -> bool:
    """torchao's rule: both dimensions of the layer's matrix products divide by 16."""
    return isinstance(module, nn.Linear) and not (module.in_features % FP8_MULTIPLE or
                                                  module.out_features % FP8_MULTIPLE)


def skipped_reason(name: str, module: nn.Module, kept_fp32: tuple[str, ...],
                   shapes: frozenset[str] | None = None) -> str | None:
    """Why the `nn.Linear` `name` trains in bf16 rather than float8, or None: it converts.
    `shapes`: the shapes that convert (named_shapes; None: every divisible one)."""
    if any(name == kept or name.startswith(kept + ".") for kept in kept_fp32):
        return "kept in float32 (--fp32-modules)"
    if not convertible(module):
        return f"{shape_name(module)}: not divisible by {FP8_MULTIPLE}"
    if shapes is not None and shape_name(module) not in shapes:
        return f"{shape_name(module)}: not among --fp8-shapes"
    return None


def float8_config(options, gathered: bool = False):
    """torchao's Float8LinearConfig for the run's recipe (`options`: its PrecisionConfig), emulated
    where asked; `gathered`: the sharded weights gathered in float8 (tensorwise only)."""
    import dataclasses
    recipe = options.fp8_recipe if options is not None else "tensorwise"
    config = torchao_float8().Float8LinearConfig.from_recipe_name(recipe)
    if options is not None and options.fp8_emulate:
        config = dataclasses.replace(config, emulate=True)
    if gathered and recipe == "tensorwise":
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    return config


def measures_shapes(options, kind: str, capability: tuple[int, int] | None) -> bool:
    """Whether this run measures which shapes convert (training/float8_shapes.py): `auto`, on float8
    tensor cores (emulated, float8 is only ever slower: torchao's rule stands)."""
    return (options.fp8_shapes == "auto" and not options.fp8_emulate and kind == "cuda"
            and capability is not None and capability >= FP8_CAPABILITY)


def _shapes_of(options) -> frozenset[str] | None:
    return named_shapes(options.fp8_shapes) if options is not None else None


@dataclass(frozen=True, slots=True)
class Float8Policy(PrecisionPolicy):
    """bf16 autocast, and torchao's Float8Linear in place of each convertible nn.Linear."""

    def problem(self, options, kind: str, capability: tuple[int, int] | None) -> str | None:
        if not torchao_installed():
            return MISSING
        if options.fp8_emulate:
            return None
        if kind != "cuda":
            return (f"--precision fp8 computes in float8 on a GPU of compute capability 8.9 or newer (Ada, Hopper); "
                    f"this is a {kind} device: --fp8-emulate runs it emulated here (for tests, not faster), or "
                    "use --precision bf16-mixed")
        if capability is not None and capability < FP8_CAPABILITY:
            cc = ".".join(map(str, capability))
            return (f"--precision fp8 needs float8 tensor cores (compute capability 8.9 or newer); this GPU is {cc}: "
                    "use --precision bf16-mixed, or --fp8-emulate to check correctness (not faster)")
        return None

    def convert_module(self, model: nn.Module, fp32_modules=(), options=None, gathered: bool = False) -> nn.Module:
        """torchao's conversion. Under a strategy that gathers the sharded weights for each forward
        (ZeRO-3 and ZeRO-2 sharding), the tensorwise recipe gathers them in float8 (torchao's
        `enable_fsdp_float8_all_gather`: a quarter of float32's bytes, the cast done once before the
        gather instead of after it on every rank); torchao offers it for tensorwise scaling only."""
        model = PrecisionPolicy.convert_module(self, model, fp32_modules)
        config = float8_config(options, gathered)
        kept, shapes = _kept_names(model, tuple(fp32_modules)), _shapes_of(options)
        return torchao_float8().convert_to_float8_training(
            model, config=config,
            module_filter_fn=lambda module, name: skipped_reason(name, module, kept, shapes) is None)

    def planned_activation_bytes(self, traced: int, model: nn.Module, options=None) -> int:
        """The planner traces fp8 as bf16-mixed (its autocast), where each linear layer keeps a bf16
        copy of its weight for the backward. torchao's Float8Linear keeps its input (bf16) and the
        float32 weight itself (`save_for_backward(input_hp, weight_hp_t)`): a converted layer's copy
        is not held. Its float8 casts (1 byte an element of the layer's input, weight and output
        gradient) live only during that layer's matrix products, and the largest weight's is added
        as that transient; its input's, which grows with the batch, is left out."""
        kept = _kept_names(model, tuple(options.fp32_modules) if options is not None else ())
        converted = [m.weight.numel() for name, m in model.named_modules()
                     if isinstance(m, nn.Linear) and skipped_reason(name, m, kept, _shapes_of(options)) is None]
        copy_bytes = self.autocast_dtype.itemsize * sum(converted)
        return max(traced - copy_bytes, 0) + max(converted, default=0)

    def notes(self, model: nn.Module, options=None) -> list[str]:
        Float8Linear = torchao_float8().float8_linear.Float8Linear
        converted = sum(1 for m in model.modules() if isinstance(m, Float8Linear))
        kept = _kept_names(model, tuple(options.fp32_modules) if options is not None else ())
        skipped = {name: skipped_reason(name, m, kept, _shapes_of(options)) or "not converted"
                   for name, m in model.named_modules()
                   if isinstance(m, nn.Linear) and not isinstance(m, Float8Linear)}
        recipe = options.fp8_recipe if options is not None else "tensorwise"
        gathered = any(m.config.enable_fsdp_float8_all_gather for m in model.modules() if isinstance(m, Float8Linear))
        out = [f"fp8 ({recipe}): {converted} linear layer(s) in float8"
               + (", their sharded weights gathered in float8" if gathered else "") + ", the rest in bf16 autocast"
               + (f"; kept out: {', '.join(f'{n} ({why})' for n, why in skipped.items())}" if skipped else "")]
        absent = sorted((_shapes_of(options) or set()) - {shape_name(m) for m in model.modules()
                                                          if isinstance(m, nn.Linear)})
        if absent:    # a shape named by hand that no layer has: likely a typo, said rather than ignored
            out.append(f"--fp8-shapes names {', '.join(absent)}, which no linear layer of this model has (IN x OUT: "
                       "in_features x out_features)")
        if options is not None and options.fp8_emulate:
            out.append("fp8 emulated (--fp8-emulate): float8's rounding computed in higher precision, for tests and "
                       "correctness checks, not faster")
        return out



def _kept_names(model: nn.Module, fp32_modules: tuple[str, ...]) -> tuple[str, ...]:
    """The qualified names of the modules --fp32-modules names (float32_modules.py's matching)."""
    return tuple(matching_modules(model, fp32_modules)) if fp32_modules else ()

register_policy("fp8", cls=Float8Policy, autocast_dtype=torch.bfloat16, tf32_matmul=True)
