"""Typed run configuration: nested dataclasses that TOML files and CLI flags map onto.

Every field has a default and a one-line doc (the `doc` metadata), which the CLI reuses as help.
`from_mapping` rejects unknown keys and wrong types, naming the dotted key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from scaletrain.errors import ConfigError
from scaletrain.registry import Choices, Declarations, Registry


# Every integer a config value or flag feeds (tensor sizes, step counters, torch's C++ API) is at
# most 64 bits wide: anything larger is refused here, not met later as an OverflowError.
INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Check:
    """The values a field admits, declared beside its default and checked once, at the boundary
    (`TrainConfig.validate`). Bounds apply to a number or to every item of a list; None passes
    (an optional field left unset)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple | None = None
    pattern: str | None = None      # a regular expression the whole text must match
    rule: str = ""                  # the pattern in words, for the error message

    def problem(self, value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, list):
            for item in value:
                bad = self.problem(item)
                if bad:
                    return f"has an item that {bad}"
            return None
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(map(str, self.choices))}"
        if self.pattern is not None and isinstance(value, str) and not re.fullmatch(self.pattern, value):
            return f"must be {self.rule}"
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        if isinstance(value, int) and not isinstance(value, bool) and not -INT64_MAX <= value <= INT64_MAX:
            return f"must fit a 64-bit integer (at most {INT64_MAX:,})"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            for bound, ok, words in ((self.ge, lambda b: value >= b, "at least"), (self.gt, lambda b: value > b, "greater than"),
                                     (self.le, lambda b: value <= b, "at most"), (self.lt, lambda b: value < b, "less than")):
                if bound is not None and not ok(bound):
                    return f"must be {self.describe()}"
        return None

    def describe(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(map(str, self.choices))
        parts = [f"{w} {b:g}" for b, w in ((self.ge, ">="), (self.gt, ">"), (self.le, "<="), (self.lt, "<"))
                 if b is not None]
        return " and ".join(parts)


def _f(default: Any, doc: str, *, ge=None, gt=None, le=None, lt=None, choices=None, pattern=None, rule="",
       resumable: bool = False, training_only: bool = False) -> Any:
    """A config field: its default, a one-line doc (also the CLI help), the values it admits,
    whether a resume may change it (`resumable`: it changes how the run goes on, not what it is),
    and whether only training reads it (`training_only`: how gradients and updates travel; a
    command that runs a saved model's forward, such as `predict`, offers no flag for it)."""
    if choices is not None and not isinstance(choices, Choices):
        choices = tuple(choices)
    check = Check(ge=ge, gt=gt, le=le, lt=lt, choices=choices, pattern=pattern, rule=rule)
    meta = {"doc": doc, "check": check, "resumable": resumable, "training_only": training_only}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


# The choice lists users may name. Each reads the names its package declares (registry.py's
# `Declarations`: no import, so checks and `--help` need no torch) and the registries that
# implement them add each name as it is registered, so adding one is one decorated definition in
# its own package and nothing here changes; `auto` is resolved by the config's users.
PRECISIONS = Choices("auto", declared=Declarations("scaletrain.precision", "register_policy"))
STRATEGIES = Choices("auto", declared=Declarations("scaletrain.distributed.strategies", "register_strategy"))
DATA_SETS = Choices(declared=Declarations("scaletrain.data", "register_dataset"), importable=True)
# Models are not a field's choices (`--model` also takes NAME-VARIANT and module:function); this
# list is what `scaletrain list` and the unknown-model error show.
MODELS = Choices(declared=Declarations("scaletrain.models", "register_model"))
# The command-line flags whose name is not simply the field's last name (the config owns its
# flag names: the CLI and the search-space files both read this).
FLAG_NAMES = {"model.name": "--model", "data.name": "--data", "precision.policy": "--precision",
              "checkpoint.every": "--checkpoint-every", "checkpoint.dir": "--checkpoint-dir",
              "checkpoint.keep": "--keep-checkpoints", "checkpoint.resume": "--resume",
              "tracking.loggers": "--logger"}
# Other names a field's flag also answers to (TensorFlow's words, as seed 002 uses them).
FLAG_ALIASES = {"threads": ("--intra-op-threads",)}

# Run ids name folders and are typed on the command line: no spaces, no path or SQL wildcards.
RUN_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9.-]{0,63}"
RUN_ID_RULE = "1-64 letters, digits, '.' or '-', starting with a letter or digit"
TASKS = Choices("auto", declared=Declarations("scaletrain.tasks", "register_task"), importable=True)
LOGGERS = ("mlflow", "wandb", "tensorboard")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    name: str = _f("cnn1d", "model from the registry, e.g. cnn1d, mlp, resnet, wrn-16-10, vit-tiny, or your own "
                   "package.module:function(input_shape, num_classes, **options) (docs/your-model-and-data.md)")
    options: dict = _f({}, "model-specific keyword arguments, e.g. {channels = 64}")
    init_from: str | None = _f(None, "start from these weights (a model.pt a run saved): weights only, in a new run "
                               "with a fresh optimizer and schedule; to continue a run exactly, use --resume")


