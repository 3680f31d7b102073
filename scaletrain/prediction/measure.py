"""Measurements the planners start from: one device's step time, gradient bytes, FLOPs."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from scaletrain.callbacks import Throughput
from scaletrain.config import DistributedConfig, TrainConfig
from scaletrain.console import quiet_fake_tensors
from scaletrain.errors import ConfigError
from scaletrain.inputs import batch_rows, first_rows, map_inputs
from scaletrain.models.blocks import find_blocks, pipeline_layers
from scaletrain.training import build_training


def train_flops_per_sample(model: torch.nn.Module, sample_shape, device, tokens: bool = False) -> float:
    """Forward + backward FLOPs of one sample, counted by FlopCounterMode on a batch of 2 (random
    features, or random token ids for a language model's `tokens` input)."""
    x = (torch.zeros(2, *sample_shape, dtype=torch.int64, device=device) if tokens
         else torch.randn(2, *sample_shape, device=device))
    counter = FlopCounterMode(display=False)
    with counter:
        model(x).float().sum().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / 2


def step_flops_per_sample(trainer, dataset) -> float:
    """Forward + backward FLOPs of one sample of the training step as the trainer runs it (the task
    calls the model, its loss): counted by FlopCounterMode on two real samples of the data as the
    loader hands them over (token ids, several named inputs, a model's own loss alike)."""
    trainer.adopt(dataset)    # its task and input statistics, where it has not trained
    x, y = next(iter(trainer.loader(dataset.train, train=False)))
    x, y = first_rows(x, 2), y[:2]
    counter = FlopCounterMode(display=False)
    with counter:
        trainer.task.loss(trainer.task.forward(trainer.model, x), y).backward()
    trainer.model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / batch_rows(y)


@dataclass(frozen=True, slots=True)
class StepMeasurement:
    step_time_s: float
    batch_size: int
    grad_bytes: int
    params: int
    device: str
    flops_per_sample: float
    sample_shape: tuple[int, ...]
    # The largest activation between two consecutive pipeline layers, for the whole batch: what a
    # pipeline cut there sends forward (and its gradient back). 0 for a model with no layer sequence.
    boundary_bytes: int = 0
    # Each trainable tensor's bytes: how a parameter server would shard them.
    tensor_bytes: tuple[int, ...] = ()
    # ... and shape: what PowerSGD's low-rank factors of each would send.
    tensor_shapes: tuple[tuple[int, ...], ...] = ()
    # What --strategy tensor would all-reduce per step (tensor_parallel_traffic); 0 for a model
    # whose blocks state no TP_PLAN.
    tp_allreduces: int = 0
    tp_allreduce_bytes: int = 0
    tp_split_share: float = 0.0
    # DTensor's own work per step once the blocks are split (tensor_parallel_overhead); 0 where not
    # measured (no TP_PLAN, or not asked for).
    tp_overhead_s: float = 0.0
    # The model's repeated blocks (models/blocks.py; 0: none): the units fsdp and zero2 shard by.
    blocks: int = 0


def boundary_bytes(trainer, dataset) -> int:
    """The bytes of the largest activation at a point where a pipeline could cut `trainer.model`,
    measured by forward hooks on one training batch."""
    try:
        layers = pipeline_layers(trainer.model)
    except ConfigError:
        return 0
    sizes: list[int] = []
    hooks = [layer.register_forward_hook(lambda module, args, out: sizes.append(out.numel() * out.element_size()))
             for _, layer in layers[:-1]]
    try:
        _forward_shapes(trainer, dataset)
    finally:
        for hook in hooks:
            hook.remove()
    return max(sizes, default=0)


def _forward_shapes(trainer, dataset, backward: bool = False) -> None:
    """Runs `trainer.model` on one training batch (and back, with `backward`) for its module hooks
    and any FlopCounterMode around the call, shapes only: the weights, buffers and batch enter as
    fake tensors (FakeTensorMode), so every op computes its output's shape and dtype and no
    arithmetic, and the real model is left untouched. A prediction counts rather than computes: a
    real bf16 forward of a 512-batch WRN-16-10 took minutes on a CPU without bf16 instructions, for
    bytes and FLOPs that depend on shapes alone."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.func import functional_call
    trainer.adopt(dataset)
    x, _ = next(iter(trainer.loader(dataset.train, train=True)))
    model = trainer.model
    with quiet_fake_tensors(), FakeTensorMode(allow_non_fake_inputs=True) as mode:
        state = {name: mode.from_tensor(t) for name, t in (*model.named_parameters(), *model.named_buffers())}
        fake = map_inputs(mode.from_tensor, x)
        with torch.set_grad_enabled(backward), trainer.policy.autocast(trainer.device):
            # A dict sample's several inputs go in by name, as the task calls the model.
            out = functional_call(model, state, (), fake) if isinstance(fake, dict) else functional_call(
                model, state, (fake,))
        if backward:
            out.float().sum().backward()


def tensor_parallel_traffic(trainer, dataset) -> tuple[int, int, float]:
    """What splitting `trainer.model`'s blocks by their TP_PLAN would cost per step, measured on one
    training batch: (all-reduces, their bytes together, the share of the step's FLOPs inside the
    split blocks). A row-wise layer all-reduces its output in the forward; a column-wise layer its
    input's gradient in the backward (the input's size). (0, 0, 0.0) when no block has a plan."""
    from scaletrain.models.blocks import find_blocks
    try:
        blocks = [b for b in find_blocks(trainer.model) if getattr(b, "TP_PLAN", None)]
    except ConfigError:
        return 0, 0, 0.0
    if not blocks:
        return 0, 0, 0.0
    sizes: list[int] = []

    def record(module, args, out, style):
        tensor = out if style == "rowwise" else args[0]
        sizes.append(tensor.numel() * tensor.element_size())
    hooks = [block.get_submodule(name).register_forward_hook(
                 lambda module, args, out, style=style: record(module, args, out, style))
             for block in blocks for name, style in block.TP_PLAN.items()]
    names = {id(module): name for name, module in trainer.model.named_modules()}
    counter = FlopCounterMode(display=False)
    try:
        with counter:
            _forward_shapes(trainer, dataset, backward=True)
    finally:
        for hook in hooks:
            hook.remove()
    counts = counter.get_flop_counts()
    root = type(trainer.model).__name__
    inside = sum(sum(counts.get(f"{root}.{names[id(block)]}", {}).values()) for block in blocks)
    return len(sizes), sum(sizes), inside / max(counter.get_total_flops(), 1)


def tensor_parallel_overhead(trainer, dataset, optim_config, repeats: int = 12) -> float:
    """DTensor's own work per training step on this device, in seconds: the step of `trainer.model`
    with its blocks split by their TP_PLAN over a 1-way mesh (every planned layer a DTensor, no
    partner to talk to: DTensor sends nothing) minus the plain model's step, the two timed side by
    side in this process (forward, backward, optimizer step; medians). A split over T processes
    pays this on top of its 1/T of the compute: on a 2-core CPU, gpt-tiny's 75 ms step took 116 ms
    split one way (BENCHMARKS.md). The collectives themselves are the link's, not counted here."""
    import statistics
    import time

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from scaletrain.distributed.strategies.model_parallel import apply_tensor_parallel
    from scaletrain.optim import build_optimizer
    owns_group = not dist.is_initialized()
    if owns_group:      # a group of this process alone: the mesh needs one, and sends nothing
        dist.init_process_group("gloo" if trainer.device.type == "cpu" else "cpu:gloo,cuda:nccl",
                                store=dist.HashStore(), rank=0, world_size=1)
    try:
        plain, split = copy.deepcopy(trainer.model), copy.deepcopy(trainer.model)
        apply_tensor_parallel(split, init_device_mesh(trainer.device.type, (1,)))
        trainer.adopt(dataset)
        x, y = next(iter(trainer.loader(dataset.train, train=True)))
        runs = [(model, build_optimizer(optim_config, model, trainer.device)) for model in (plain, split)]

        def step(model, optimizer) -> float:
            if trainer.device.type == "cuda":
                torch.cuda.synchronize(trainer.device)
            started = time.perf_counter()
            with trainer.policy.autocast(trainer.device):
                loss = trainer.task.loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if trainer.device.type == "cuda":
                torch.cuda.synchronize(trainer.device)
            return time.perf_counter() - started

        for _ in range(3):              # warm-up: optimizer state, DTensor's sharding caches
            for run in runs:
                step(*run)
        times = [[], []]
        for _ in range(repeats):        # interleaved, so drift touches both alike
            for i, run in enumerate(runs):
                times[i].append(step(*run))
        return max(statistics.median(times[1]) - statistics.median(times[0]), 0.0)
    finally:
        if owns_group:
            dist.destroy_process_group()


