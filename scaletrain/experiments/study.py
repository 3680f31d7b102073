"""The Optuna side of `tune`: storage (SQLite by default, any database URL Optuna accepts, such
as PostgreSQL, for trials from several hosts), sampler and pruner."""

from __future__ import annotations

import json
import random
import socket
import time
import warnings

from scaletrain.errors import UserError, first_line
from scaletrain.options import flatten_mapping, to_mapping
from scaletrain.tracking.store import process_alive

# The user attribute naming the process (host:pid) that asked for a trial and runs its training.
WORKER_ATTR = "worker"

# The parent records a heartbeat for each trial it runs; a trial whose heartbeat stops (its
# parent was killed, on this host or another) is failed after the grace period and its place in
# the trial budget freed.
HEARTBEAT_S = 5
GRACE_S = 20


def require_optuna():
    try:
        import optuna
    except ImportError:
        raise UserError("tune needs Optuna: pip install 'scaletrain[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def open_storage(url: str):
    optuna = require_optuna()
    # heartbeat_interval is marked experimental since Optuna 2.9; it is what frees a killed host's trials.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    engine_kwargs = {}
    if url.startswith("sqlite"):
        # Trials report from their own processes: wait for the write lock instead of failing.
        engine_kwargs["connect_args"] = {"timeout": 60}
    else:
        engine_kwargs["pool_pre_ping"] = True
    for attempt in range(5):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=HEARTBEAT_S,
                                              grace_period=GRACE_S)
        except ImportError as exc:
            raise UserError(f"storage {url}: a database driver is missing ({exc}); for PostgreSQL: "
                            "pip install 'scaletrain[postgres]'") from None
        except Exception as exc:  # sqlalchemy's errors: a bad URL, a server that does not answer
            # Two processes creating the schema of a new database at once: one of them loses the
            # race (SQLite: a unique constraint; PostgreSQL: "relation ... already exists"); a
            # moment later the tables exist and opening succeeds.
            if _lost_the_schema_race(exc) and attempt < 4:
                time.sleep(0.5 + random.random())
                continue
            raise UserError(f"cannot open the study storage {url}: {first_line(exc, limit=1000)}") from None


def _lost_the_schema_race(exc: Exception) -> bool:
    text = str(exc).lower()
    return "unique" in text or "already exists" in text


def build_pruner(settings: dict):
    optuna = require_optuna()
    if settings.get("kind", "median") == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=settings.get("startup_trials", 3),
                                       n_warmup_steps=settings.get("warmup_epochs", 1))


def build_sampler(n_trials: int, seed: int | None = None):
    optuna = require_optuna()
    # TPE after a few random trials (Optuna's default of 10 would leave a short study all random);
    # constant_liar keeps parallel trials from sampling the same point while others still run.
    startup = min(10, max(2, n_trials // 3))
    return optuna.samplers.TPESampler(n_startup_trials=startup, multivariate=True, constant_liar=True, seed=seed)


def fail_orphaned_trials(study, storage) -> list[int]:
    """Fails the RUNNING trials whose parent process on this host is gone (it was killed; its
    trainings died with it, PR_SET_PDEATHSIG) and returns their numbers, so that they are asked
    again. Trials of other hosts are left to the heartbeat."""
    State = require_optuna().trial.TrialState
    host, failed = socket.gethostname(), []
    for trial in study.get_trials(deepcopy=False, states=(State.RUNNING,)):
        owner, _, pid = trial.user_attrs.get(WORKER_ATTR, "").rpartition(":")
        if owner == host and pid.isdigit() and not process_alive(int(pid)):
            try:
                storage.set_trial_state_values(trial._trial_id, state=State.FAIL)
                failed.append(trial.number)
            except Exception:
                pass  # another process closed it first
    return failed


# Settings that change no trial's measurement: a resumed study may differ in them (the thread count
# is chosen from the load at each start).
_NOT_MEASURED = frozenset({"threads", "progress", "log_every", "metrics_format", "overwrite", "save_model",
                           "data.download", "data.shard_cache_mb", "distributed.max_restarts", "distributed.devices"})
GIVEN_ATTR = "given"


def given_training(cfg, varied: set[str]) -> str:
    """The training a study searches around, less the settings its trials vary (`varied`) and
    those that change no measurement, as canonical JSON: what a resumed study must share."""
    flat = flatten_mapping(to_mapping(cfg))
    return json.dumps({key: value for key, value in flat.items()
                       if key not in varied and key not in _NOT_MEASURED
                       and not key.startswith(("tracking.", "checkpoint.")) and not key.endswith("timeout_s")},
                      sort_keys=True, default=str)


def check_same_training(study, given: str, where: str) -> None:
    """Records `given` on a new study; refuses, in one line, to resume one that searched another
    training (its trials' values would score this one's, merged into one result)."""
    recorded = study.user_attrs.get(GIVEN_ATTR)
    if recorded is None and not study.trials:
        study.set_user_attr(GIVEN_ATTR, given)
        return
    if recorded == given:
        return
    before, now = json.loads(recorded or "{}"), json.loads(given)
    differ = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k)) if recorded else []
    what = f"it differs in {', '.join(differ[:4])}" if differ else "it was recorded without its settings"
    raise UserError(f"{where} holds a study of another training ({what}); use a new --out (or --study-name) "
                    "for this one")