@dataclass(kw_only=True, slots=True)
class DataConfig:
    name: str = _f("mnist1d", "data set: mnist1d, digits, synthetic, mnist, fashion-mnist, cifar10, npz, "
                   "friedman1 (regression), char-corpus (characters of Python's docs, for language models), "
                   "shards (a folder written by `scaletrain shard`, streamed from disk), or your own "
                   "package.module:function returning your splits (docs/your-model-and-data.md)",
                   choices=DATA_SETS)
    options: dict = _f({}, "keyword arguments of your own package.module:function data set, e.g. {size = 64}")
    data_dir: str | None = _f(None, "folder (or .npz file) holding the data set's files; for shards, the shard folder "
                              "or a pattern of training shards like 'DIR/train-{0000..0063}.tar'")
    download: bool = _f(False, "download missing MNIST/Fashion-MNIST files (checksum-verified)", resumable=True)
    placement: str = _f("auto", "auto, device (whole set on the device) or stream (DataLoader)",
                        choices=("auto", "device", "stream"), resumable=True)
    augment: list[str] = _f([], "on-device augmentations: shift, flip", choices=("shift", "flip"))
    drop_last: bool = _f(True, "training: leave out each epoch's last partial batch (every step of one shape, as "
                         "CUDA graphs, fused steps, gradient accumulation and several processes need; the left-out "
                         "samples differ each epoch as the order does); false trains on them too, in one smaller "
                         "step (one process only)")
    shift: int = _f(4, "largest random shift in pixels for the 'shift' augmentation", ge=0)
    num_samples: int | None = _f(None, "size of generated data sets (mnist1d, synthetic, friedman1)", ge=2)
    seq_len: int = _f(64, "characters per sample of the char-corpus data set (the model's context)", ge=1)
    train_subset: int | None = _f(None, "use only the first N training samples (the seed's lab uses 10000; for shards, the "
                                  "fewest leading shards holding N)", ge=1)
    val_fraction: float = _f(0.1, "fraction of the training split held out for validation (per-epoch evaluation, "
                             "stopping, tuning) when the data set has no validation split; the test split is "
                             "evaluated once, at the end", gt=0, lt=1)
    shape: list[int] = _f([3, 32, 32], "sample shape for the synthetic data set", ge=1)
    num_classes: int = _f(10, "number of classes for the synthetic data set", ge=2)
    val_batch_size: int | None = _f(None, "evaluation batch size (default: the training batch size)", ge=1, resumable=True)
    num_workers: int = _f(0, "DataLoader worker processes for the streaming path and for shards", ge=0, resumable=True)
    prefetch: int = _f(2, "shards: batches each worker reads ahead, and batches copied ahead to the device", ge=1, resumable=True)
    fetch_timeout_s: float = _f(120.0, "shards at a URL: how long a lost connection is retried (from the byte it "
                                       "stopped at) before the run stops", gt=0, resumable=True)
    shard_cache_mb: float = _f(2048.0, "shards at a URL: MiB of verified shards kept in the local cache (the least "
                                       "recently read dropped first; 0: none)", ge=0, resumable=True)
    shuffle_buffer: int = _f(1000, "shards: samples held in each worker's shuffle buffer (1: shard order only)", ge=1)


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    optimizer: str = _f("adamw", "sgd (with momentum) or adamw", choices=("sgd", "adamw"))
    lr: float = _f(1e-3, "peak learning rate", gt=0)
    weight_decay: float = _f(0.0, "decoupled weight decay (adamw) or L2 (sgd)", ge=0)
    decay_all: bool = _f(False, "weight decay on biases and norm scales too (torch's default); by default only "
                         "weights (2-D and up) are decayed")
    momentum: float = _f(0.9, "SGD momentum", ge=0, lt=1)
    nesterov: bool = _f(False, "Nesterov momentum for SGD")
    betas: list[float] = _f([0.9, 0.999], "AdamW betas", ge=0, lt=1)
    lr_schedule: str = _f("constant", "constant, step, cosine or onecycle (module: a LightningModule's own "
                          "scheduler, set from its configure_optimizers)",
                      choices=("constant", "step", "cosine", "onecycle", "module"))
    warmup_epochs: float = _f(0.0, "linear warm-up length in epochs", ge=0)
    step_milestones: list[float] = _f([15, 25, 35], "epochs at which the step schedule multiplies the LR by step_gamma",
                          ge=0)
    step_gamma: float = _f(0.1, "factor of the step schedule", gt=0)
    min_lr_ratio: float = _f(0.0, "final LR of cosine/onecycle as a fraction of the peak", ge=0, le=1)
    clip_grad_norm: float | None = _f(None, "clip the global gradient norm to this value", gt=0)
    grad_accum_steps: int = _f(1, "split each batch into this many micro-batches (less memory; the same gradient "
                               "unless the model has BatchNorm, which normalises each micro-batch on its own)",
                           ge=1)
    lr_scaling: str = _f("none", "scale the LR with the number of replicas: none, linear or sqrt",
                     choices=("none", "linear", "sqrt"))
    lr_scaling_warmup_epochs: float = _f(1.0, "ramp from the base LR to the scaled LR over this many epochs (Goyal et al.)",
                                         ge=0)


