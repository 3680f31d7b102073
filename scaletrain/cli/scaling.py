"""`scaletrain scaling`: measure one device, predict 1..64 devices. What is predicted for a strategy
is its traffic pattern's predictor (prediction/predictors.py); this command measures and renders."""

from __future__ import annotations

import argparse
import json
import math
import sys

from rich.table import Table

from scaletrain.cli.flags import add_number
from scaletrain.console import make_console
from scaletrain.errors import ConfigError
from scaletrain.prediction.hardware import H100_PEAK, INTERCONNECTS


def add_scaling_arguments(parser: argparse.ArgumentParser) -> None:
    from scaletrain.cli.train import add_train_arguments
    add_train_arguments(parser)
    g = parser.add_argument_group("scaling prediction")
    g.add_argument("--interconnect", default=None, choices=list(INTERCONNECTS),
                   help="link between devices of one host (default: nvlink-h100 on CUDA, pcie4 otherwise)")
    g.add_argument("--network", default="100g", choices=list(INTERCONNECTS), help="link between hosts")
    add_number(g, "--devices-per-host", int, ge=1, default=8)
    add_number(g, "--max-devices", int, ge=1, default=64)
    add_number(g, "--overlap", float, ge=0, le=1, default=0.8,
                   help="largest fraction of the communication that can hide behind compute, where the "
                        "tensors' order does not decide it (DDP's buckets are scheduled against the backward; "
                        "FSDP/ZeRO hide behind the whole step up to this fraction)")
    add_number(g, "--measure-steps", int, ge=2, default=20, help="timed steps on one device")
    add_number(g, "--step-time-ms", float, gt=0, default=None,
                   help="use this single-device step time instead of the measured one (e.g. from a GPU run)")
    add_number(g, "--assume-h100-mfu", float, gt=0, le=1, default=None, metavar="FRACTION",
                   help="instead of measuring, assume an H100 at this fraction of its dense peak for the "
                        "precision (step time from the counted FLOPs)")
    add_number(g, "--workers", int, ge=1, default=8,
                   help="with --strategy ps: the workers the parameter servers serve (one row per server count)")
    g.add_argument("--json", action="store_true", help="print one JSON record per device count")
    g.add_argument("--measured", metavar="RESULT.json", default=None,
                   help="instead of predicting: show a benchmarks/shaped_links.py result, each point's measured "
                        "step time beside the predicted one and the error")


