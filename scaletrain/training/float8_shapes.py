"""Which linear layers of an fp8 run train in float8, measured on the device (issue 93).

float8 pays only where a layer's matrix products are large enough for the tensor cores' doubled
rate to outrun the casts and scales it adds: torchao's "auto filter" answers that from a fixed
table of H100 thresholds. Here each distinct layer shape of the run's model (the rows its input
has at the run's micro-batch, its IN x OUT) trains its forward and backward alone on this device,
as a bf16 layer under autocast and as torchao's Float8Linear, compiled where the run compiles,
in interleaved rounds with the bf16 layer's second copy as the noise (training/rounds.py, the
probe's and autotune's rule). A shape converts only where float8 beat bf16 by more than the noise
in MIN_ROUNDS_BEYOND_NOISE rounds. The shapes that won are written into the run's configuration
(`--fp8-shapes`), so the record names them and a resume converts the same layers without
measuring; each shape's verdict is kept in the probe's cache (probe_cache.py) under the device,
torch's and torchao's versions, so the next run of the same shapes measures nothing.

This runs only on float8 tensor cores (precision/float8.py `measures_shapes`): emulated, float8
is only ever slower, and torchao's divisibility rule stands.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from scaletrain.precision.float8 import convertible, float8_config, torchao_float8
from scaletrain.training.defaults import Setting
from scaletrain.training.probe_cache import cached_entry, remember
from scaletrain.training.rounds import AGAIN, Confirmation, Measured, confirm

ROUNDS = 5              # at most; confirm() stops once the verdict is settled (3 rounds when clear)
WARMUP = 3              # untimed calls per arm: kernel selection, the compile
WINDOW_S = 0.02         # a window's length: many calls of a small layer, a few of a large one
MAX_WINDOW = 200
BF16, FP8 = "bf16", "fp8"


@dataclass(frozen=True, slots=True)
class LinearShape:
    """One linear layer's matrix products: its input's rows (every leading dimension), IN, OUT."""
    rows: int
    in_features: int
    out_features: int
    bias: bool

    @property
    def name(self) -> str:
        return f"{self.in_features}x{self.out_features}"


def linear_shapes(model: nn.Module, example) -> dict[str, LinearShape]:
    """Each convertible linear layer's shape (by --fp8-shapes' name) in one forward of `example`
    (the model and example on the meta device: shapes only). A shape used at several row counts
    is measured at the largest."""
    found: dict[str, LinearShape] = {}

    def record(module: nn.Linear, args) -> None:
        rows = math.prod(args[0].shape[:-1]) if args and isinstance(args[0], torch.Tensor) else 0
        shape = LinearShape(int(rows), module.in_features, module.out_features, module.bias is not None)
        if shape.name not in found or found[shape.name].rows < shape.rows:
            found[shape.name] = shape

    hooks = [m.register_forward_pre_hook(record) for m in model.modules() if convertible(m)]
    try:
        with torch.no_grad():
            model(example)
    finally:
        for hook in hooks:
            hook.remove()
    return {name: shape for name, shape in found.items() if shape.rows > 0}


class _Layer:
    """One arm: a linear layer's forward and backward under bf16 autocast on `device`, on the
    same input and output gradient every call. `window(k)` times k calls (the device synchronised)."""

    def __init__(self, layer: nn.Module, shape: LinearShape, device: torch.device, compiled: bool):
        generator = torch.Generator(device="cpu").manual_seed(0)
        self.x = torch.randn(shape.rows, shape.in_features, generator=generator).to(device).requires_grad_(True)
        self.grad = torch.randn(shape.rows, shape.out_features, generator=generator).to(device, torch.bfloat16)
        self.device = device
        self.layer = torch.compile(layer) if compiled else layer

    def _call(self) -> None:
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            out = self.layer(self.x)
        out.backward(self.grad.to(out.dtype))

    def window(self, calls: int) -> float:
        self._sync()
        start = time.perf_counter()
        for _ in range(calls):
            self._call()
        self._sync()
        return time.perf_counter() - start

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def measure_shape(shape: LinearShape, options, device: torch.device, compiled: bool,
                  rounds: int = ROUNDS) -> Confirmation:
    """float8 against bf16 for one layer shape: interleaved rounds of `WINDOW_S` windows, the bf16
    layer's second copy as the noise; samples (rows) a second, float8's ratio over bf16's."""
    torch.manual_seed(0)
    base = nn.Linear(shape.in_features, shape.out_features, bias=shape.bias).to(device)
    fp8 = torchao_float8().convert_to_float8_training(nn.Sequential(copy.deepcopy(base)),
                                                        config=float8_config(options))
    arms = {BF16: _Layer(base, shape, device, compiled), AGAIN: _Layer(copy.deepcopy(base), shape, device, compiled),
            FP8: _Layer(fp8, shape, device, compiled)}
    for arm in arms.values():
        arm.window(WARMUP)
    once = max(arms[BF16].window(1), 1e-6)
    calls = max(1, min(MAX_WINDOW, int(WINDOW_S / once)))
    return confirm(BF16, [FP8], rounds, lambda key, _n: Measured(calls / arms[key].window(calls)),
                   lambda v, b: v / b, until_settled=True)[FP8]