@dataclass(kw_only=True, slots=True)
class PrecisionConfig:
    policy: str = _f("auto", "auto (bf16-mixed on a GPU that computes bfloat16 natively, CUDA capability 8.0 and "
                     "newer; fp32 elsewhere: the start line says which and why), fp32 (PyTorch's default: TF32 "
                     "convolutions on such GPUs, IEEE float32 matrix products), fp32-strict (IEEE float32 "
                     "everywhere), tf32, bf16-mixed, fp16-mixed or bf16-true", choices=PRECISIONS)
    fp32_modules: list[str] = _f([], "module names or class names kept in float32")
    init_scale: float = _f(2.0**16, "fp16-mixed: initial loss scale", gt=0)
    growth_interval: int = _f(2000, "fp16-mixed: finite steps before the loss scale doubles", ge=1)


@dataclass(frozen=True, slots=True)
class Table:
    """A typed table of options a strategy owns (`[distributed.<name>]`), defined in its file and
    registered with `register_table`. `owners`: the strategies that read it; a value off its
    default under another strategy is an error. A table may define `problem(cfg) -> str | None`
    for its own rules tying fields together, checked when one of its owners is chosen."""
    cls: type
    owners: tuple[str, ...]


@dataclass(kw_only=True, slots=True)
class DistributedConfig:
    strategy: str = _f("auto", "auto (ddp when launched with several processes, else single), or any strategy "
                       "`scaletrain list` shows: ddp, zero1, fsdp, pipeline (--stages), tensor (--tensor-parallel), "
                       "ps (parameter servers, --num-ps), ...", choices=STRATEGIES, resumable=True)
    nproc: int = _f(1, "start this many local worker processes through torchrun's elastic agent", ge=1, resumable=True)
    devices: list[int] = _f([], "the devices the processes use, one each (seed 002's MirroredStrategy(devices=...)): "
                                "GPU indices, process i on GPU devices[i]; on a CPU host core numbers, process i "
                                "pinned to that core with one thread. Default: GPUs 0..N-1, the cores shared",
                            ge=0, resumable=True)
    max_restarts: int = _f(0, "with --nproc: restart the worker group this many times after a failure", ge=0,
                           resumable=True)
    backend: str = _f("auto", "process-group backend: auto (nccl on CUDA, gloo on CPU), nccl or gloo",
                  choices=("auto", "nccl", "gloo"), resumable=True)
    grad_compression: str = _f("none", "how gradients cross the links: none (plain all-reduce), bf16 or fp16 (16 bits on "
                                       "the wire: half the bytes), or powersgd (a low-rank approximation, DDP only: "
                                       "see --powersgd-rank; `scaletrain scaling` prices each)",
                               choices=("none", "bf16", "fp16", "powersgd"), training_only=True)
    powersgd_rank: int = _f(1, "with --grad-compression powersgd: the rank of each gradient matrix's approximation "
                               "(higher: closer to the exact all-reduce, more bytes)", ge=1, training_only=True)
    powersgd_warmup: int = _f(10, "with --grad-compression powersgd: optimizer steps with the plain all-reduce before "
                                  "compression starts (at least 2: DDP's first steps rebuild its buckets)", ge=2, training_only=True)
    sync_batchnorm: bool = _f(False, "batch-norm statistics over the global batch (SyncBatchNorm on CUDA, an all-reduce batch norm on CPU)", training_only=True)
    bucket_cap_mb: float = _f(25.0, "DDP gradient bucket size in MiB", gt=0, resumable=True, training_only=True)
    init_timeout_s: float = _f(600.0, "collective timeout until the first step has run (covers compilation)", gt=0,
                               resumable=True)
    rendezvous_timeout_s: float = _f(300.0, "how long a process waits for every other process of the job to join "
                                            "(then one line names the missing ranks)", gt=0, resumable=True)
    step_timeout_s: float = _f(120.0, "collective timeout after the first step: a dead peer ends the job this fast", gt=0,
                               resumable=True)
    # The strategies' own tables ([distributed.ps], [distributed.pipeline], ...), by name: each is
    # registered by a module of the strategies' package that declares it (`register_table`), imported
    # when the tables are first asked for (registry.py). Those modules import no torch.
    tables: dict = field(default_factory=lambda: {n: t.cls() for n, t in DistributedConfig.TABLES.items()},
                         repr=False, metadata={"tables": True})
    TABLES: typing.ClassVar[Registry] = Registry(
        "option table", "[distributed.<name>]",
        choices=Choices(declared=Declarations("scaletrain.distributed.strategies", "register_table")))

    def rules_problem(self) -> str | None:
        """A rule tying this section's fields together that they break (one line, with the fix)."""
        named = ",".join(map(str, self.devices))
        if len(set(self.devices)) < len(self.devices):
            return f"--devices {named} names a device twice; one process per device"
        if self.devices and self.nproc > 1 and len(self.devices) != self.nproc:
            return f"--devices {named} names {len(self.devices)} device(s) for --nproc {self.nproc}; name one device per process"
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        if self.grad_compression != "powersgd" and any(getattr(self, k) != defaults[k]
                                                       for k in ("powersgd_rank", "powersgd_warmup")):
            return "--powersgd-rank and --powersgd-warmup need --grad-compression powersgd"
        return None

    @staticmethod
    def reads(table: str, strategy: str) -> bool:
        """Whether the strategy `strategy` reads the option table `table` (is one of its owners)."""
        return strategy in DistributedConfig.TABLES[table].owners

    def __getattr__(self, name: str):
        # Only reached for names that are not fields: a registered table, made on first use.
        if name.startswith("__") or name not in DistributedConfig.TABLES:
            raise AttributeError(f"DistributedConfig has no field or table '{name}'")
        return self.tables.setdefault(name, DistributedConfig.TABLES[name].cls())