def measure_single_device(cfg: TrainConfig, steps: int = 20, time_steps: bool = True,
                          tensor_overhead: bool = False) -> StepMeasurement:
    """Times `steps` training steps of `cfg` on one device with the real trainer (an untimed
    warm-up epoch first, evaluation off), and counts the gradient bytes DDP would all-reduce.
    With `time_steps=False` only the counting is done (step_time_s is then nan). `tensor_overhead`:
    also time DTensor's own work per step (tensor_parallel_overhead), for a model with a TP_PLAN."""
    cfg = copy.deepcopy(cfg)
    cfg.epochs, cfg.eval_each_epoch, cfg.progress, cfg.save_model = 2, False, False, False
    cfg.per_replica_batch_size = None
    cfg.data.train_subset = cfg.batch_size * steps
    # One device, whatever the config says: none of its distributed settings apply here.
    cfg.distributed = DistributedConfig(strategy="single")
    throughput = Throughput(verbose=False)
    with build_training(cfg, callbacks=[throughput]) as built:
        trainer, dataset = built.trainer, built.dataset
        if time_steps:
            trainer.fit(dataset)
    # Under autocast the weights, hence the gradients DDP reduces, stay float32; bf16-true halves them.
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    tensor_bytes = tuple(p.numel() * p.element_size() for p in trainable)
    grad_bytes = sum(tensor_bytes)
    flops = step_flops_per_sample(trainer, dataset)
    from scaletrain.summary import device_name
    step_time = cfg.batch_size / throughput.steady_state() if time_steps else float("nan")
    tp_allreduces, tp_bytes, tp_share = tensor_parallel_traffic(trainer, dataset)
    tp_overhead = (tensor_parallel_overhead(trainer, dataset, cfg.optim)
                   if tensor_overhead and time_steps and tp_allreduces else 0.0)
    return StepMeasurement(step_time_s=step_time, batch_size=cfg.batch_size,
                           grad_bytes=grad_bytes, params=sum(p.numel() for p in trainer.model.parameters()),
                           device=device_name(trainer.device), flops_per_sample=flops,
                           sample_shape=tuple(dataset.input_shape), boundary_bytes=boundary_bytes(trainer, dataset),
                           tensor_bytes=tensor_bytes, tensor_shapes=tuple(tuple(p.shape) for p in trainable),
                           tp_allreduces=tp_allreduces, tp_allreduce_bytes=tp_bytes,
                           tp_split_share=tp_share, tp_overhead_s=tp_overhead,
                           blocks=count_blocks(trainer.model, cfg.memory.block_classes))