def verdict(conf: Confirmation) -> tuple[bool, str]:
    """Whether a shape converts, and its words for the start line."""
    if not conf.ratios:
        return False, "not measured"
    head = f"fp8 {conf.median:.2f}x bf16 ({conf.low:.2f}-{conf.high:.2f}, noise ±{conf.band:.0%})"
    if conf.wins:
        return True, head
    return False, head + (", slower" if conf.slower else ", not beyond the noise in 3 rounds")


def _cache_key(shape: LinearShape, options, device_name: str, compiled: bool) -> str:
    from importlib.metadata import version
    parts = {"float8 shape": [shape.rows, shape.in_features, shape.out_features, shape.bias],
             "recipe": options.fp8_recipe, "device": device_name, "compiled": compiled,
             "torch": torch.__version__, "torchao": version("torchao")}
    return "fp8-" + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _kept(entry: dict | None) -> Confirmation | None:
    """A shape's rounds as the cache kept them; None where none were kept or the entry is not
    ours (the file is the user's: an edited or damaged entry is measured again)."""
    try:
        return Confirmation(FP8, [float(r) for r in entry["ratios"]],
                            noise=Confirmation(AGAIN, [float(r) for r in entry["noise"]]))
    except (KeyError, TypeError, ValueError):
        return None


def choose_shapes(shapes: dict[str, LinearShape], options, device: torch.device, compiled: bool, run_id: str,
                  measure: Callable[..., Confirmation] = measure_shape) -> Setting:
    """The --fp8-shapes value measured for `shapes` (each from the cache where this device measured
    it before), as the run's setting: its value the shapes that convert (or none), its figures each
    shape's rounds."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    chosen, figures, cached = [], {}, 0
    for shape_key, shape in sorted(shapes.items()):
        key = _cache_key(shape, options, name, compiled)
        conf = _kept(cached_entry(key))
        if conf is not None:
            cached += 1
        else:
            conf = measure(shape, options, device, compiled)
            remember(key, {"ratios": conf.ratios, "noise": conf.noise.ratios if conf.noise else []}, run_id)
        converts, words = verdict(conf)
        figures[shape_key] = {"rows": shape.rows, "converts": converts, "ratios": conf.ratios,
                              "noise": conf.noise.ratios if conf.noise else [], "why": words}
        if converts:
            chosen.append(shape_key)
    value = ",".join(chosen) or "none"
    said = "; ".join(f"{key} {'float8' if f['converts'] else 'bf16'}: {f['why']}" for key, f in figures.items())
    where = f", {cached} of {len(shapes)} from the cache" if cached else ""
    return Setting("fp8 shapes", value, f"measured on {name}{where}: {said}" if figures else
                   "no linear layer torchao can convert", figures or None)


def measured_fp8_shapes(cfg, dataset, task, device: torch.device, micro_batch: int, run_id: str) -> Setting | None:
    """Where this run measures its float8 layers (precision/float8.py `measures_shapes`): the
    shapes chosen, written into `cfg` (--fp8-shapes), as the run's setting. None: not measured
    here (named, emulated, no float8 tensor cores) or the model's shapes could not be traced (the
    rule stays: every divisible layer converts, as the setting then says)."""
    from scaletrain.inputs import tensors
    from scaletrain.models.structure import device_of
    from scaletrain.precision.float8 import measures_shapes
    from scaletrain.precision.hardware import device_facts
    from scaletrain.training.preflight import meta_model
    if cfg.precision.policy != "fp8":
        return None
    facts = device_facts(device)
    if not measures_shapes(cfg.precision, facts.kind, facts.capability):
        return None
    try:
        outputs = task.output_size(dataset)
        model = meta_model(cfg, (dataset.input_shape, outputs))
        dtype = tensors(dataset.examples.x)[0].dtype
        with device_of(model):
            example, _ = task.example_batch(micro_batch, tuple(dataset.input_shape), outputs, dtype)
        shapes = linear_shapes(model, example)
    except Exception as exc:   # noqa: BLE001 - a forward the meta device cannot run: torchao's rule stands
        cfg.precision.fp8_shapes = "all"
        return Setting("fp8 shapes", "all", f"torchao's rule: the layer shapes could not be traced "
                                            f"({type(exc).__name__})")
    setting = choose_shapes(shapes, cfg.precision, device, bool(cfg.compile), run_id)
    cfg.precision.fp8_shapes = setting.value
    return setting
