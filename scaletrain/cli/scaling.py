"""`scaletrain scaling`: measure one device, predict 1..64 devices (see planning/scaling.py)."""

from __future__ import annotations

import argparse
import json
import sys

from scaletrain.console import make_console
from rich.table import Table

from scaletrain.cli.flags import add_number
from scaletrain.errors import ConfigError
from scaletrain.planning.hardware import H100_PEAK, INTERCONNECTS, get_interconnect
from scaletrain.planning.scaling import (SHARDED_KINDS, ScalingInputs, device_counts, explain, predict,
                                        predict_parameter_server, predict_pipeline, predict_tensor_parallel,
                                        strategy_traffic)


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
    from scaletrain.cli.train import config_from_args
    from scaletrain.planning.measure import measure_single_device, shard_copy_seconds_per_byte
    cfg = config_from_args(args)
    from scaletrain.distributed.strategies.registry import strategy_class
    ways = _tensor_parallel_ways(cfg, args.max_devices) if strategy_class(cfg.distributed, world=2).traffic == "tensor" \
        else []     # checked before anything is measured
    # The table has nine columns: give it room when the output is not a terminal (logs, CI).
    console = make_console(quiet=args.json, width=None if sys.stdout.isatty() else 140)
    given = _step_time_given(args)
    console.print(f"{'counting' if given else 'measuring'} {cfg.model.name} at batch {cfg.batch_size} "
                  f"({cfg.precision.policy}) on one device...")
    m = measure_single_device(cfg, steps=args.measure_steps, time_steps=not given, tensor_overhead=bool(ways))
    step_time, source = m.step_time_s, f"measured on {m.device}"
    if args.step_time_ms is not None:
        step_time, source = args.step_time_ms / 1e3, "given with --step-time-ms"
    elif args.assume_h100_mfu is not None:
        peak = H100_PEAK[cfg.precision.policy]
        step_time = m.flops_per_sample * cfg.batch_size / (peak * args.assume_h100_mfu)
        source = f"assumed: H100 at {args.assume_h100_mfu:.0%} of {peak / 1e12:.0f} TFLOP/s"
    # Measured on a GPU: its host's links and NCCL; on a CPU: gloo's collectives (ALGORITHM_FACTORS).
    on_gpu = m.device.startswith(("NVIDIA", "cuda"))
    intra = args.interconnect or ("nvlink-h100" if on_gpu else "pcie4")
    # The model follows what the strategy sends over the links (auto: ddp, as on several devices).
    strategy = strategy_class(cfg.distributed, world=2)
    if strategy.traffic == "pipeline":
        return _pipeline_prediction(cfg, args, console, m, step_time, source, intra)
    if strategy.traffic == "parameter-server":
        return _parameter_server_prediction(cfg, args, console, m, step_time, source)
    if strategy.traffic == "tensor":
        return _tensor_parallel_prediction(cfg, args, console, m, step_time, source, intra, ways)
    traffic = strategy_traffic(strategy, library="nccl" if on_gpu else "gloo", blocks=m.blocks)
    # FSDP2's copies around its collectives, timed where the step was (not for a given step time).
    copies = (shard_copy_seconds_per_byte(m.tensor_bytes, 2, device="cuda" if on_gpu else "cpu")
              if not given and any(kind in SHARDED_KINDS for kind, _, _ in traffic["collectives"]) else 0.0)
    inputs = ScalingInputs(step_time_s=step_time, per_device_batch=cfg.batch_size, grad_bytes=m.grad_bytes,
                           intra=get_interconnect(intra), network=get_interconnect(args.network),
                           devices_per_host=args.devices_per_host, overlap=args.overlap,
                           compression=cfg.distributed.grad_compression,
                           bucket_bytes=int(cfg.distributed.bucket_cap_mb * 2**20), tensor_bytes=m.tensor_bytes,
                           shard_copy_s_per_byte=copies, **traffic)
    points = [predict(inputs, n) for n in device_counts(args.max_devices)]
    if args.json:
        print(json.dumps([{**p.to_dict(), "step_time_source": source, "per_device_batch": cfg.batch_size,
                           "grad_bytes": m.grad_bytes, "interconnect": intra, "network": args.network}
                          for p in points], indent=2))
        return 0
    console.print(_table(f"{cfg.model.name}, batch {cfg.batch_size} per device, {cfg.precision.policy}; "
                         f"{intra} within a host ({args.devices_per_host}/host), {args.network} between hosts; "
                         f"step time {source}",
                         ("devices", "hosts", "link", "all-reduce ms", "exposed ms", "step ms", "images/s", "speedup",
                          "efficiency"),
                         [(str(p.devices), str(p.hosts), p.link, f"{p.allreduce_s * 1e3:.2f}",
                           f"{p.exposed_comm_s * 1e3:.2f}", f"{p.step_time_s * 1e3:.2f}", f"{p.images_per_sec:,.0f}",
                           f"{p.speedup:.2f}x", f"{p.efficiency:.0%}") for p in points]))
    for line in explain(inputs, points):
        console.print(line, soft_wrap=True)
    return 0