def count_blocks(model: torch.nn.Module, class_names=()) -> int:
    """How many repeated blocks fsdp and zero2 would shard `model` by (0: none, one unit)."""
    try:
        return len(find_blocks(model, tuple(class_names)))
    except ConfigError:
        return 0


def optimizer_seconds_per_byte(optim_config, tensor_bytes: int, repeats: int = 5) -> float:
    """Times `optim_config`'s optimizer stepping one float32 tensor of `tensor_bytes` on this CPU (a
    parameter server's update of its shard), per byte."""
    import time

    from scaletrain.optim import build_optimizer
    param = torch.nn.Parameter(torch.zeros(max(tensor_bytes // 4, 1)))
    param.grad = torch.full_like(param, 1e-3)
    optimizer = build_optimizer(optim_config, None, torch.device("cpu"), params=[param])
    optimizer.step()    # builds its state
    started = time.perf_counter()
    for _ in range(repeats):
        optimizer.step()
    return (time.perf_counter() - started) / repeats / tensor_bytes


def server_seconds_per_byte(tensor_bytes: int, repeats: int = 5, workers: int = 4) -> float:
    """A parameter server's own work on one worker's message, per byte of it, on this CPU: what
    distributed/strategies/ps/server.py does with a sync step's `workers` pushes and replies (keep
    each gradient, stack and sum them, pack the parameters into each reply), without the transfer.
    In fresh buffers, as the server allocates them: the stack of 8 pushes of 16 MiB took 83 ms a
    step, twice what adding each into one reused sum measured (BENCHMARKS.md)."""
    import time

    from scaletrain.distributed.strategies.ps.protocol import reply
    message = torch.full((max(tensor_bytes // 4, 1),), 1e-3)
    params = torch.zeros_like(message)
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        kept = [message.clone() for _ in range(workers)]
        (torch.stack(kept).sum(0) / workers).neg_()
        for _ in range(workers):
            reply(1, 0.0, False, [params])
        times.append(time.perf_counter() - started)
    return sorted(times[1:])[repeats // 2] / (workers * tensor_bytes)


def shard_copy_seconds_per_byte(tensor_bytes: list[int] | tuple[int, ...], world: int, device=None,
                                repeats: int = 9) -> float:
    """FSDP2's own copies around its collectives, per byte of the model, on `device` (default CPU):
    an all-gather copies the rank's shards into a send buffer and splits the gathered buffer back
    into the parameters (torch._foreach_copy_, torch.split_with_sizes_copy); a reduce-scatter
    concatenates each gradient's chunks into one buffer (torch._chunk_cat) and the reduced shard is
    divided in place. The ops FSDP2's collectives run, on float32 tensors of the model's sizes, in
    buffers allocated afresh each time as FSDP2 allocates them (the gathered one first written, as
    the collective would: a probe reusing one buffer never pays for fresh pages; reusing them here
    measured a third to a half of what a profile of the real step shows). Per byte of
    (S + S / world), what one collective copies."""
    import time
    device = torch.device(device or "cpu")
    sizes = [max(b // 4, world) // world * world for b in tensor_bytes]    # whole chunks per rank
    total = sum(sizes)
    params = [torch.ones(n, device=device) for n in sizes]
    shards = [torch.ones(n // world, device=device) for n in sizes]

    def one_round():
        send = torch.empty(total // world, device=device)
        torch._foreach_copy_(list(torch.split(send, [s.numel() for s in shards])), shards)
        gathered = torch.empty(total, device=device)
        gathered.fill_(1.0)
        torch.split_with_sizes_copy(gathered, sizes, out=params)
        reduce_in = torch.empty(total, device=device)
        torch._chunk_cat(params, 0, world, out=reduce_in.view(world, -1))
        reduce_in[: total // world].div_(world)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # Timed twice, the first pass discarded: the allocator settles on how it serves these sizes
    # only after the first few frees (on glibc a first pass ran 5.8 ms a round, every later one 16).
    for _ in range(2):
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            one_round()
            sync()
            times.append(time.perf_counter() - started)
    # One all-gather's and one reduce-scatter's copies in a round.
    return sorted(times)[len(times) // 2] / (2 * total * 4 * (1 + 1 / world))