def register_table(name: str, cls: type, owners: tuple[str, ...]) -> type:
    """Adds the option table `cls` as `[distributed.<name>]` (flags: its fields' names), read by the
    strategies `owners`. Called in a module of the strategies' package that imports no torch (ps's
    options.py, hsdp_options.py): configs, flags and `--help` find it by its declaration there."""
    DistributedConfig.TABLES.add(name, Table(cls, tuple(owners)))
    return cls


def _tables(obj: Any) -> dict[str, Table]:
    return getattr(type(obj), "TABLES", {}) if not isinstance(obj, type) else getattr(obj, "TABLES", {})


def _table_problem(distributed: DistributedConfig, cfg: "TrainConfig") -> str | None:
    """A table's value set under a strategy that does not read it, or a table's own rule broken."""
    for name, table in DistributedConfig.TABLES.items():
        options, default = getattr(distributed, name), table.cls()
        if distributed.strategy not in table.owners:
            for f in dataclasses.fields(options):
                if getattr(options, f.name) != getattr(default, f.name):
                    return f"--{f.name.replace('_', '-')} needs --strategy {' or '.join(table.owners)}"
        elif hasattr(options, "problem"):
            problem = options.problem(cfg)
            if problem:
                return problem
    return None


@dataclass(kw_only=True, slots=True)
class MemoryConfig:
    activation_checkpointing: bool = _f(False, "keep only each repeated block's input and recompute its activations in the backward pass", resumable=True)
    block_classes: list[str] = _f([], "class names of the model's repeated blocks for activation checkpointing and fsdp (default: found automatically)", resumable=True)


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    every: int = _f(0, "save a checkpoint every N optimizer steps (0: only at the end when a folder is set)", ge=0, resumable=True)
    dir: str | None = _f(None, "checkpoint folder (default: <run folder>/checkpoints)", resumable=True)
    keep: int = _f(3, "keep the newest K complete checkpoints", ge=1, resumable=True)
    resume: str | None = _f(None, "'auto' (newest complete checkpoint of the run folder) or a checkpoint folder", resumable=True)
    async_save: bool = _f(True, "write checkpoints in the background (staged to host memory first; training waits "
                                "only for the copy); --no-async-save: training waits for the whole write",
                          resumable=True)


