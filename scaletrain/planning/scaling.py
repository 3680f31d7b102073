"""Predicts data-parallel step time, speedup and efficiency from one measured device (a ring
all-reduce, or parameter servers: `predict_parameter_server`).

Model (weak scaling: every device keeps the per-device batch, so N devices process N times the
samples per step):

    t_step(N) = t_compute + exposed(N)
    t_allreduce(N) = 2(N-1)/N * S/B  +  buckets * 2(N-1) * alpha      (ring all-reduce)
    exposed(N) = t_allreduce(N) - min(overlap * t_allreduce(N), t_backward)

Sharded strategies move V (N-1)/N * S per step instead of 2 (the strategy's `wire_volume`: FSDP
gathers the parameters in the forward and again in the backward and reduce-scatters the
gradients, V = 3, seed 004's 1.5x; ZeRO-2 gathers once, V = 2; ZeRO-1 all-reduces and then
broadcasts the updated parameters, 2 + 1, the broadcast after the step never hidden), and can hide
behind the whole step where they prefetch in the forward too.
    speedup(N) = N * t_compute / t_step(N),   efficiency = speedup / N

S is the gradient bytes (halved by bf16/fp16 compression), B the effective bus bandwidth of the
slowest link in the ring (the host's interconnect up to `devices_per_host` devices, the network
between hosts beyond), alpha the per-hop latency, paid per DDP bucket. DDP all-reduces bucket by
bucket while the backward pass still runs, so up to `overlap` of the communication can hide behind
the backward (taken as 2/3 of the step: backward costs about twice the forward); the last bucket
never overlaps, hence overlap < 1.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from scaletrain.planning.hardware import Interconnect

BACKWARD_SHARE = 2 / 3


@dataclass(frozen=True, slots=True)
class ScalingInputs:
    step_time_s: float          # one device, one optimizer step at the per-device batch
    per_device_batch: int
    grad_bytes: int             # bytes all-reduced per step, before compression
    intra: Interconnect
    network: Interconnect
    devices_per_host: int = 8
    overlap: float = 0.8
    compression: str = "none"   # none, bf16, fp16
    bucket_bytes: int = 25 * 2**20
    # What the strategy moves per step, in units of S(N-1)/N per rank (a ring all-reduce moves 2;
    # FSDP's two all-gathers and a reduce-scatter 3), split into what can overlap compute and what
    # cannot (ZeRO-1's parameter broadcast after the step), and the share of the step it can hide
    # behind (DDP: the backward; sharded strategies prefetch in the forward too: the whole step).
    overlappable_volume: float = 2.0
    exposed_volume: float = 0.0
    overlap_window: float = BACKWARD_SHARE

    @property
    def wire_bytes(self) -> float:
        return self.grad_bytes / 2 if self.compression in ("bf16", "fp16") else float(self.grad_bytes)


@dataclass(frozen=True, slots=True)
class ScalingPoint:
    devices: int
    hosts: int
    link: str
    allreduce_s: float
    bandwidth_s: float
    latency_s: float
    exposed_comm_s: float
    step_time_s: float
    images_per_sec: float
    speedup: float
    efficiency: float

    def to_dict(self) -> dict:
        return asdict(self)


def predict(inputs: ScalingInputs, devices: int) -> ScalingPoint:
    n = devices
    hosts = math.ceil(n / inputs.devices_per_host)
    link = inputs.intra if hosts == 1 else min((inputs.intra, inputs.network), key=lambda i: i.bus_bandwidth)
    volume = inputs.overlappable_volume + inputs.exposed_volume
    if n == 1:  # nothing to all-reduce
        bandwidth = latency = 0.0
    else:
        buckets = max(1, math.ceil(inputs.wire_bytes / inputs.bucket_bytes))
        bandwidth = volume * (n - 1) / n * inputs.wire_bytes / link.bus_bandwidth
        latency = buckets * volume * (n - 1) * link.hop_latency      # one hop per S/N moved
    allreduce = bandwidth + latency
    overlappable = allreduce * inputs.overlappable_volume / volume
    hidden = min(inputs.overlap * overlappable, inputs.overlap_window * inputs.step_time_s)
    exposed = allreduce - hidden
    step = inputs.step_time_s + exposed
    speedup = n * inputs.step_time_s / step
    return ScalingPoint(devices=n, hosts=hosts, link=link.name if n > 1 else "-", allreduce_s=allreduce,
                        bandwidth_s=bandwidth, latency_s=latency, exposed_comm_s=exposed, step_time_s=step,
                        images_per_sec=n * inputs.per_device_batch / step, speedup=speedup, efficiency=speedup / n)


def strategy_traffic(strategy) -> dict:
    """The ScalingInputs fields a data-parallel strategy class states (`wire_volume`, `hides_behind`)."""
    overlappable, exposed = strategy.wire_volume
    return {"overlappable_volume": overlappable, "exposed_volume": exposed,
            "overlap_window": 1.0 if strategy.hides_behind == "step" else BACKWARD_SHARE}


def device_counts(max_devices: int) -> list[int]:
    counts, n = [], 1
    while n <= max_devices:
        counts.append(n)
        n *= 2
    return counts


def explain(inputs: ScalingInputs, points: list[ScalingPoint]) -> list[str]:
    """Plain-language reading of the table: what dominates, and where it stops scaling."""
    t = inputs.step_time_s
    backward = BACKWARD_SHARE * t
    lines = [f"compute: {t * 1e3:.2f} ms per step on one device (backward ~{backward * 1e3:.2f} ms); "
             f"gradients: {inputs.grad_bytes / 2**20:.1f} MiB per step"
             + (f", {inputs.wire_bytes / 2**20:.1f} MiB on the wire with {inputs.compression} compression"
                if inputs.compression != "none" else "")]
    two = next((p for p in points if p.devices == 2), None)
    if two is not None and two.speedup < 1:
        lines.append(
            f"why are 2 devices slower than 1? Each step must all-reduce {inputs.wire_bytes / 2**20:.1f} MiB over "
            f"{two.link} ({inputs.intra.bus_bandwidth / 1e9:.0f} GB/s): {two.allreduce_s * 1e3:.2f} ms, of which "
            f"{two.exposed_comm_s * 1e3:.2f} ms cannot hide behind the {backward * 1e3:.2f} ms backward pass - more "
            f"than the whole {t * 1e3:.2f} ms of compute that a second device adds. Fixes: a larger per-device batch "
            "(more compute per byte), --grad-compression bf16 (half the bytes), a faster interconnect.")
    for p in points[1:]:
        if p.efficiency < 0.9:
            cause = ("the latency of the ring's 2(N-1) hops" if p.latency_s > p.bandwidth_s else
                     f"bandwidth: {inputs.wire_bytes / 2**20:.1f} MiB over {p.link}")
            where = "crossing hosts" if p.hosts > 1 and all(q.efficiency >= 0.9 for q in points[1:] if q.hosts == 1) \
                else "within a host" if p.hosts == 1 else "across hosts"
            lines.append(f"efficiency first drops below 90 % at {p.devices} devices ({where}): exposed "
                         f"communication {p.exposed_comm_s * 1e3:.2f} ms per step, dominated by {cause}.")
            break
    else:
        lines.append(f"efficiency stays at or above 90 % up to {points[-1].devices} devices: communication "
                     "hides behind the backward pass.")
    return lines


@dataclass(frozen=True, slots=True)
class PipelinePoint:
    stages: int
    microbatches: int
    bubble_fraction: float      # (P-1)/(M+P-1): the share of a stage's step spent idle
    compute_s: float            # a stage's busy time: t_1 / P
    transfer_s: float           # activations and their gradients between stages, on the critical path
    step_time_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def predict_pipeline(step_time_s: float, stages: int, microbatches: int, activation_bytes: float = 0.0,
                     link: Interconnect | None = None) -> PipelinePoint:
    """A GPipe/1F1B pipeline's step time from one device's, for one replica (GPipe, Huang et al.):

        t_step = t_1 / P * (M + P - 1) / M  +  (M + P - 1) * 2 * (a / M / B + alpha)

    the stages' compute balanced (each does 1/P of the work, in M slices, over M + P - 1 slots of
    the schedule), plus each slot's send of a micro-batch's activations forward and their gradient
    back (`activation_bytes` a: one stage boundary's activations for the whole batch, over `link`). 1F1B has the same bubble as GPipe;
    it saves memory (at most P micro-batches in flight instead of M), not time."""
    p, m = stages, microbatches
    slots = m + p - 1
    compute = step_time_s / p * slots / m
    transfer = 0.0 if link is None or p == 1 else slots * 2 * (activation_bytes / m / link.bus_bandwidth
                                                                 + link.hop_latency)
    return PipelinePoint(stages=p, microbatches=m, bubble_fraction=(p - 1) / slots, compute_s=step_time_s / p,
                         transfer_s=transfer, step_time_s=compute + transfer)


@dataclass(frozen=True, slots=True)
class ParameterServerPoint:
    servers: int
    workers: int
    largest_shard_bytes: int
    server_link_s: float        # the busiest server's traffic: W gradient shards in, W parameter shards out
    worker_link_s: float        # one worker's traffic: its whole gradient out, the parameters in
    latency_s: float
    update_s: float             # the busiest server's optimizer step on its shard
    exchange_s: float
    step_time_s: float
    images_per_sec: float

    def to_dict(self) -> dict:
        return asdict(self)


def predict_parameter_server(step_time_s: float, per_worker_batch: int, tensor_bytes: list[int], workers: int,
                             servers: int, link: Interconnect, update_s_per_byte: float = 0.0) -> ParameterServerPoint:
    """A synchronous parameter-server step (seed 002): every worker pushes its gradient, shard by
    shard, to K servers after its backward pass, and pulls the new parameters back:

        S_k = the bytes of server k's whole tensors (largest first onto the least loaded server)
        t_server = W * max_k S_k / B      each link full duplex: W shards in while W go out
        t_worker = S / B                  a worker's own link carries the whole model each way
        t_exchange = max(t_server, t_worker) + 2 * alpha + max_k S_k * u
        t_step = t_compute + t_exchange   nothing overlaps: the push starts after the backward

    The busiest server's link is the bottleneck seed 002 describes: it carries W times its shard,
    so sharding over K servers divides it until one worker's own link, or the largest tensor (a
    server holds whole tensors), limits it. u: the optimizer step's seconds per byte of a shard."""
    from scaletrain.distributed.strategies.ps.strategy import balance
    shards = balance(list(tensor_bytes), servers)
    largest = max(sum(tensor_bytes[i] for i in shard) for shard in shards)
    server_link = workers * largest / link.bus_bandwidth
    worker_link = sum(tensor_bytes) / link.bus_bandwidth
    latency = 2 * link.hop_latency
    update = largest * update_s_per_byte
    exchange = max(server_link, worker_link) + latency + update
    step = step_time_s + exchange
    return ParameterServerPoint(servers=servers, workers=workers, largest_shard_bytes=largest,
                                server_link_s=server_link, worker_link_s=worker_link, latency_s=latency,
                                update_s=update, exchange_s=exchange, step_time_s=step,
                                images_per_sec=workers * per_worker_batch / step)