def run_scaling(args: argparse.Namespace, argv: list[str]) -> int:
    if args.measured:
        return _measured_table(args.measured, args.json)
    from scaletrain.accelerators import xla
    from scaletrain.cli.train import config_from_args
    from scaletrain.distributed.strategies.registry import strategy_class
    from scaletrain.precision.hardware import H100, auto_precision
    from scaletrain.prediction.measure import measure_single_device
    from scaletrain.prediction.predictors import PredictionRequest, predictor_for
    from scaletrain.training.defaults import settle_precision_here
    xla.refuse_unmodelled("scaling", vars(args).get("device"), "its step and link models are a GPU's and a CPU's")
    cfg = config_from_args(args)
    if args.assume_h100_mfu is not None and cfg.precision.policy == "auto":
        cfg.precision.policy = auto_precision(H100)[0]    # what auto runs on the H100 assumed
    settle_precision_here(cfg)    # measured here: what auto runs on this machine
    # The prediction follows what the strategy sends over the links (auto: ddp, as on several devices).
    strategy = strategy_class(cfg.distributed, world=2)
    predictor = predictor_for(strategy)
    degrees = predictor.degrees(cfg, args.max_devices)     # checked before anything is measured
    # The table has nine columns: give it room when the output is not a terminal (logs, CI).
    console = make_console(quiet=args.json, width=None if sys.stdout.isatty() else 140)
    given = args.step_time_ms is not None or args.assume_h100_mfu is not None
    console.print(f"{'counting' if given else 'measuring'} {cfg.model.name} at batch {cfg.batch_size} "
                  f"({cfg.precision.policy}) on one device...")
    m = measure_single_device(cfg, steps=args.measure_steps, time_steps=not given,
                              tensor_overhead=predictor.measures_tensor_overhead())
    step_time, source = m.step_time_s, f"measured on {m.device}"
    if args.step_time_ms is not None:
        step_time, source = args.step_time_ms / 1e3, "given with --step-time-ms"
    elif args.assume_h100_mfu is not None:
        peak = H100_PEAK[cfg.precision.policy]
        step_time = m.flops_per_sample * cfg.batch_size / (peak * args.assume_h100_mfu)
        source = f"assumed: H100 at {args.assume_h100_mfu:.0%} of {peak / 1e12:.0f} TFLOP/s"
    # Measured on a GPU: its host's links and NCCL; on a CPU: gloo's collectives (ALGORITHM_FACTORS).
    intra = args.interconnect or ("nvlink-h100" if m.device.startswith(("NVIDIA", "cuda")) else "pcie4")
    prediction = predictor.predict(PredictionRequest(
        cfg=cfg, strategy=strategy, measurement=m, step_time_s=step_time, source=source, step_time_given=given,
        intra=intra, network=args.network, devices_per_host=args.devices_per_host, overlap=args.overlap,
        max_devices=args.max_devices, workers=args.workers, degrees=degrees))
    if args.json:
        print(json.dumps(prediction.records, indent=2))
        return 0
    console.print(_table(prediction.title, prediction.columns, prediction.rows))
    for line in prediction.notes:
        console.print(line, soft_wrap=True)
    return 0


MEASURED_KEYS = ("strategy", "rate_mbit", "hosts", "bus_bandwidth_Bps", "hop_latency_s", "measured_step_s",
                 "predicted_step_s")


def _measured_table(path: str, as_json: bool) -> int:
    """A shaped-links benchmark's points: measured beside predicted (docs/scaling-predictor.md)."""
    from scaletrain.files import read_json
    hint = "pass the file benchmarks/shaped_links.py --out wrote"
    try:
        result = read_json(path, f"--measured {path}", dict, ConfigError)
    except ConfigError as exc:
        raise ConfigError(f"{exc}; {hint}") from None
    points = result.get("points")
    if not isinstance(points, list) or not points or not all(isinstance(p, dict) for p in points) \
            or any(k not in p for p in points for k in MEASURED_KEYS):
        raise ConfigError(f"--measured {path} is not a benchmarks/shaped_links.py result (it needs 'points': a list of "
                          f"objects with {', '.join(MEASURED_KEYS)}); {hint}")
    if not isinstance(result.get("environment", {}), dict):
        raise ConfigError(f"--measured {path}: its 'environment' is a {type(result['environment']).__name__}, not an "
                          f"object; {hint}")
    tensor = result.get("tensor_parallel") or {}
    if not isinstance(tensor, dict):
        raise ConfigError(f"--measured {path}: its 'tensor_parallel' is a {type(tensor).__name__}, not an object; "
                          f"{hint}")
    for key, value in (("grad_bytes", result.get("grad_bytes", 0)),
                       ("one_process_step_s", result.get("one_process_step_s", 0)),
                       ("tensor_parallel.allreduce_bytes", tensor.get("allreduce_bytes", 0))):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"--measured {path}: its '{key}' is {value!r}, not a number; {hint}")
    for number, point in enumerate(points, 1):
        problem = _point_problem(point)
        if problem:
            raise ConfigError(f"--measured {path}: point {number} {problem}; pass the file benchmarks/shaped_links.py "
                              "--out wrote")
    if as_json:
        print(json.dumps(points, indent=2))
        return 0
    console = make_console(width=None if sys.stdout.isatty() else 140)
    env = result.get("environment", {})
    bound = {True: "link", False: "cores", None: "-"}
    console.print(_table(f"measured against predicted: {_models_measured(result)}; "
                         f"{env.get('device', '?')}, torch {env.get('torch', '?')}, {env.get('date', '?')}",
                         ("strategy", "link", "hosts", "bound by", "probed bus Mbit/s", "probed us/hop",
                          "measured ms", "predicted ms", "error"),
                         [(p["strategy"], _link_name(p), str(p["hosts"]), bound[p.get("link_bound")],
                           f"{p['bus_bandwidth_Bps'] * 8 / 1e6:,.0f}", f"{p['hop_latency_s'] * 1e6:.0f}",
                           f"{p['measured_step_s'] * 1e3:.1f}", f"{p['predicted_step_s'] * 1e3:.1f}",
                           f"{p['predicted_step_s'] / p['measured_step_s'] - 1:+.0%}") for p in points]))
    for label, subset in (("where the links bind", [p for p in points if p.get("link_bound")]),
                          ("where this machine's cores bind", [p for p in points if p.get("link_bound") is False]),
                          ("", [p for p in points if p.get("link_bound") is None])):
        if subset:
            worst = max(subset, key=lambda p: abs(p["predicted_step_s"] / p["measured_step_s"] - 1))
            console.print(f"largest error{' ' + label if label else ''}: "
                          f"{worst['predicted_step_s'] / worst['measured_step_s'] - 1:+.0%} ({worst['strategy']}, "
                          f"{worst['hosts']} hosts, {_link_name(worst)})", soft_wrap=True)
    return 0


