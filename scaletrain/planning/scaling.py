"""Predicts data-parallel step time, speedup and efficiency from one measured device.

Model (weak scaling: every device keeps the per-device batch, so N devices process N times the
samples per step):

    t_step(N) = t_compute + exposed(N)
    t_allreduce(N) = 2(N-1)/N * S/B  +  buckets * 2(N-1) * alpha      (ring all-reduce)
    exposed(N) = t_allreduce(N) - min(overlap * t_allreduce(N), t_backward)
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
    if n == 1:  # nothing to all-reduce
        bandwidth = latency = 0.0
    else:
        buckets = max(1, math.ceil(inputs.wire_bytes / inputs.bucket_bytes))
        bandwidth = 2 * (n - 1) / n * inputs.wire_bytes / link.bus_bandwidth
        latency = buckets * 2 * (n - 1) * link.hop_latency
    allreduce = bandwidth + latency
    hidden = min(inputs.overlap * allreduce, BACKWARD_SHARE * inputs.step_time_s)
    exposed = allreduce - hidden
    step = inputs.step_time_s + exposed
    speedup = n * inputs.step_time_s / step
    return ScalingPoint(devices=n, hosts=hosts, link=link.name if n > 1 else "-", allreduce_s=allreduce,
                        bandwidth_s=bandwidth, latency_s=latency, exposed_comm_s=exposed, step_time_s=step,
                        images_per_sec=n * inputs.per_device_batch / step, speedup=speedup, efficiency=speedup / n)


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
