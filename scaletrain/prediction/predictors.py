"""What `scaletrain scaling` predicts for a strategy, chosen by the traffic pattern its class
declares (`Strategy.traffic`): one predictor per pattern, registered here (`@predicts(...)`), so a
strategy with a new pattern adds its predictor in this folder and touches no command. A predictor
takes the one-device measurement and returns a `Prediction` (a table's title, columns and rows,
the records `--json` prints, notes); the command only renders it. The cost models themselves are
prediction/scaling.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from scaletrain.errors import ConfigError
from scaletrain.prediction.hardware import get_interconnect
from scaletrain.prediction.measure import StepMeasurement
from scaletrain.prediction.scaling import (
    SHARDED_KINDS,
    ScalingInputs,
    device_counts,
    explain,
    predict,
    predict_parameter_server,
    predict_pipeline,
    predict_tensor_parallel,
    strategy_traffic,
)


@dataclass(frozen=True, slots=True)
class PredictionRequest:
    cfg: object                    # the TrainConfig measured
    strategy: type                 # the strategy class predicted (as on several devices)
    measurement: StepMeasurement
    step_time_s: float             # one device's step: measured, given or assumed
    source: str                    # where step_time_s came from, in words
    step_time_given: bool          # not measured here (--step-time-ms, --assume-h100-mfu)
    intra: str                     # the link within a host (prediction/hardware.py's names)
    network: str                   # the link between hosts
    devices_per_host: int = 8
    overlap: float = 0.8
    max_devices: int = 64
    workers: int = 8               # parameter servers: the workers they serve
    degrees: tuple[int, ...] = ()  # what `Predictor.degrees` found before measuring


@dataclass(slots=True)
class Prediction:
    title: str
    columns: tuple[str, ...]
    rows: list[tuple[str, ...]]
    records: list[dict]            # one JSON record per row
    notes: list[str] = field(default_factory=list)


class Predictor:
    def degrees(self, cfg, max_devices: int) -> tuple[int, ...]:
        """Checked before anything is measured: the degrees this pattern can predict (none needed
        by default); a one-line error when there are none."""
        return ()

    def measures_tensor_overhead(self) -> bool:
        """Whether the one-device measurement should time DTensor's own work."""
        return False

    def predict(self, req: PredictionRequest) -> Prediction:
        raise NotImplementedError


PREDICTORS: dict[str, Predictor] = {}


def predicts(*traffic: str) -> Callable[[type], type]:
    """Class decorator: the predictor of strategies whose `traffic` is one of these."""
    def add(cls: type) -> type:
        for name in traffic:
            PREDICTORS[name] = cls()
        return cls
    return add


def predictor_for(strategy: type) -> Predictor:
    if strategy.traffic not in PREDICTORS:
        raise ConfigError(f"--strategy {strategy.name}: no scaling prediction for its '{strategy.traffic}' traffic "
                          "(prediction/predictors.py has one predictor per pattern)")
    return PREDICTORS[strategy.traffic]


@predicts("all-reduce", "sharded", "none")
class DataParallel(Predictor):
    """Replicas (or shards) of the whole model at 1, 2, 4, ... devices: the strategy's collectives
    over the host's links, then the network's (prediction/scaling.py's `predict`)."""

    def predict(self, req: PredictionRequest) -> Prediction:
        from scaletrain.prediction.measure import shard_copy_seconds_per_byte
        cfg, m = req.cfg, req.measurement
        on_gpu = m.device.startswith(("NVIDIA", "cuda"))
        traffic = strategy_traffic(req.strategy, library="nccl" if on_gpu else "gloo", blocks=m.blocks)
        # FSDP2's copies around its collectives, timed where the step was (not for a given step time).
        copies = (shard_copy_seconds_per_byte(m.tensor_bytes, 2, device="cuda" if on_gpu else "cpu")
                  if not req.step_time_given and any(kind in SHARDED_KINDS for kind, _, _ in traffic["collectives"])
                  else 0.0)
        inputs = ScalingInputs(step_time_s=req.step_time_s, per_device_batch=cfg.batch_size, grad_bytes=m.grad_bytes,
                               intra=get_interconnect(req.intra), network=get_interconnect(req.network),
                               devices_per_host=req.devices_per_host, overlap=req.overlap,
                               compression=cfg.distributed.grad_compression,
                               powersgd_rank=cfg.distributed.powersgd_rank, tensor_shapes=m.tensor_shapes,
                               bucket_bytes=int(cfg.distributed.bucket_cap_mb * 2**20), tensor_bytes=m.tensor_bytes,
                               shard_copy_s_per_byte=copies, **traffic)
        points = [predict(inputs, n) for n in device_counts(req.max_devices)]
        return Prediction(
            title=(f"{cfg.model.name}, batch {cfg.batch_size} per device, {cfg.precision.policy}; {req.intra} within a "
                   f"host ({req.devices_per_host}/host), {req.network} between hosts; step time {req.source}"),
            columns=("devices", "hosts", "link", "all-reduce ms", "exposed ms", "step ms", "images/s", "speedup",
                     "efficiency"),
            rows=[(str(p.devices), str(p.hosts), p.link, f"{p.allreduce_s * 1e3:.2f}", f"{p.exposed_comm_s * 1e3:.2f}",
                   f"{p.step_time_s * 1e3:.2f}", f"{p.images_per_sec:,.0f}", f"{p.speedup:.2f}x", f"{p.efficiency:.0%}")
                  for p in points],
            records=[{**p.to_dict(), "step_time_source": req.source, "per_device_batch": cfg.batch_size,
                      "grad_bytes": m.grad_bytes, "interconnect": req.intra, "network": req.network} for p in points],
            notes=explain(inputs, points))


