"""`scaletrain train --nproc N`: start N local workers through torchrun's elastic agent.

The agent (torch.distributed.run, the code behind the `torchrun` command) spawns the workers,
runs the c10d rendezvous, watches them, and on a failure tears the group down and restarts it up
to --max-restarts times (each restart resumes from the newest complete checkpoint). With a
SCALETRAIN_CLUSTER spec the same command joins a multi-host job: one agent per host, the spec's
first address as the rendezvous endpoint.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import sys

import torch

from scaletrain.distributed.cluster import cluster_from_env
from scaletrain.distributed.env import LAUNCHER_PID_ENV, child_command, under_launcher
from scaletrain.errors import INTERRUPTED_EXIT_CODE, TERMINATED_EXIT_CODE, ConfigError
from scaletrain.user_code.failures import HEADLINE_START

# Whether this process is one of the agent's workers (which must not launch again).
inside_worker = under_launcher


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
    # torchrun's `-m` runs this interpreter; a child command of its own runs as it is (--no-python).
    entry = ["--no-python", *child] if (child := child_command()) else ["-m", "scaletrain"]
    return args + [*entry, command, *strip_launcher_flags(worker_argv)]


def launch_from_config(cfg, layout, argv: list[str], run_dir: str, run_id: str) -> int:
    """Launches the job `cfg` describes, laid out as `layout` (checked by the caller: see
    training/preflight.py). `argv`: the user's `train` arguments; `run_dir` and `run_id`: the run
    the caller planned, which every worker and every restart shares."""
    if cfg.distributed.max_restarts > 0 and cfg.checkpoint.every <= 0:
        print("scaletrain: note: --max-restarts without --checkpoint-every: a restarted group starts over",
              file=sys.stderr)
    worker_argv = argv + ["--run-dir", run_dir, "--run-id", run_id]
    return launch(cfg.distributed.nproc, cfg.distributed.max_restarts, cfg.device, worker_argv, role=layout.role,
                  devices=cfg.distributed.devices)


def launch(nproc: int, max_restarts: int, device: str, worker_argv: list[str], command: str = "train",
           role=lambda rank: f"worker rank {rank}", devices: list[int] | tuple[int, ...] = ()) -> int:
    """Runs the elastic agent in this process, each worker running `scaletrain COMMAND
    WORKER_ARGV` (on its one of `devices`, --devices, where given); returns the job's exit code."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    from scaletrain.distributed.devices import check_host_devices

    wants_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    check_host_devices(list(devices), "cuda" if wants_cuda else "cpu")
    if wants_cuda and not devices and torch.cuda.device_count() < nproc:
        raise ConfigError(f"--nproc {nproc} needs {nproc} GPUs on this host, it has {torch.cuda.device_count()}; "
                          f"use --nproc {max(torch.cuda.device_count(), 1)} or --device cpu")
    # torchrun shares its rendezvous TCPStore with the workers by default, and after a restart the
    # new workers can read the dead ones' addresses from it (pytorch/pytorch#135712, #167288:
    # gloo/NCCL then fail with "connection refused"). A store per attempt avoids that.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # The workers end with this process, whatever ends it (env.die_with_launcher).
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    # Stopping the job (Ctrl-C, SIGTERM, a failed peer), the agent gives each worker this long to
    # end on SIGTERM before SIGKILL (torch's default is 30 s). A worker's own ending (recording
    # the run as interrupted) takes well under a second; one blocked inside a collective cannot
    # run its handler at all, and Ctrl-C should not then take half a minute. Checkpoints are
    # committed atomically, so a kill never damages the newest complete one.
    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "10")
    # The host's cores shared among its workers (torchrun would give each one thread, and say so).
    # Pinned to a core each (--devices on a CPU host), a worker runs one thread.
    os.environ.setdefault("OMP_NUM_THREADS", "1" if devices else str(max(1, (os.cpu_count() or 1) // nproc)))
    args = get_args_parser().parse_args(torchrun_arguments(nproc, max_restarts, worker_argv, command))
    # The agent logs each failed and stopped worker; the job's failure is reported below, once.
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    # ... and its own "Received 15 death signal, shutting down workers": the job's one line says so.
    logging.getLogger("torch.distributed.elastic.agent.server.api").setLevel(logging.ERROR)
    try:
        run(args)
    except ChildFailedError as exc:
        rank, failure = _first_failure(exc.failures)
        return _report_failure(role(rank), failure, max_restarts)
    except SignalException as exc:
        # The agent stopped its workers (each recorded its run as interrupted) and re-raised the signal.
        words = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}
        print(f"scaletrain: {words.get(exc.sigval, f'terminated ({exc.sigval.name})')}", file=sys.stderr)
        return 128 + int(exc.sigval)
    return 0


def _first_failure(failures: dict) -> tuple[int, object]:
    """The failure that ended the job. Every failure here was seen at the one poll of the agent
    that stopped the rest, so all of them died within one monitor interval (0.1 s): time alone
    cannot order them, because a process killed outright (SIGKILL, SIGSEGV, the OOM killer) has only
    the agent's whole-second stamp of when it noticed, and a peer that failed a few ms after it
    (its connection to the dead one closed) can carry an earlier time in ns when a second boundary
    falls in between (seen in CI: a SIGKILLed server reported as "worker rank 0 failed with exit
    code 1"). So a process killed outright counts first: it is what its peers failed from. Among
    the rest, the earliest; the agent's own stops (SIGINT/SIGTERM endings) only where nothing else
    failed (torch's own pick, by whole seconds, often names a worker it stopped)."""
    stopped = {INTERRUPTED_EXIT_CODE, TERMINATED_EXIT_CODE, -signal.SIGINT, -signal.SIGTERM}
    causes = {rank: f for rank, f in failures.items() if f.exitcode not in stopped} or failures

    def handed_ns(failure) -> int | None:
        # A worker of ours wrote its time in ns with its line (env.hand_to_launcher).
        data = failure.error_file_data if isinstance(failure.error_file_data, dict) else {}
        return data["time_ns"] if isinstance(data.get("time_ns"), int) else None

    def order(rank: int) -> tuple:
        failure = causes[rank]
        ns = handed_ns(failure)
        killed_outright = failure.exitcode < 0 and ns is None
        return (not killed_outright, ns if ns is not None else failure.timestamp * 1_000_000_000, rank)

    rank = min(causes, key=order)
    return rank, causes[rank]


def _report_failure(who: str, failure, max_restarts: int) -> int:
    """One line for the job, the last it prints, and the exit code the first failing worker had:
    its own line where it handed one over (an error it met: env.hand_to_launcher), else which
    worker failed and how."""
    code = failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode   # a signal: 128 + its number
    message = failure.message if isinstance(failure.message, str) else ""
    if message.startswith(HEADLINE_START):   # the user's code raised in that worker: which one, then where
        print(f"scaletrain: error: {who} failed: {message.removeprefix('scaletrain: ')}", file=sys.stderr)
    elif message.startswith("scaletrain:"):
        print(message, file=sys.stderr)
    else:
        print(f"scaletrain: error: {who} failed with exit code {failure.exitcode} "
              f"(after {max_restarts} allowed restart(s)); its output is above", file=sys.stderr)
    return code
