"""Typed run configuration: nested dataclasses that TOML files and CLI flags map onto.

Every field has a default, a one-line doc, which the CLI reuses as help, and the values it admits
(options.py's `option`, here `_f`). options.py's `from_mapping` reads a config from TOML or JSON,
rejecting unknown keys and wrong types by their dotted key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.errors import ConfigError
from scaletrain.options import Table, checked_fields, flatten_mapping, leaf_fields, to_mapping
from scaletrain.options import option as _f
from scaletrain.registry import Choices, Declarations, Registry

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
    train_subset: int | None = _f(None, "use only the first N training samples (the seed's lab uses 10000; for "
                                        "shards, the "
                                  "fewest leading shards holding N)", ge=1)
    val_fraction: float = _f(0.1, "fraction of the training split held out for validation (per-epoch evaluation, "
                             "stopping, tuning) when the data set has no validation split; the test split is "
                             "evaluated once, at the end", gt=0, lt=1)
    shape: list[int] = _f([3, 32, 32], "sample shape for the synthetic data set", ge=1)
    num_classes: int = _f(10, "number of classes for the synthetic data set", ge=2)
    val_batch_size: int | None = _f(None, "evaluation batch size (default: the training batch size)", ge=1,
                                    resumable=True)
    num_workers: int = _f(0, "DataLoader worker processes for the streaming path and for shards", ge=0, resumable=True)
    prefetch: int = _f(2, "shards: batches each worker reads ahead, and batches copied ahead to the device", ge=1,
                       resumable=True)
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
    lr_scaling_warmup_epochs: float = _f(1.0, "ramp from the base LR to the scaled LR over this many epochs (Goyal "
                                              "et al.)",
                                         ge=0)


@dataclass(kw_only=True, slots=True)
class PrecisionConfig:
    policy: str = _f("auto", "auto (bf16-mixed on a GPU that computes bfloat16 natively, CUDA capability 8.0 and "
                     "newer; fp32 elsewhere: the start line says which and why), fp32 (PyTorch's default: TF32 "
                     "convolutions on such GPUs, IEEE float32 matrix products), fp32-strict (IEEE float32 "
                     "everywhere), tf32, bf16-mixed, fp16-mixed, bf16-true or fp8 (torchao's float8 training of the "
                     "linear layers: pip install 'scaletrain[fp8]'; a GPU of compute capability 8.9 or newer)",
                     choices=PRECISIONS, settled=True)
    fp32_modules: list[str] = _f([], "module names or class names kept in float32")
    fp8_recipe: str = _f("tensorwise", "--precision fp8: torchao's scaling recipe, tensorwise (one scale a tensor) or "
                                       "rowwise (a scale a row)", choices=("tensorwise", "rowwise"))
    fp8_emulate: bool = _f(False, "--precision fp8 on a device without float8 tensor cores (a CPU, a GPU older than "
                                  "compute capability 8.9): emulated, for tests and correctness checks, not faster")
    fp8_shapes: str = _f("auto", "--precision fp8: which linear layers train in float8, by shape: auto (each distinct "
                                 "layer shape measured on a GPU with float8 tensor cores, float8 against bf16, "
                                 "forward and backward; elsewhere torchao's rule, as all), all (every layer whose "
                                 "dimensions divide by 16), none, or the shapes IN x OUT to convert, as 1024x4096,"
                                 "4096x1024 (what a measured run records)",
                         pattern=r"auto|all|none|[0-9]+x[0-9]+(,[0-9]+x[0-9]+)*",
                         rule="auto, all, none, or shapes INxOUT separated by commas (1024x4096,4096x1024)",
                         settled=True)
    init_scale: float = _f(2.0**16, "fp16-mixed: initial loss scale", gt=0)
    growth_interval: int = _f(2000, "fp16-mixed: finite steps before the loss scale doubles", ge=1)


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
    grad_compression: str = _f("none", "how gradients cross the links: none (plain all-reduce), bf16 or fp16 (16 "
                                       "bits on the wire: half the bytes), or powersgd (a low-rank approximation, "
                                       "DDP only: see --powersgd-rank; `scaletrain scaling` prices each)",
                               choices=("none", "bf16", "fp16", "powersgd"), training_only=True)
    powersgd_rank: int = _f(1, "with --grad-compression powersgd: the rank of each gradient matrix's approximation "
                               "(higher: closer to the exact all-reduce, more bytes)", ge=1, training_only=True)
    powersgd_warmup: int = _f(10, "with --grad-compression powersgd: optimizer steps with the plain all-reduce "
                                  "before compression starts (at least 2: DDP's first steps rebuild its buckets)", ge=2,
                               training_only=True)
    sync_batchnorm: bool = _f(False, "batch-norm statistics over the global batch (SyncBatchNorm on CUDA, an "
                                     "all-reduce batch norm on CPU)", training_only=True)
    bucket_cap_mb: float = _f(25.0, "DDP gradient bucket size in MiB", gt=0, resumable=True, training_only=True)
    init_timeout_s: float = _f(600.0, "collective timeout until the first step has run (covers compilation)", gt=0,
                               resumable=True)
    rendezvous_timeout_s: float = _f(300.0, "how long a process waits for every other process of the job to join "
                                            "(then one line names the missing ranks)", gt=0, resumable=True)
    step_timeout_s: float = _f(120.0, "collective timeout after the first step: a dead peer ends the job this "
                                      "fast", gt=0, resumable=True)
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
            return (f"--devices {named} names {len(self.devices)} device(s) for --nproc {self.nproc}; name one device "
                    "per process")
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


def _table_problem(distributed: DistributedConfig, cfg: TrainConfig) -> str | None:
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
    activation_checkpointing: bool = _f(False, "keep only each repeated block's input and recompute its activations "
                                               "in the backward pass", resumable=True)
    block_classes: list[str] = _f([], "class names of the model's repeated blocks for activation checkpointing and "
                                      "fsdp (default: found automatically)", resumable=True)


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    every: int = _f(0, "save a checkpoint every N optimizer steps (0: only at the end when a folder is set)", ge=0,
                    resumable=True)
    dir: str | None = _f(None, "checkpoint folder (default: <run folder>/checkpoints)", resumable=True)
    keep: int = _f(3, "keep the newest K complete checkpoints", ge=1, resumable=True)
    resume: str | None = _f(None, "'auto' (newest complete checkpoint of the run folder) or a checkpoint folder",
                            resumable=True)
    async_save: bool = _f(True, "write checkpoints in the background (staged to host memory first; training waits "
                                "only for the copy); --no-async-save: training waits for the whole write",
                          resumable=True)


@dataclass(kw_only=True, slots=True)
class TrackingConfig:
    store: str = _f("scaletrain-runs/runs.db", "run store: the SQLite file every run is recorded in")
    record: bool = _f(True, "record this run in the run store (config, environment, metrics, system samples)",
                      resumable=True)
    run_id: str | None = _f(None, "id of this run in the store (default: a new one; a resumed run folder keeps its id)",
                           pattern=RUN_ID_PATTERN, rule=RUN_ID_RULE, resumable=True)
    group: str | None = _f(None, "label grouping runs in the store, e.g. a sweep or a study")
    sample_interval_s: float = _f(1.0, "seconds between system samples (RSS and CPU; GPU memory and utilisation via "
                                       "NVML)",
                                  gt=0, resumable=True)
    loggers: list[str] = _f([], "also log the run to these trackers, e.g. mlflow,wandb: the config as parameters, "
                                "each epoch's metrics, the summary (optional extras; only the recording process "
                                "logs; a tracker that fails warns once and training goes on)",
                            choices=LOGGERS, resumable=True)
    tensorboard: bool = _f(False, "the same as --logger tensorboard: TensorBoard event files in <run "
                                  "folder>/tensorboard",
                           resumable=True)

    def logger_names(self) -> list[str]:
        """The trackers this run logs to, each once."""
        names = [*self.loggers, *(["tensorboard"] if self.tensorboard else [])]
        return list(dict.fromkeys(names))



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
    accumulate_to_global: bool = _f(False, "with both batch sizes fixed, make up the global batch by gradient "
                                           "accumulation")
    seed: int = _f(0, "seed for weights, data order and augmentation", ge=0)
    device: str = _f("auto", "auto, cpu, cuda, cuda:N or xla (a TPU, or XLA on a CPU, through torch_xla: "
                             "bash scripts/setup.sh xla)", pattern=r"auto|cpu|cuda(:[0-9]+)?|xla",
                     rule="auto, cpu, cuda, cuda:N or xla", resumable=True)
    steps_per_execution: int = _f(1, "training steps per host round-trip (callbacks and metrics every N steps)", ge=1,
                                  resumable=True)
    compile: bool | None = _f(None, "apply torch.compile to the model (default: off, unless the probe measures on "
                                    "the run's own step that compiling repays its compile time over the run; "
                                    "--no-compile keeps it off)", resumable=True)
    threads: int | None = _f(None, "intra-op CPU threads (torch.set_num_threads; default: torch's own, one per "
                                   "core, or a multi/tune slot's share of the cores)", ge=1, resumable=True)
    inter_op_threads: int | None = _f(None, "inter-op CPU threads (torch.set_num_interop_threads; default: torch's "
                                            "own)", ge=1, resumable=True)
    flush_denormal: bool = _f(True, "flush subnormal floats to zero on every CPU thread that computes (FTZ/DAZ, as "
                                    "TensorFlow, XLA and JAX do): a converging model's tiny gradients otherwise "
                                    "run in microcode, up to 10x slower a step on some CPUs; --no-flush-denormal "
                                    "keeps them", resumable=True)
    probe: bool = _f(True, "with --precision auto, time the precisions this device computes natively on the run's "
                           "own step before training (a few interleaved steps on copies of the run) and train in the "
                           "fastest that beats the rule's choice beyond the noise with its loss in tolerance; the "
                           "decision is cached per model and machine; --no-probe: the rule alone", resumable=True)
    probe_share: float = _f(0.05, "the most of the run's predicted time the probe may take (at most 60 s); a run "
                                  "too short for a probe within it is not probed; 1 probes even a short run",
                            gt=0, le=1, resumable=True)
    channels_last: bool | None = _f(None, "store 4-D weights channels-last (NHWC), which convolutions then also use "
                                          "for their activations (default: on for a model with 2-D convolutions on "
                                          "a GPU, off elsewhere; --no-channels-last turns it off)", resumable=True)
    cudnn_benchmark: bool | None = _f(None, "let cuDNN time its convolution algorithms once per input shape and keep "
                                            "the fastest (default: on on a GPU when every batch has one shape; "
                                            "--no-cudnn-benchmark turns it off)", resumable=True)
    compile_mode: str | None = _f(None, "torch.compile mode, e.g. max-autotune-no-cudagraphs", choices=COMPILE_MODES,
                                  resumable=True)
    cuda_graphs: bool | None = _f(None, "capture the whole training step in a CUDA graph (default on CUDA: on with "
                                        "steps_per_execution>1; with one step, on where the probe measures the "
                                        "captured "
                                        "step faster on the run's own step and repaying its capture)", resumable=True)
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
    early_stopping_patience: int | None = _f(None, "stop after this many epochs without a better validation loss",
                                             ge=1, resumable=True)
    eval_each_epoch: bool = _f(True, "evaluate on the validation split after every epoch, and on the test split once "
                               "at the end (off: training only, e.g. to time steps)", resumable=True)
    log_every: int = _f(50, "read the running loss back from the device every N steps", ge=1, resumable=True)
    run_dir: str | None = _f(None, "folder for this run's metrics, summary and model (default: "
                                   "./scaletrain-runs/<name>)", resumable=True)
    metrics_format: str = _f("jsonl", "per-epoch metrics log format: jsonl or csv", choices=("jsonl", "csv"))
    summary_json: str | None = _f(None, "also write the run summary as JSON to this path", resumable=True)
    progress: bool = _f(True, "show a progress bar when attached to a terminal", resumable=True)
    save_model: bool = _f(True, "save the final model's state dict as model.pt in the run folder", resumable=True)
    overwrite: bool = _f(False, "start a new run in a --run-dir that already holds one, deleting that folder's files "
                         "(the old run stays in the run store under its own id)", resumable=True)

    def validate(self) -> None:
        """Checks every field against the values it admits (declared beside it), then the few
        rules that tie fields together, then the files it names. Raises ConfigError naming the key
        and what it admits. Called where a configuration enters: the command line's flags, a run's
        `settle_config`, `build_training` and the `Trainer` for the Python API; one that hands a
        checked configuration on says so (`checked=True`), so each is checked once."""
        self._check_values()
        self._check_files()

    def _check_values(self) -> None:
        for key, check, value in checked_fields(self):
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

    @staticmethod
    def upgraded_mapping(data: dict) -> dict:
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

    def _check_files(self) -> None:
        if self.model.init_from is not None and not Path(self.model.init_from).is_file():
            raise ConfigError(f"--init-from {self.model.init_from}: no such file; pass the model.pt of a run "
                              "(in its run folder)")
        if self.checkpoint.resume not in (None, "auto") and not Path(self.checkpoint.resume).is_dir():
            raise ConfigError(f"--resume {self.checkpoint.resume}: no such checkpoint folder; pass 'auto' or the "
                              "folder of a complete checkpoint (one holding a COMMITTED file)")


def settled_keys(cls: type | None = None) -> frozenset[str]:
    """The dotted keys whose `auto` the run settles and records (`settled=True` on the field)."""
    return frozenset(key for key, f, _ in leaf_fields(cls or TrainConfig) if f.metadata.get("settled"))


def resumable_keys(cls: type | None = None) -> frozenset[str]:
    """The dotted keys a resume may change (declared on each field with `resumable=True`)."""
    return frozenset(key for key, f, _ in leaf_fields(cls or TrainConfig) if f.metadata.get("resumable"))


def load_toml(path: str | Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder; pass the path of a TOML file in it to --config")
    if path.exists() and not path.is_file():
        raise ConfigError(f"config file {path} is not a regular file (a device, a pipe or a socket); pass the path "
                          "of a TOML file to --config")
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
    except ValueError as exc:   # an integer of more digits than Python converts (4,300)
        raise ConfigError(f"config file {path} holds a number too long to be a configuration value "
                          f"({str(exc).split(':')[0]})") from None
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