@predicts("pipeline")
class Pipeline(Predictor):
    """One replica of a --stages P pipeline at micro-batch counts from P up."""

    def predict(self, req: PredictionRequest) -> Prediction:
        cfg, m, step_time = req.cfg, req.measurement, req.step_time_s
        stages = cfg.distributed.pipeline.stages
        if not m.boundary_bytes:
            raise ConfigError(f"{cfg.model.name} is not a sequence of layers, so no pipeline can cut it; "
                              "see docs/model-parallel.md")
        counts = sorted({stages * k for k in (1, 2, 4, 8)} | {cfg.distributed.pipeline.microbatch_count()})
        points = [predict_pipeline(step_time, stages, mb, m.boundary_bytes, get_interconnect(req.intra))
                  for mb in counts]
        return Prediction(
            title=(f"{cfg.model.name}, batch {cfg.batch_size}, {stages} stages over {req.intra}; one device "
                   f"{step_time * 1e3:.2f} ms per step ({req.source}); {m.boundary_bytes / 2**20:.2f} MiB cross each "
                   "cut per step"),
            columns=("micro-batches", "bubble", "compute ms", "transfer ms", "step ms", "speedup vs 1 device"),
            rows=[(str(p.microbatches), f"{p.bubble_fraction:.0%}", f"{p.compute_s * 1e3:.2f}",
                   f"{p.transfer_s * 1e3:.2f}", f"{p.step_time_s * 1e3:.2f}", f"{step_time / p.step_time_s:.2f}x")
                  for p in points],
            records=[{**p.to_dict(), "one_device_step_s": step_time, "step_time_source": req.source,
                      "batch": cfg.batch_size, "boundary_bytes": m.boundary_bytes, "interconnect": req.intra,
                      "speedup": step_time / p.step_time_s} for p in points],
            notes=[f"a pipeline of {stages} balanced stages idles (P-1)/(M+P-1) of each step; more micro-batches "
                   "shrink the bubble until each micro-batch is too small to keep a device busy (not modelled: "
                   "measure it, BENCHMARKS.md)"])


