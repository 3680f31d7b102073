"""`scaletrain train --nproc N`: start N local workers through torchrun's elastic agent.

The agent (torch.distributed.run, the code behind the `torchrun` command) spawns the workers,
runs the c10d rendezvous, watches them, and on a failure tears the group down and restarts it up
to --max-restarts times (each restart resumes from the newest complete checkpoint). With a
SCALETRAIN_CLUSTER spec the same command joins a multi-host job: one agent per host, the spec's
first address as the rendezvous endpoint.
"""

from __future__ import annotations

import hashlib
import os
import sys

import torch

from scaletrain.distributed.cluster import cluster_from_env
from scaletrain.errors import ConfigError

WORKER_MARK = "TORCHELASTIC_RUN_ID"  # set by the agent in every worker's environment


def inside_worker() -> bool:
    return WORKER_MARK in os.environ


LAUNCHER_FLAGS = ("--nproc", "--max-restarts")


def strip_launcher_flags(argv: list[str]) -> list[str]:
    """The workers' arguments: the user's, minus the flags only the launcher reads (torchrun's own
    parser would otherwise take `--nproc` for an abbreviation of its `--nproc-per-node`)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in LAUNCHER_FLAGS:
            skip = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in LAUNCHER_FLAGS)):
            out.append(arg)
    return out


def torchrun_arguments(nproc: int, max_restarts: int, worker_argv: list[str], command: str = "train") -> list[str]:
    args = ["--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts)]
    spec = cluster_from_env()
    if spec is None:
        args.append("--standalone")
    else:
        # Every host runs this same command; the cluster spec says which host it is and where to meet.
        rdzv_id = hashlib.sha1(",".join(spec.addresses).encode()).hexdigest()[:12]
        # --local-addr: advertise the spec's own address rather than whatever the hostname resolves to.
        args += ["--nnodes", str(spec.world_size), "--node-rank", str(spec.rank), "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", spec.addresses[0], "--rdzv-id", rdzv_id,
                 "--local-addr", spec.addresses[spec.rank].rsplit(":", 1)[0]]
    return args + ["-m", "scaletrain", command, *strip_launcher_flags(worker_argv)]


def launch_from_config(cfg, argv: list[str], run_dir: str, run_id: str) -> int:
    """Checks what every worker would check, then launches. `argv`: the user's `train` arguments;
    `run_dir` and `run_id`: the run the caller planned, which every worker and every restart shares."""
    from scaletrain.distributed.batching import plan_batch
    from scaletrain.distributed.strategies.registry import build_layout
    spec = cluster_from_env()
    # The layout every worker will build, checked here first: its errors are one line, before any worker starts.
    layout = build_layout(cfg.distributed, cfg.distributed.nproc * (spec.world_size if spec else 1))
    plan_batch(cfg.batch_size, cfg.per_replica_batch_size, layout.replicas, cfg.optim.grad_accum_steps,
               cfg.accumulate_to_global)
    if cfg.distributed.max_restarts > 0 and cfg.checkpoint.every <= 0:
        print("scaletrain: note: --max-restarts without --checkpoint-every: a restarted group starts over",
              file=sys.stderr)
    worker_argv = argv + ["--run-dir", run_dir, "--run-id", run_id]
    return launch(cfg.distributed.nproc, cfg.distributed.max_restarts, cfg.device, worker_argv, role=layout.role)


def launch(nproc: int, max_restarts: int, device: str, worker_argv: list[str], command: str = "train",
           role=lambda rank: f"worker rank {rank}") -> int:
    """Runs the elastic agent in this process, each worker running `scaletrain COMMAND
    WORKER_ARGV`; returns the job's exit code."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    wants_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if wants_cuda and torch.cuda.device_count() < nproc:
        raise ConfigError(f"--nproc {nproc} needs {nproc} GPUs on this host, it has {torch.cuda.device_count()}; "
                          f"use --nproc {max(torch.cuda.device_count(), 1)} or --device cpu")
    # torchrun shares its rendezvous TCPStore with the workers by default, and after a restart the
    # new workers can read the dead ones' addresses from it (pytorch/pytorch#135712, #167288:
    # gloo/NCCL then fail with "connection refused"). A store per attempt avoids that.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    args = get_args_parser().parse_args(torchrun_arguments(nproc, max_restarts, worker_argv, command))
    try:
        run(args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        print(f"scaletrain: error: {role(rank)} failed with exit code {failure.exitcode} "
              f"(after {max_restarts} allowed restart(s)); its output is above", file=sys.stderr)
        return 1
    return 0
