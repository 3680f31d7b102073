"""Where this process sits in the job: rank, world size, restarts, as torchrun (or a cluster
spec) describes it through environment variables."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass

from scaletrain.distributed.cluster import cluster_from_env
from scaletrain.errors import ConfigError


@dataclass(frozen=True, slots=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1      # processes of the job on this host
    restart_count: int = 0
    run_id: str | None = None      # torchrun's rendezvous id: the same across restarts
    under_elastic: bool = False    # started by torchrun's elastic agent
    # Started by our launcher (`--nproc`), whose flags its workers' arguments no longer hold: the
    # run's `--max-restarts` (torchrun tells its workers); None otherwise.
    launched_restarts: int | None = None

    @property
    def is_chief(self) -> bool:
        return self.rank == 0



# The executable a scaletrain child process (a launcher's worker, a sweep's or autotune's training)
# runs as, in place of this interpreter's `-m scaletrain`: anything that takes scaletrain's own
# arguments. The test suite points it at a client of an interpreter that imported torch once
# (tests/warm_client.py), sparing each child the 5-8 s of a cold start on a small CPU.
CHILD_COMMAND_ENV = "SCALETRAIN_CHILD_COMMAND"


def child_command() -> list[str] | None:
    """The command line SCALETRAIN_CHILD_COMMAND sets (split as a shell would), else None (this
    interpreter, `-m scaletrain`)."""
    text = os.environ.get(CHILD_COMMAND_ENV, "")
    try:
        command = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"{CHILD_COMMAND_ENV}={text!r} does not parse as a command line ({exc}); quote it as a "
                          "shell would, or unset it") from None
    if command and shutil.which(command[0]) is None:
        raise ConfigError(f"{CHILD_COMMAND_ENV}={text!r}: {command[0]!r} is not an executable; give one that "
                          "takes scaletrain's arguments, or unset it (children then run `python -m scaletrain`)")
    return command or None


def scaletrain_command() -> list[str]:
    """How a child process runs scaletrain: `scaletrain_command() + [COMMAND, *ARGS]`."""
    return child_command() or [sys.executable, "-m", "scaletrain"]


def env_int(name: str, default: int, low: int = 0, environ=None, set_by: str = "torchrun") -> int:
    """The whole number in environment variable `name` (`default` when unset), at least `low`:
    anything else is one line naming the variable, before any work (int() would raise a
    traceback, or an empty value be read as 0)."""
    environ = os.environ if environ is None else environ
    text = environ.get(name)
    if text is None:
        return default
    if not text.strip().isdigit() or int(text) < low:
        raise ConfigError(f"{name}={text!r} is not a whole number >= {low} ({name} is set by {set_by}); "
                          f"unset it, or set it as {set_by} does")
    return int(text)


def dist_env(environ=None) -> DistEnv:
    """Reads torchrun's variables, strictly (each one checked, and their agreement); a cluster spec
    (SCALETRAIN_CLUSTER, TF_CONFIG, a Slurm step) fills them in when torchrun did not."""
    environ = os.environ if environ is None else environ
    if "RANK" not in environ:
        spec = cluster_from_env(environ)
        if spec is not None and not spec.is_evaluator:   # the evaluator is no rank of the job
            environ.update(spec.torch_env())
    rank, world = env_int("RANK", 0, environ=environ), env_int("WORLD_SIZE", 1, low=1, environ=environ)
    local_rank = env_int("LOCAL_RANK", 0, environ=environ)
    local_world = env_int("LOCAL_WORLD_SIZE", world, low=1, environ=environ)
    if rank >= world or local_rank >= local_world or local_world > world:
        raise ConfigError(f"torchrun's variables disagree: RANK {rank}, LOCAL_RANK {local_rank}, LOCAL_WORLD_SIZE "
                          f"{local_world}, WORLD_SIZE {world} (each rank is below its size, and a host holds at "
                          "most the whole job); start the job with torchrun, or unset them")
    if "MASTER_PORT" in environ:
        env_int("MASTER_PORT", 0, low=1, environ=environ)
        if int(environ["MASTER_PORT"]) > 65535:
            raise ConfigError(f"MASTER_PORT={environ['MASTER_PORT']!r} is not a port number (1-65535)")
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        restart_count=env_int("TORCHELASTIC_RESTART_COUNT", 0, environ=environ),
        run_id=environ.get("TORCHELASTIC_RUN_ID"),
        under_elastic="TORCHELASTIC_RUN_ID" in environ,
        launched_restarts=(env_int("TORCHELASTIC_MAX_RESTARTS", 0, environ=environ)
                           if LAUNCHER_PID_ENV in environ and "TORCHELASTIC_RUN_ID" in environ else None),
    )


def under_launcher() -> bool:
    """Whether this process is a worker of torchrun's elastic agent (ours or a plain torchrun)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


# Set by our launcher for its workers: the process whose death ends them (die_with_launcher).
LAUNCHER_PID_ENV = "SCALETRAIN_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1


def die_with_launcher() -> None:
    """A worker of our launcher is sent SIGTERM when the launcher dies, however it dies (SIGKILL
    included: its agent can then stop nobody), so no worker trains on as an orphan and each records
    its run as interrupted (issue 66: workers of a killed launcher trained to the last step). A
    launcher already gone before this ran: the worker ends at once. Linux only (prctl); elsewhere,
    and under a plain torchrun, the agent alone stops its workers."""
    expected = os.environ.get(LAUNCHER_PID_ENV, "")
    if not expected.isdigit():
        return
    import ctypes
    import signal
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != int(expected):
        os._exit(143)


def hand_to_launcher(line: str) -> bool:
    """Inside a worker of torchrun's elastic agent: leaves the line this process ends with in the
    agent's error file for this worker (TORCHELASTIC_ERROR_FILE) instead of printing it, and says
    so. The launcher then prints one line for the whole job, the first failure's (launch.py),
    where every rank would otherwise print its own copy. Outside a worker: False."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or not under_launcher():
        return False
    try:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            # The form torch's ProcessFailure reads (a message string, the time in whole seconds),
            # and the time in ns: whole seconds cannot order two ranks failing in one second.
            now = time.time_ns()
            json.dump({"message": line, "timestamp": now // 1_000_000_000, "time_ns": now}, f)
        os.replace(tmp, path)
    except OSError:
        return False
    return True