@predicts("tensor")
class TensorParallel(Predictor):
    """One replica's blocks split T ways over the host's interconnect."""

    def degrees(self, cfg, max_devices: int) -> tuple[int, ...]:
        """The degrees from 2 up to --max-devices that the model's blocks can be split by (checked on
        the meta device)."""
        from scaletrain.distributed.strategies.model_parallel import tensor_parallel_problem
        from scaletrain.training.preflight import meta_model
        model = meta_model(cfg)
        ways = tuple(t for t in device_counts(max_devices)[1:] if tensor_parallel_problem(model, t) is None)
        if not ways:
            problem = tensor_parallel_problem(model, 2) or f"--max-devices {max_devices} leaves no degree from 2 up"
            raise ConfigError(f"no tensor-parallel degree to predict: {problem}")
        return ways

    def measures_tensor_overhead(self) -> bool:
        return True

    def predict(self, req: PredictionRequest) -> Prediction:
        cfg, m, step_time = req.cfg, req.measurement, req.step_time_s
        link = get_interconnect(req.intra)
        points = [predict_tensor_parallel(step_time, t, m.tp_split_share, m.tp_allreduces, m.tp_allreduce_bytes,
                                          link, m.tp_overhead_s) for t in (1, *req.degrees)]
        measured = (f"DTensor's own work {m.tp_overhead_s * 1e3:.2f} ms per step (measured split one way)"
                    if m.tp_overhead_s or not req.step_time_given
                    else "DTensor's own work not measured (step time not measured here)")
        return Prediction(
            title=(f"{cfg.model.name}, batch {cfg.batch_size}, blocks split over {req.intra}; one device "
                   f"{step_time * 1e3:.2f} ms per step ({req.source}); {m.tp_allreduces} all-reduces of "
                   f"{m.tp_allreduce_bytes / 2**20:.2f} MiB together per step; {m.tp_split_share:.0%} of the FLOPs "
                   f"in the split blocks; {measured}"),
            columns=("tensor-parallel", "compute ms", "DTensor ms", "all-reduce ms", "step ms", "speedup vs 1 device"),
            rows=[(str(p.ways), f"{p.compute_s * 1e3:.2f}", f"{p.overhead_s * 1e3:.2f}",
                   f"{p.collectives_s * 1e3:.2f}", f"{p.step_time_s * 1e3:.2f}", f"{p.speedup:.2f}x") for p in points],
            records=[{**p.to_dict(), "one_device_step_s": step_time, "step_time_source": req.source,
                      "batch": cfg.batch_size, "allreduces": m.tp_allreduces, "allreduce_bytes": m.tp_allreduce_bytes,
                      "split_share": m.tp_split_share, "dtensor_overhead_s": m.tp_overhead_s,
                      "interconnect": req.intra} for p in points],
            notes=["tensor parallelism splits each block's matrices, so every layer waits for an all-reduce of "
                   "the whole batch's activations: keep it within a host's fast links (docs/model-parallel.md)"])


@predicts("parameter-server")
class ParameterServers(Predictor):
    """Sync parameter servers: one row per server count at --workers workers, over --network."""

    def predict(self, req: PredictionRequest) -> Prediction:
        from scaletrain.prediction.measure import optimizer_seconds_per_byte, server_seconds_per_byte
        cfg, m = req.cfg, req.measurement
        counts = [k for k in (1, 2, 4, 8, 16) if k <= len(m.tensor_bytes)]
        per_byte = optimizer_seconds_per_byte(cfg.optim, sum(m.tensor_bytes))
        message_per_byte = server_seconds_per_byte(sum(m.tensor_bytes), workers=req.workers)
        points = [predict_parameter_server(req.step_time_s, cfg.batch_size, list(m.tensor_bytes), req.workers, k,
                                           get_interconnect(req.network), per_byte, message_per_byte)
                  for k in counts]
        return Prediction(
            title=(f"{cfg.model.name}, batch {cfg.batch_size} per worker, {req.workers} workers, parameter servers "
                   f"over {req.network}; step time {req.source}"),
            columns=("servers", "largest shard MiB", "server link ms", "worker link ms", "update ms", "exchange ms",
                     "step ms", "images/s"),
            rows=[(str(p.servers), f"{p.largest_shard_bytes / 2**20:.2f}", f"{p.server_link_s * 1e3:.2f}",
                   f"{p.worker_link_s * 1e3:.2f}", f"{p.update_s * 1e3:.2f}", f"{p.exchange_s * 1e3:.2f}",
                   f"{p.step_time_s * 1e3:.2f}", f"{p.images_per_sec:,.0f}") for p in points],
            records=[{**p.to_dict(), "step_time_source": req.source, "per_worker_batch": cfg.batch_size,
                      "network": req.network, "update_s_per_byte": per_byte, "message_s_per_byte": message_per_byte}
                     for p in points],
            notes=[f"each server's link carries {req.workers} workers' shards each way: sharding over more servers "
                   "divides that until a worker's own link (the whole model each way) or the largest tensor (a "
                   "server holds whole tensors) sets the pace",
                   f"steady steps; every epoch also ends with a pull of the parameters, one more server link out "
                   f"({points[0].server_link_s * 1e3:.2f} ms with one server): short epochs pay it more often"])