@dataclass(kw_only=True, slots=True)
class TrackingConfig:
    store: str = _f("scaletrain-runs/runs.db", "run store: the SQLite file every run is recorded in")
    record: bool = _f(True, "record this run in the run store (config, environment, metrics, system samples)", resumable=True)
    run_id: str | None = _f(None, "id of this run in the store (default: a new one; a resumed run folder keeps its id)",
                           pattern=RUN_ID_PATTERN, rule=RUN_ID_RULE, resumable=True)
    group: str | None = _f(None, "label grouping runs in the store, e.g. a sweep or a study")
    sample_interval_s: float = _f(1.0, "seconds between system samples (RSS and CPU; GPU memory and utilisation via NVML)",
                                  gt=0, resumable=True)
    loggers: list[str] = _f([], "also log the run to these trackers, e.g. mlflow,wandb: the config as parameters, "
                                "each epoch's metrics, the summary (optional extras; only the recording process "
                                "logs; a tracker that fails warns once and training goes on)",
                            choices=LOGGERS, resumable=True)
    tensorboard: bool = _f(False, "the same as --logger tensorboard: TensorBoard event files in <run folder>/tensorboard",
                           resumable=True)

    def logger_names(self) -> list[str]:
        """The trackers this run logs to, each once."""
        names = [*self.loggers, *(["tensorboard"] if self.tensorboard else [])]
        return list(dict.fromkeys(names))