# Each number of a point and the range a measurement can take: (key, smallest, may equal it).
POINT_NUMBERS = (("bus_bandwidth_Bps", 0, False), ("hop_latency_s", 0, True), ("measured_step_s", 0, False),
                 ("predicted_step_s", 0, False), ("hosts", 1, True))


def _point_problem(point: dict) -> str | None:
    """Why a point's values cannot be a measurement (a zero step time would divide by zero, a
    string or NaN print as a figure), or None."""
    if not isinstance(point["strategy"], str):
        return f"has strategy {point['strategy']!r}, not a name"
    if point.get("link_bound") not in (True, False, None):
        return f"has link_bound {point['link_bound']!r}, not true, false or null"
    latency = point.get("latency_ms")
    if latency is not None and (isinstance(latency, bool) or not isinstance(latency, (int, float))):
        return f"has latency_ms {latency!r}, not a number"
    values = [(key, point[key], low, inclusive) for key, low, inclusive in POINT_NUMBERS]
    if point["rate_mbit"] is not None:
        values.append(("rate_mbit", point["rate_mbit"], 0, False))
    for key, value, low, inclusive in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < low or (value == low and not inclusive):
            return f"has {key} {value!r}, not a number {'>=' if inclusive else '>'} {low}"
    return None


def _models_measured(result: dict) -> str:
    """What the file's points trained, as the file says: the data-parallel model (its one-process
    step is 0 where only tensor parallelism was measured), the tensor-parallel one (its traffic), or both."""
    parts = []
    if result.get("one_process_step_s"):
        parts.append(f"{result.get('grad_bytes', 0) / 2**20:.1f} MiB of gradients, one process "
                     f"{result.get('one_process_step_s', 0) * 1e3:.2f} ms per step")
    if result.get("tensor_parallel"):
        tp = result["tensor_parallel"]
        parts.append(f"tensor parallel: {tp.get('allreduces', '?')} all-reduces of "
                     f"{tp.get('allreduce_bytes', 0) / 2**20:.1f} MiB together per step")
    return "; ".join(parts)


def _link_name(point: dict) -> str:
    """1000 Mbit/s, unshaped, or 1000 Mbit/s + 5 ms where the benchmark added a latency."""
    name = f"{point['rate_mbit']} Mbit/s" if point["rate_mbit"] else "unshaped"
    return name + (f" + {point['latency_ms']:g} ms" if point.get("latency_ms") is not None else "")


def _table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> Table:
    """One of this command's tables: right-aligned numbers under a title that says what was assumed."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*row)
    return table
