"""Predicts a step's time on many devices from one measured device: data parallelism (a ring
all-reduce, or sharded collectives), parameter servers, pipelines, tensor parallelism, and
workers that differ (stragglers).

Data parallelism (weak scaling: every device keeps the per-device batch, so N devices process N
times the samples per step):

    t_step(N) = t_compute + exposed(N)
    t_allreduce(N) = 2(N-1)/N * S/B  +  buckets * 2(N-1) * alpha      (ring all-reduce)
    speedup(N) = N * t_compute / t_step(N),   efficiency = speedup / N

S is the gradient bytes (halved by bf16/fp16 compression; under PowerSGD the rank-r factors of
each matrix, r(n + m) numbers for n x m, and the other tensors whole), B the effective bus
bandwidth of the slowest link in the ring (the host's interconnect up to `devices_per_host`
devices, the network between hosts beyond), alpha the per-hop latency, paid per DDP bucket
(three times under PowerSGD: the uncompressed tensors, then P, then Q, each waiting for the last).

What hides: DDP all-reduces bucket by bucket while the backward pass still runs (the backward
taken as 2/3 of the step: it costs about twice the forward). Given each tensor's bytes, the
buckets are scheduled: a bucket starts once the backward has produced its gradients and the link
is free, and what runs past the backward's end is exposed (at least the last bucket: the first
layer's gradients come last). Without them, exposed = t_allreduce - min(overlap * t_allreduce,
t_backward).

Each strategy states the collectives of its step (its `collectives`): DDP one all-reduce; FSDP
gathers the parameters in the forward and again in the backward and reduce-scatters the
gradients (on a ring 1 + 1 + 1 = 3 units of S(N-1)/N against DDP's 2: seed 004's 1.5x); ZeRO-2
gathers once; ZeRO-1 all-reduces, then each owner broadcasts its updated partition after the step,
never hidden (the largest partition's owner sets the pace: whole tensors are not balanced; between
2 hosts both owners', which take turns). Sharded strategies can hide behind the whole step: they
prefetch in the forward too. A model without repeated blocks is one unit to FSDP and ZeRO-2: one
all-gather before the forward, one reduce-scatter after the backward, nothing hidden (their
BlockSharding capability's `step_collectives`), and FSDP2's copies into and out of its flat
buffers add to the step (`shard_copy_s_per_byte`, measured).
A collective moves RING_VOLUME units on an ideal ring, times the library's measured factor
(`ALGORITHM_FACTORS`): gloo's reduce-scatter costs a whole all-reduce, not half of one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from scaletrain.prediction.hardware import Interconnect

BACKWARD_SHARE = 2 / 3
FIRST_BUCKET_BYTES = 2**20     # DDP's first gradient bucket (torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES)
# The bytes one rank sends per collective on an ideal ring, in units of S (N-1)/N for a tensor of
# S bytes (the gathered or reduced whole, not one shard).
RING_VOLUME = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "broadcast": 1.0}
# The collectives FSDP2 copies into and out of flat buffers around (ScalingInputs.shard_copy_s_per_byte).
SHARDED_KINDS = ("all_gather", "reduce_scatter")
# How much longer a library's collective takes than the ideal ring at the same bytes, measured
# against its own all-reduce over links shaped to 1 Gbit/s (BENCHMARKS.md, "The scaling predictor
# against shaped links"): gloo's reduce-scatter takes as long as its all-reduce (1.01-1.07x at 2 and
# 4 hosts), its all-gather 1.08-1.12x the ideal half. NCCL's are rings.
ALGORITHM_FACTORS = {"gloo": {"all_gather": 1.1, "reduce_scatter": 2.0}, "nccl": {}}


@dataclass(frozen=True, slots=True)
class ScalingInputs:
    step_time_s: float          # one device, one optimizer step at the per-device batch
    per_device_batch: int
    grad_bytes: int             # bytes all-reduced per step, before compression
    intra: Interconnect
    network: Interconnect
    devices_per_host: int = 8
    overlap: float = 0.8
    compression: str = "none"   # none, bf16, fp16, powersgd
    powersgd_rank: int = 1
    bucket_bytes: int = 25 * 2**20
    # The strategy's collectives per step, (kind, count, can overlap compute): DDP's one all-reduce;
    # ZeRO-1's broadcast after the step cannot overlap. `algorithm`: the library's factor per kind
    # (ALGORITHM_FACTORS; missing kinds are ideal rings). `overlap_window`: the share of the step the
    # overlapping ones can hide behind (DDP: the backward; sharded strategies prefetch in the
    # forward too: the whole step).
    collectives: tuple = (("all_reduce", 1, True),)
    algorithm: dict = field(default_factory=dict)
    overlap_window: float = BACKWARD_SHARE
    # Each trainable tensor's bytes in parameter order. Given, DDP's buckets are scheduled against
    # the backward (what hides is what the model's layer order lets hide); without, up to `overlap`
    # of the communication hides behind the backward.
    tensor_bytes: tuple = ()
    tensor_shapes: tuple = ()   # each trainable tensor's shape, in the same order (for PowerSGD)
    # The communication runs on the cores that compute (gloo over TCP with no core to spare, as
    # when several hosts share one machine): nothing hides, whatever the schedule allows.
    shared_cores: bool = False
    # FSDP2's copies around each all-gather and reduce-scatter (into and out of their flat buffers),
    # per byte of S + S/N, measured on the device (measure.shard_copy_seconds_per_byte): they run
    # on the compute's stream between the collective and the layers that need it, so they never
    # hide. 0: not measured.
    shard_copy_s_per_byte: float = 0.0

    @property
    def wire_bytes(self) -> float:
        if self.compression in ("bf16", "fp16"):
            return self.grad_bytes / 2
        if self.compression == "powersgd":
            from scaletrain.distributed.comm_hooks import powersgd_wire_elements
            if not self.tensor_shapes:
                raise ValueError("PowerSGD's bytes need the gradients' shapes (tensor_shapes)")
            elements = sum(math.prod(shape) for shape in self.tensor_shapes)
            return self.grad_bytes * powersgd_wire_elements(self.tensor_shapes, self.powersgd_rank) / elements
        return float(self.grad_bytes)

    @property
    def allreduces_per_bucket(self) -> int:
        """Collectives one after another per bucket (each pays the ring's hop latency)."""
        return 3 if self.compression == "powersgd" else 1

    def volume(self, overlaps: bool, devices: int | None = None) -> float:
        """What the collectives that do (or do not) overlap compute move, in units of S (N-1)/N,
        on the busiest link. A broadcast is ZeRO-1's: every owner sends its partition to the N-1
        others at once, so the largest partition's owner sets the pace (whole tensors, as
        partition_by_size gives them), or the two largest owners, whose broadcasts to each other
        take turns: max((N-1) P_max, P_max + P_next) * N / ((N-1) S) units; 1 when balanced or
        unknown."""
        return sum(count * self._units(kind, devices) for kind, count, hides in self.collectives if hides == overlaps)

    def _units(self, kind: str, devices: int | None) -> float:
        if kind == "broadcast":
            # gloo's broadcast is flat (the root sends to each peer: measured 2.0x and 3.8x the ring
            # at 2 and 4 hosts), which is what the owners' sends below count.
            if not self.tensor_bytes or not devices or devices < 2:
                return RING_VOLUME[kind]
            from scaletrain.distributed.partition import partition_by_size
            owners = partition_by_size(list(self.tensor_bytes), devices)
            loads = sorted((sum(b for b, o in zip(self.tensor_bytes, owners, strict=True) if o == r)
                            for r in range(devices)), reverse=True)
            # Two owners' broadcasts to each other do not overlap: between 2 hosts the step paid
            # their sum (293.5 ms over the link switch, 296.7 over tbf; the largest alone
            # predicted 250.6), between 4 the largest owner's sends to its 3 peers (BENCHMARKS.md).
            busiest = max((devices - 1) * loads[0], loads[0] + loads[1])
            return devices * busiest / ((devices - 1) * sum(self.tensor_bytes))
        return RING_VOLUME[kind] * self.algorithm.get(kind, 1.0)


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
    copy_s: float = 0.0     # FSDP2's copies around its sharded collectives (in exposed_comm_s too)

    def to_dict(self) -> dict:
        return asdict(self)


def ddp_buckets(tensor_bytes: tuple[int, ...] | list[int], bucket_bytes: int,
                first_bucket_bytes: int = FIRST_BUCKET_BYTES) -> list[int]:
    """The bytes of each of DDP's gradient buckets in the order they are reduced: the parameters in
    reverse (the backward computes the last layer's gradient first), a bucket closed once it holds
    at least its cap (the first 1 MiB, so communication starts early; the rest --bucket-cap-mb)."""
    buckets, current, cap = [], 0, first_bucket_bytes
    for size in reversed(tensor_bytes):
        current += size
        if current >= cap:
            buckets.append(current)
            current, cap = 0, bucket_bytes
    return buckets + ([current] if current else [])


def predict(inputs: ScalingInputs, devices: int) -> ScalingPoint:
    n = devices
    hosts = math.ceil(n / inputs.devices_per_host)
    link = inputs.intra if hosts == 1 else min((inputs.intra, inputs.network), key=lambda i: i.bus_bandwidth)
    overlappable_volume = inputs.volume(overlaps=True, devices=n)
    volume = overlappable_volume + inputs.volume(overlaps=False, devices=n)
    scheduled = bool(inputs.tensor_bytes) and inputs.overlap_window == BACKWARD_SHARE
    buckets = (ddp_buckets(inputs.tensor_bytes, inputs.bucket_bytes) if scheduled
               # DDP fills its buckets with the gradients as they are; a compression hook shrinks each.
               else [inputs.grad_bytes] * max(1, math.ceil(inputs.grad_bytes / inputs.bucket_bytes)))
    if n == 1:  # nothing to all-reduce
        bandwidth = latency = 0.0
    else:
        bandwidth = volume * (n - 1) / n * inputs.wire_bytes / link.bus_bandwidth
        latency = len(buckets) * inputs.allreduces_per_bucket * volume * (n - 1) * link.hop_latency  # a hop per S/N
    allreduce = bandwidth + latency
    overlappable = allreduce * overlappable_volume / volume
    if inputs.shared_cores:
        exposed_overlappable = overlappable
    elif scheduled and n > 1:
        exposed_overlappable = _exposed_after_backward(buckets, overlappable,
                                                       inputs.overlap_window * inputs.step_time_s)
    else:
        exposed_overlappable = overlappable - min(inputs.overlap * overlappable,
                                                  inputs.overlap_window * inputs.step_time_s)
    exposed = exposed_overlappable + (allreduce - overlappable)
    sharded = sum(count for kind, count, _ in inputs.collectives if kind in SHARDED_KINDS)
    copies = 0.0 if n == 1 else sharded * inputs.wire_bytes * (1 + 1 / n) * inputs.shard_copy_s_per_byte
    exposed += copies
    step = inputs.step_time_s + exposed
    speedup = n * inputs.step_time_s / step
    return ScalingPoint(devices=n, hosts=hosts, link=link.name if n > 1 else "-", allreduce_s=allreduce,
                        bandwidth_s=bandwidth, latency_s=latency, exposed_comm_s=exposed, step_time_s=step,
                        images_per_sec=n * inputs.per_device_batch / step, speedup=speedup, efficiency=speedup / n,
                        copy_s=copies)


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 0.1 * 2**20 else f"{n / 2**10:.1f} KiB"


def _exposed_after_backward(buckets: list[int], comm_s: float, backward_s: float) -> float:
    """DDP's buckets on one link: bucket b is ready once the backward has produced its gradients
    (the backward's time taken as proportional to the bytes it has passed), starts when it is ready
    and the link is free, and takes its share of `comm_s`. What runs past the backward's end is
    exposed: at least the last bucket, whose gradients come last."""
    total, done, link_free = sum(buckets), 0, 0.0
    for size in buckets:
        done += size
        ready = backward_s * done / total
        link_free = max(link_free, ready) + comm_s * size / total
    return max(link_free - backward_s, 0.0)


def strategy_traffic(strategy, library: str = "nccl", blocks: int | None = None) -> dict:
    """The ScalingInputs fields a data-parallel strategy class states (its collectives for a model of
    `blocks` repeated blocks, None: the usual, blocked model's; `hides_behind`), with `library`'s
    algorithm factors (gloo, nccl)."""
    from scaletrain.distributed.capabilities import BlockSharding
    sharded_by_blocks = blocks is not None and issubclass(strategy, BlockSharding)
    collectives = strategy.step_collectives(blocks) if sharded_by_blocks else strategy.collectives
    return {"collectives": tuple(collectives), "algorithm": ALGORITHM_FACTORS[library],
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
             + (f", {_mib(inputs.wire_bytes)} on the wire with {inputs.compression} compression"
                if inputs.compression != "none" else "")
             + (f" (rank {inputs.powersgd_rank}, three all-reduces per bucket, after the plain all-reduce's "
                "warm-up steps; its orthogonalisation's compute is not priced)"
                if inputs.compression == "powersgd" else "")]
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
        hides = any(can_hide for *_, can_hide in inputs.collectives) and not inputs.shared_cores
        lines.append(f"efficiency stays at or above 90 % up to {points[-1].devices} devices: communication "
                     + ("hides behind the backward pass." if hides else "is small against the step (none of it "
                        "can hide)."))
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
    back (`activation_bytes` a: one stage boundary's activations for the whole batch, over `link`).
    1F1B has the same bubble as GPipe; it saves memory (at most P micro-batches in flight instead of
    M), not time."""
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
    server_link_s: float        # the busiest server's link, one way: W gradient shards in (then W parameter shards out)
    worker_link_s: float        # one worker's link, one way: its whole gradient out (then the parameters in)
    latency_s: float            # the hand-overs: a ready notice and a trip per push, one trip for the pull
    update_s: float             # the busiest server's optimizer step on its shard
    handling_s: float           # the busiest server's own work on the W messages (copies, sum, reply)
    epoch_pull_s: float         # the pull that ends every epoch, per step of the epoch (0: not asked)
    exchange_s: float
    step_time_s: float
    images_per_sec: float

    def to_dict(self) -> dict:
        return asdict(self)


def predict_parameter_server(step_time_s: float, per_worker_batch: int, tensor_bytes: list[int], workers: int,
                             servers: int, link: Interconnect, update_s_per_byte: float = 0.0,
                             message_s_per_byte: float = 0.0, steps_per_epoch: int | None = None
                             ) -> ParameterServerPoint:
    """A synchronous parameter-server step (seed 002): every worker pushes its gradient, shard by
    shard, to K servers after its backward pass, and pulls the new parameters back once every
    push has arrived and the server has stepped, so the push and the pull do not overlap:

        S_k = the bytes of server k's whole tensors (largest first onto the least loaded server)
        t_server = W * max_k S_k / B      the busiest server's link: W shards in, then W out
        t_worker = S / B                  a worker's own link: the whole model out, then in
        t_handle = W * max_k S_k * h      the busiest server's own work on W messages
        t_latency = (2W + 1) * alpha      a server takes the W pushes one at a time, each handed
                                          over only after its ready notice crossed the link (2 trips);
                                          the pull's receives are posted early (1 trip)
        t_exchange = 2 * max(t_server, t_worker) + t_handle + t_latency + max_k S_k * u
        t_step = t_compute + t_exchange   nothing overlaps: the push starts after the backward
        t_epoch = t_server / steps        every epoch ends with a pull of the servers' parameters,
                                          W more shards out of the busiest server (steps_per_epoch)

    The busiest server's link is the bottleneck seed 002 describes: it carries W times its shard,
    so sharding over K servers divides it until one worker's own link, or the largest tensor (a
    server holds whole tensors), limits it. u: the optimizer step's seconds per byte of a shard;
    h: a server's own seconds per byte of each message (keep the gradient, stack and sum it with
    the others, pack the reply; measure.server_seconds_per_byte). One process handles every
    message, so h grows with W. Over links shaped to 1 Gbit/s the push and the pull took one phase
    each, and each push its hand-over (BENCHMARKS.md)."""
    from scaletrain.distributed.strategies.ps.strategy import balance
    shards = balance(list(tensor_bytes), servers)
    largest = max(sum(tensor_bytes[i] for i in shard) for shard in shards)
    server_link = workers * largest / link.bus_bandwidth
    worker_link = sum(tensor_bytes) / link.bus_bandwidth
    latency = (2 * workers + 1) * link.hop_latency
    update = largest * update_s_per_byte
    handling = workers * largest * message_s_per_byte
    exchange = 2 * max(server_link, worker_link) + handling + latency + update
    epoch_pull = max(server_link, worker_link) / steps_per_epoch if steps_per_epoch else 0.0
    step = step_time_s + exchange + epoch_pull
    return ParameterServerPoint(servers=servers, workers=workers, largest_shard_bytes=largest,
                                server_link_s=server_link, worker_link_s=worker_link, latency_s=latency,
                                update_s=update, handling_s=handling, epoch_pull_s=epoch_pull, exchange_s=exchange,
                                step_time_s=step, images_per_sec=workers * per_worker_batch / step)


@dataclass(frozen=True, slots=True)
class StragglerPoint:
    workers: int
    backups: int
    mode: str                   # sync or async
    waits_for_s: float          # what a step (sync) or an epoch's share (async) waits for, per step
    epoch_end_s: float          # per step: the epoch's end waiting out the in-flight steps it did not wait for
    step_time_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def predict_stragglers(worker_step_s: list[list[float]], backups: int = 0, mode: str = "sync",
                       steps_per_epoch: int = 0, trials: int = 4096, seed: int = 0) -> StragglerPoint:
    """The chief's step when workers differ (seed 002's slow workers and backup replicas), from
    each worker's step-time distribution (its own compute and exchange: samples drawn with
    replacement, one value for a worker that never varies):

        sync:  a step closes when W - B pushes have arrived: t = E[X_(W-B)], the (W-B)-th fastest
               of one draw per worker (B = 0: the slowest of the W);
        async: nobody waits within an epoch, every worker trains an equal share at its own pace, and
               the epoch ends when W - B of them have finished it: t = the (W-B)-th smallest mean;
        backups: the epoch's end is a meeting of all W, so it waits for the steps still in flight on
               the B it did not wait for: E[max over them of U * X], U uniform on [0, 1) (where in
               its step each one is), spread over the epoch's `steps_per_epoch` steps.
    """
    import random
    import statistics
    workers = len(worker_step_s)
    if not 0 <= backups < workers:
        raise ValueError(f"backups must be in [0, {workers - 1}] for {workers} workers, got {backups}")
    if mode not in ("sync", "async"):
        raise ValueError(f"mode must be sync or async, got {mode!r}")
    rng = random.Random(seed)
    kth = workers - backups - 1
    waits, ends = [], []
    means = [statistics.fmean(samples) for samples in worker_step_s]
    slow_by_mean = sorted(range(workers), key=means.__getitem__)[kth + 1:]
    for _ in range(trials):
        draws = [rng.choice(samples) for samples in worker_step_s]
        if mode == "sync":
            order = sorted(range(workers), key=draws.__getitem__)
            waits.append(draws[order[kth]])
            left_out = order[kth + 1:]
        else:
            left_out = slow_by_mean
        ends.append(max((rng.random() * draws[i] for i in left_out), default=0.0))
    wait = statistics.fmean(waits) if mode == "sync" else sorted(means)[kth]
    epoch_end = statistics.fmean(ends) / steps_per_epoch if backups and steps_per_epoch else 0.0
    return StragglerPoint(workers=workers, backups=backups, mode=mode, waits_for_s=wait, epoch_end_s=epoch_end,
                          step_time_s=wait + epoch_end)


@dataclass(frozen=True, slots=True)
class TensorParallelPoint:
    ways: int
    compute_s: float            # the split blocks' share over T devices, the rest whole on each
    overhead_s: float           # DTensor's own work per step once split (measured; 0 if not)
    collectives_s: float        # the per-layer all-reduces, on the critical path
    step_time_s: float
    speedup: float              # one device's step over this one (the same batch)

    def to_dict(self) -> dict:
        return asdict(self)


def predict_tensor_parallel(step_time_s: float, ways: int, split_share: float, allreduces: int,
                            allreduce_bytes: float, link: Interconnect, overhead_s: float = 0.0) -> TensorParallelPoint:
    """One replica's step with its blocks split T ways (Megatron-style, seed 004), from one
    device's step on the same batch:

        t_compute = t_1 * (share / T + 1 - share)  +  t_overhead
        t_comm = 2(T-1)/T * bytes / B  +  count * 2(T-1) * alpha
        t_step = t_compute + t_comm

    share: the step's FLOPs inside the split blocks (embeddings and the head stay whole on every
    device); count and bytes: the step's per-layer all-reduces (each row-wise layer's output in the
    forward, each column-wise layer's input gradient in the backward, the whole batch's). None
    overlaps compute: the next layer needs the sum. t_overhead: what splitting costs in software
    whatever T is (DTensor's dispatch of every split layer's ops; measure.tensor_parallel_overhead):
    on a CPU with small layers it is as large as the compute the split saves."""
    t = ways
    overhead = overhead_s if t > 1 else 0.0
    compute = step_time_s * (split_share / t + 1 - split_share)
    comm = 0.0 if t == 1 else (2 * (t - 1) / t * allreduce_bytes / link.bus_bandwidth
                               + allreduces * 2 * (t - 1) * link.hop_latency)
    step = compute + overhead + comm
    return TensorParallelPoint(ways=t, compute_s=compute, overhead_s=overhead, collectives_s=comm, step_time_s=step,
                               speedup=step_time_s / step)