_FOUND_VALID: dict[str, None] = {}   # repr of each configuration found valid, oldest first
_REMEMBERED = 64


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"doc": "the model"})
    data: DataConfig = field(default_factory=DataConfig, metadata={"doc": "the data"})
    optim: OptimConfig = field(default_factory=OptimConfig, metadata={"doc": "optimizer and schedule"})
    precision: PrecisionConfig = field(default_factory=PrecisionConfig, metadata={"doc": "numeric precision"})
    distributed: DistributedConfig = field(default_factory=DistributedConfig, metadata={"doc": "devices and processes"})
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig, metadata={"doc": "checkpoints and resume"})
    memory: MemoryConfig = field(default_factory=MemoryConfig, metadata={"doc": "activation checkpointing"})
    tracking: TrackingConfig = field(default_factory=TrackingConfig, metadata={"doc": "the run store"})
    epochs: int = _f(10, "maximum number of epochs", ge=1, resumable=True)
    batch_size: int = _f(128, "global batch: samples per optimizer step over all replicas", ge=1)
    per_replica_batch_size: int | None = _f(None, "fix the per-replica batch instead (global = replicas x this)", ge=1)
    accumulate_to_global: bool = _f(False, "with both batch sizes fixed, make up the global batch by gradient accumulation")
    seed: int = _f(0, "seed for weights, data order and augmentation", ge=0)
    device: str = _f("auto", "auto, cpu, cuda or cuda:N", pattern=r"auto|cpu|cuda(:[0-9]+)?",
                     rule="auto, cpu, cuda or cuda:N", resumable=True)
    steps_per_execution: int = _f(1, "training steps per host round-trip (callbacks and metrics every N steps)", ge=1, resumable=True)
    compile: bool = _f(False, "apply torch.compile to the model", resumable=True)
    threads: int | None = _f(None, "intra-op CPU threads (torch.set_num_threads; default: torch's own, one per "
                                   "core, or a multi/tune slot's share of the cores)", ge=1, resumable=True)
    inter_op_threads: int | None = _f(None, "inter-op CPU threads (torch.set_num_interop_threads; default: torch's "
                                            "own)", ge=1, resumable=True)
    channels_last: bool | None = _f(None, "store 4-D weights channels-last (NHWC), which convolutions then also use "
                                          "for their activations (default: on for a model with 2-D convolutions on "
                                          "a GPU, off elsewhere; --no-channels-last turns it off)", resumable=True)
    cudnn_benchmark: bool | None = _f(None, "let cuDNN time its convolution algorithms once per input shape and keep "
                                            "the fastest (default: on on a GPU when every batch has one shape; "
                                            "--no-cudnn-benchmark turns it off)", resumable=True)
    compile_mode: str | None = _f(None, "torch.compile mode, e.g. max-autotune-no-cudagraphs", choices=COMPILE_MODES, resumable=True)
    cuda_graphs: bool | None = _f(None, "capture the whole training step in a CUDA graph (default: on with steps_per_execution>1 on CUDA)", resumable=True)
    task: str = _f("auto", "what is learned and how it is scored: auto (the data set's; the model's own loss for a "
                   "model whose forward takes labels=), classification, regression, language-model, own-loss, or "
                   "your own package.module:Task class (docs/your-task.md)", choices=TASKS)
    target: float | None = _f(None, "stop once the validation metric --target-metric reaches this for `patience` "
                              "epochs (at or above it; at or below for loss, perplexity and mae)",
                              rule="any finite number (its range depends on the metric: checked below)", resumable=True)
    # Any name: the task says which metrics it reports (a user's task or a LightningModule its own),
    # and the run refuses one it does not report before its folder is opened (Task.check_metric).
    target_metric: str = _f("auto", "the validation metric --target refers to: auto (the task's: accuracy, r2, "
                            "perplexity) or another the task reports, e.g. loss, or a metric of your own task",
                            pattern=r"[a-z][a-z0-9_]*", rule="a metric name (lower-case letters, digits and _)",
                            resumable=True)
    patience: int = _f(1, "epochs at the target before stopping", ge=1, resumable=True)
    early_stopping_patience: int | None = _f(None, "stop after this many epochs without a better validation loss", ge=1, resumable=True)
    eval_each_epoch: bool = _f(True, "evaluate on the validation split after every epoch, and on the test split once "
                               "at the end (off: training only, e.g. to time steps)", resumable=True)
    log_every: int = _f(50, "read the running loss back from the device every N steps", ge=1, resumable=True)
    run_dir: str | None = _f(None, "folder for this run's metrics, summary and model (default: ./scaletrain-runs/<name>)", resumable=True)
    metrics_format: str = _f("jsonl", "per-epoch metrics log format: jsonl or csv", choices=("jsonl", "csv"))
    summary_json: str | None = _f(None, "also write the run summary as JSON to this path", resumable=True)
    progress: bool = _f(True, "show a progress bar when attached to a terminal", resumable=True)
    save_model: bool = _f(True, "save the final model's state dict as model.pt in the run folder", resumable=True)
    overwrite: bool = _f(False, "start a new run in a --run-dir that already holds one, deleting that folder's files "
                         "(the old run stays in the run store under its own id)", resumable=True)

    def validate(self) -> None:
        """Checks every field against the values it admits (declared beside it), then the few
        rules that tie fields together, then the files it names. Raises ConfigError naming the key
        and what it admits. Values already found valid in this process are not checked again
        (the CLI, the run's start, build_training and the Trainer each accept a configuration
        from their callers); the files are, as they can come and go."""
        values = repr(self)
        if values not in _FOUND_VALID:
            self._check_values()
            _FOUND_VALID[values] = None
            while len(_FOUND_VALID) > _REMEMBERED:
                del _FOUND_VALID[next(iter(_FOUND_VALID))]
        self._check_files()

    def _check_values(self) -> None:
        for key, check, value in _checked_fields(self):
            problem = check.problem(value)
            if problem:
                raise ConfigError(f"config key '{key}' {problem} (got {value!r})")
        if self.target is not None and self.target_metric in ("accuracy", "r2") and not self.target <= 1:
            raise ConfigError(f"config key 'target' must be at most 1 for {self.target_metric} (got {self.target!r}); "
                              "give a fraction, e.g. 0.95")
        problem = self.distributed.rules_problem() or _table_problem(self.distributed, self)
        if problem:
            raise ConfigError(problem)
        if not self.data.drop_last:
            fixed = [flag for flag, on in (("--steps-per-execution", self.steps_per_execution > 1),
                                           ("--cuda-graphs", bool(self.cuda_graphs)),
                                           ("--grad-accum-steps", self.optim.grad_accum_steps > 1),
                                           ("--nproc", self.distributed.nproc > 1)) if on]
            if fixed:
                raise ConfigError(f"config key 'data.drop_last' false trains a smaller last step, but {fixed[0]} needs "
                                  "every step of one shape; keep drop_last (the default) or leave that off")

    def _check_files(self) -> None:
        if self.model.init_from is not None and not Path(self.model.init_from).is_file():
            raise ConfigError(f"--init-from {self.model.init_from}: no such file; pass the model.pt of a run "
                              "(in its run folder)")
        if self.checkpoint.resume not in (None, "auto") and not Path(self.checkpoint.resume).is_dir():
            raise ConfigError(f"--resume {self.checkpoint.resume}: no such checkpoint folder; pass 'auto' or the "
                              "folder of a complete checkpoint (one holding a COMMITTED file)")