def _pipeline_prediction(cfg, args, console, m, step_time: float, source: str, intra: str) -> int:
    """One replica of a --stages P pipeline at micro-batch counts from P up (planning/scaling.py)."""
    stages = cfg.distributed.pipeline.stages
    if not m.boundary_bytes:
        raise ConfigError(f"{cfg.model.name} is not a sequence of layers, so no pipeline can cut it; "
                          "see docs/model-parallel.md")
    counts = sorted({stages * k for k in (1, 2, 4, 8)} | {cfg.distributed.pipeline.microbatch_count()})
    link = get_interconnect(intra)
    points = [predict_pipeline(step_time, stages, mb, m.boundary_bytes, link) for mb in counts]
    if args.json:
        print(json.dumps([{**p.to_dict(), "one_device_step_s": step_time, "step_time_source": source,
                           "batch": cfg.batch_size, "boundary_bytes": m.boundary_bytes, "interconnect": intra,
                           "speedup": step_time / p.step_time_s} for p in points], indent=2))
        return 0
    console.print(_table(f"{cfg.model.name}, batch {cfg.batch_size}, {stages} stages over {intra}; one device "
                         f"{step_time * 1e3:.2f} ms per step ({source}); {m.boundary_bytes / 2**20:.2f} MiB "
                         "cross each cut per step",
                         ("micro-batches", "bubble", "compute ms", "transfer ms", "step ms", "speedup vs 1 device"),
                         [(str(p.microbatches), f"{p.bubble_fraction:.0%}", f"{p.compute_s * 1e3:.2f}",
                           f"{p.transfer_s * 1e3:.2f}", f"{p.step_time_s * 1e3:.2f}",
                           f"{step_time / p.step_time_s:.2f}x") for p in points]))
    console.print(f"a pipeline of {stages} balanced stages idles (P-1)/(M+P-1) of each step; more micro-batches "
                  "shrink the bubble until each micro-batch is too small to keep a device busy (not modelled: "
                  "measure it, BENCHMARKS.md)", soft_wrap=True)
    return 0


def _tensor_parallel_ways(cfg, max_devices: int) -> list[int]:
    """The degrees from 2 up to --max-devices that the model's blocks can be split by (checked on
    the meta device); a one-line error when none can."""
    from scaletrain.distributed.strategies.model_parallel import tensor_parallel_problem
    from scaletrain.training.preflight import meta_model
    model = meta_model(cfg)
    ways = [t for t in device_counts(max_devices)[1:] if tensor_parallel_problem(model, t) is None]
    if not ways:
        problem = tensor_parallel_problem(model, 2) or f"--max-devices {max_devices} leaves no degree from 2 up"
        raise ConfigError(f"no tensor-parallel degree to predict: {problem}")
    return ways


def _step_time_given(args) -> bool:
    """The step time comes from the flags (--step-time-ms, --assume-h100-mfu), not measured here."""
    return args.step_time_ms is not None or args.assume_h100_mfu is not None


def _tensor_parallel_prediction(cfg, args, console, m, step_time: float, source: str, intra: str,
                                ways: list[int]) -> int:
    """One replica's blocks split T ways over the host's interconnect (planning/scaling.py)."""
    link = get_interconnect(intra)
    points = [predict_tensor_parallel(step_time, t, m.tp_split_share, m.tp_allreduces, m.tp_allreduce_bytes, link,
                                      m.tp_overhead_s) for t in [1, *ways]]
    if args.json:
        print(json.dumps([{**p.to_dict(), "one_device_step_s": step_time, "step_time_source": source,
                           "batch": cfg.batch_size, "allreduces": m.tp_allreduces,
                           "allreduce_bytes": m.tp_allreduce_bytes, "split_share": m.tp_split_share,
                           "dtensor_overhead_s": m.tp_overhead_s, "interconnect": intra} for p in points], indent=2))
        return 0
    measured = (f"DTensor's own work {m.tp_overhead_s * 1e3:.2f} ms per step (measured split one way)"
                if m.tp_overhead_s or not _step_time_given(args) else "DTensor's own work not measured (step time not measured here)")
    console.print(_table(f"{cfg.model.name}, batch {cfg.batch_size}, blocks split over {intra}; one device "
                         f"{step_time * 1e3:.2f} ms per step ({source}); {m.tp_allreduces} all-reduces of "
                         f"{m.tp_allreduce_bytes / 2**20:.2f} MiB together per step; {m.tp_split_share:.0%} "
                         f"of the FLOPs in the split blocks; {measured}",
                         ("tensor-parallel", "compute ms", "DTensor ms", "all-reduce ms", "step ms",
                          "speedup vs 1 device"),
                         [(str(p.ways), f"{p.compute_s * 1e3:.2f}", f"{p.overhead_s * 1e3:.2f}",
                           f"{p.collectives_s * 1e3:.2f}", f"{p.step_time_s * 1e3:.2f}", f"{p.speedup:.2f}x")
                          for p in points]))
    console.print("tensor parallelism splits each block's matrices, so every layer waits for an all-reduce of "
                  "the whole batch's activations: keep it within a host's fast links (docs/model-parallel.md)",
                  soft_wrap=True)
    return 0


def _parameter_server_prediction(cfg, args, console, m, step_time: float, source: str) -> int:
    """Sync parameter servers: one row per server count at --workers workers, over --network."""
    link = get_interconnect(args.network)
    counts = [k for k in (1, 2, 4, 8, 16) if k <= len(m.tensor_bytes)]
    from scaletrain.planning.measure import optimizer_seconds_per_byte, server_seconds_per_byte
    per_byte = optimizer_seconds_per_byte(cfg.optim, sum(m.tensor_bytes))
    message_per_byte = server_seconds_per_byte(sum(m.tensor_bytes), workers=args.workers)
    points = [predict_parameter_server(step_time, cfg.batch_size, list(m.tensor_bytes), args.workers, k, link,
                                       per_byte, message_per_byte) for k in counts]
    if args.json:
        print(json.dumps([{**p.to_dict(), "step_time_source": source, "per_worker_batch": cfg.batch_size,
                           "network": args.network, "update_s_per_byte": per_byte,
                           "message_s_per_byte": message_per_byte} for p in points], indent=2))
        return 0
    console.print(_table(f"{cfg.model.name}, batch {cfg.batch_size} per worker, {args.workers} workers, parameter "
                         f"servers over {args.network}; step time {source}",
                         ("servers", "largest shard MiB", "server link ms", "worker link ms", "update ms",
                          "exchange ms", "step ms", "images/s"),
                         [(str(p.servers), f"{p.largest_shard_bytes / 2**20:.2f}", f"{p.server_link_s * 1e3:.2f}",
                           f"{p.worker_link_s * 1e3:.2f}", f"{p.update_s * 1e3:.2f}", f"{p.exchange_s * 1e3:.2f}",
                           f"{p.step_time_s * 1e3:.2f}", f"{p.images_per_sec:,.0f}") for p in points]))
    console.print(f"each server's link carries {args.workers} workers' shards each way: sharding over more servers "
                  "divides that until a worker's own link (the whole model each way) or the largest tensor (a "
                  "server holds whole tensors) sets the pace", soft_wrap=True)
    console.print(f"steady steps; every epoch also ends with a pull of the parameters, one more server link out "
                  f"({points[0].server_link_s * 1e3:.2f} ms with one server): short epochs pay it more often",
                  soft_wrap=True)
    return 0


MEASURED_KEYS = ("strategy", "rate_mbit", "hosts", "bus_bandwidth_Bps", "hop_latency_s", "measured_step_s",
                 "predicted_step_s")


def _measured_table(path: str, as_json: bool) -> int:
    """A shaped-links benchmark's points: measured beside predicted (docs/scaling-predictor.md)."""
    from pathlib import Path
    file = Path(path)
    try:
        result = json.loads(file.read_text())
        points = result["points"]
        for point in points:
            missing = [k for k in MEASURED_KEYS if k not in point]
            if missing:
                raise KeyError(missing[0])
    except OSError as exc:
        raise ConfigError(f"--measured {path}: cannot be read ({exc.strerror}); pass the file "
                          "benchmarks/shaped_links.py --out wrote") from None
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ConfigError(f"--measured {path} is not a benchmarks/shaped_links.py result (it needs 'points' "
                          f"with {', '.join(MEASURED_KEYS)})") from None
    if as_json:
        print(json.dumps(points, indent=2))
        return 0
    console = make_console(width=None if sys.stdout.isatty() else 140)
    env = result.get("environment", {})
    bound = {True: "link", False: "cores", None: "-"}
    console.print(_table(f"measured against predicted: {_models_measured(result, points)}; "
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


def _models_measured(result: dict, points: list[dict]) -> str:
    """What the file's points trained: the data-parallel model, the tensor-parallel one, or both."""
    parts = []
    if any(p["strategy"] != "tensor" for p in points):
        parts.append(f"{result.get('grad_bytes', 0) / 2**20:.1f} MiB of gradients, one process "
                     f"{result.get('one_process_step_s', 0) * 1e3:.2f} ms per step")
    if any(p["strategy"] == "tensor" for p in points):
        tp = result.get("tensor_parallel") or {}
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