def _checked_fields(obj: Any, prefix: str = ""):
    """(dotted key, Check, value) for every leaf field, the strategies' tables included."""
    for f in dataclasses.fields(obj):
        if f.metadata.get("tables"):
            for name in _tables(obj):
                yield from _checked_fields(getattr(obj, name), f"{prefix}{name}.")
            continue
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _checked_fields(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f.metadata.get("check", Check()), value


def _leaf_fields(cls: type, prefix: str = ""):
    """(dotted key, dataclasses.Field, type) of every leaf field of a config class, tables included."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("tables"):
            for name, table in _tables(cls).items():
                yield from _leaf_fields(table.cls, f"{prefix}{name}.")
        elif dataclasses.is_dataclass(hints[f.name]):
            yield from _leaf_fields(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, hints[f.name]


def resumable_keys(cls: type | None = None) -> frozenset[str]:
    """The dotted keys a resume may change (declared on each field with `resumable=True`)."""
    return frozenset(key for key, f, _ in _leaf_fields(cls or TrainConfig) if f.metadata.get("resumable"))


def get_path(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def set_path(obj: Any, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        obj = getattr(obj, part)
    setattr(obj, last, value)


def field_docs(cls: type, prefix: str = "") -> dict[str, tuple[Any, str]]:
    """Maps each dotted leaf key of a config class to (type, doc)."""
    return {key: (tp, f.metadata.get("doc", "")) for key, f, tp in _leaf_fields(cls, prefix)}


def training_only_keys(cls: type) -> tuple[str, ...]:
    """The dotted keys only training reads (`_f(training_only=True)`)."""
    return tuple(key for key, f, _ in _leaf_fields(cls) if f.metadata.get("training_only"))


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if args:
        return " or ".join(_type_name(a) for a in args)
    return getattr(tp, "__name__", str(tp))


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Checks (and, for int->float, widens) a value against a field type; raises ConfigError naming the key."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(value, option, key)
            except ConfigError:
                pass
        raise ConfigError(f"config key '{key}' expects {_type_name(tp)}, got {type(value).__name__} {value!r}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"config key '{key}' expects {_type_name(tp)}, got {type(value).__name__} {value!r}")
        (item,) = typing.get_args(tp)
        return [coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, tp)
    if not ok:
        raise ConfigError(f"config key '{key}' expects {_type_name(tp)}, got {type(value).__name__} {value!r}")
    return value


def _renamed(data: dict) -> dict:
    """Configs written before the target generalised: `target_accuracy = X` is `target = X` on
    the accuracy metric (saved run configs and recipes keep loading)."""
    if "target_accuracy" not in data:
        return data
    data = dict(data)
    value = data.pop("target_accuracy")
    if "target" in data:
        raise ConfigError("config keys 'target_accuracy' and 'target' are both set; keep 'target' (with "
                          "'target_metric')")
    data["target"] = value
    data.setdefault("target_metric", "accuracy")
    return data


def from_mapping(cls: type, data: dict, prefix: str = "", base: Any = None) -> Any:
    """Builds (or updates `base` of) a config dataclass from a nested mapping, strictly."""
    obj = base if base is not None else cls()
    if cls is TrainConfig:
        data = _renamed(data)
    hints = typing.get_type_hints(cls)
    tables = _tables(cls)
    names = {f.name for f in dataclasses.fields(cls) if not f.metadata.get("tables")}
    data = _into_tables(data, tables, names)
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in names and key not in tables:
            raise ConfigError(f"unknown config key '{dotted}'; valid keys here: {', '.join(sorted(names | set(tables)))}")
        tp = tables[key].cls if key in tables else hints[key]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{dotted}' must be a table ([{dotted}])")
            from_mapping(tp, value, f"{dotted}.", getattr(obj, key))
        else:
            setattr(obj, key, coerce(value, tp, dotted))
    return obj


def _into_tables(data: dict, tables: dict[str, Table], names: set[str]) -> dict:
    """Keys written before a strategy owned its table (`distributed.num_ps`, saved run configs and
    old TOML files) move into the one table that has a field of that name."""
    moved = {k: v for k, v in data.items() if k not in names and k not in tables}
    if not moved:
        return data
    out = {k: v for k, v in data.items() if k not in moved}
    for key, value in moved.items():
        owner = [name for name, t in tables.items() if key in {f.name for f in dataclasses.fields(t.cls)}]
        if len(owner) != 1:
            out[key] = value          # unknown: from_mapping names it
            continue
        table = out.setdefault(owner[0], {})
        if not isinstance(table, dict) or key in table:
            raise ConfigError(f"config key '{key}' is set both flat and in [distributed.{owner[0]}]; keep the table's")
        out[owner[0]] = {**table, key: value}
    return out


def to_mapping(obj: Any) -> dict:
    """The config as plain nested dicts (for TOML/JSON), None values dropped (TOML has no null)."""
    out = {}
    for f in dataclasses.fields(obj):
        if f.metadata.get("tables"):
            for name in sorted(_tables(obj)):
                out[name] = to_mapping(getattr(obj, name))
            continue
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out[f.name] = to_mapping(value)
        elif value is not None:
            out[f.name] = value
    return out


def flatten_mapping(mapping: dict, prefix: str = "") -> dict:
    """A config mapping as {dotted key: value}; model options stay one value (a dict)."""
    out = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and key != "options":
            out.update(flatten_mapping(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def load_toml(path: str | Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass the path of a TOML file to --config")
    from scaletrain.files import MAX_BYTES, check_nesting
    try:
        if path.stat().st_size > MAX_BYTES:
            raise ConfigError(f"config file {path} is {path.stat().st_size / 2**20:.0f} MiB, larger than any "
                              f"configuration ({MAX_BYTES // 2**20} MiB at most); pass the TOML file of a run")
        with path.open("rb") as fh:
            return check_nesting(tomllib.load(fh), f"config file {path}", ConfigError)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config file {path} nests arrays or tables too deeply to be a configuration") from None
    except UnicodeDecodeError as exc:   # TOML is UTF-8 by definition
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as "
                          "UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read ({exc.strerror or exc}); pass a readable TOML "
                          "file") from None


def write_toml(cfg: TrainConfig, path: str | Path) -> Path:
    """Writes a config as TOML that `scaletrain train --config` reads back to an equal config."""
    import tomli_w
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(to_mapping(cfg)))
    return path


def config_digest(mapping: dict) -> str:
    """The SHA-256 of a configuration mapping in canonical JSON (sorted keys, no spaces): what binds
    a run's saved config.json to the run (run.json and the run store keep it), whatever the
    file's layout."""
    return hashlib.sha256(json.dumps(mapping, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def identity_digest(cfg: TrainConfig) -> str:
    """The SHA-256 of what a run *is*: its configuration without the keys a resume may change
    (`resumable`: epochs, the checkpoint settings...) and without the process layout (`distributed`:
    a checkpoint reshards onto another strategy, process count and its options). A checkpoint
    records it, and a run resumes only a checkpoint whose digest is its own (another run's weights
    are never adopted, whatever folder they were found in)."""
    changeable = resumable_keys()
    return config_digest({k: _canonical(v) for k, v in flatten_mapping(to_mapping(cfg)).items()
                          if k not in changeable and not k.startswith("distributed.")})


def _canonical(value: Any) -> Any:
    """A value as its number, not its spelling: 15 and 15.0 are one value (a float field keeps an
    integer its default or a TOML file gave until a config is read back, which makes it 15.0)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    return value
