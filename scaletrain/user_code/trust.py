"""Which code a saved configuration may make this process import.

A run folder's config.json (and a run store's record of it) names the user's code as
`package.module:name`: the model builder, the data function, the task. Importing a name runs code,
and calling a standard-library function with the saved options as its arguments runs anything. A
folder copied from elsewhere is a file from a user, and files from users never execute code here
(the rule torch's `weights_only` and Keras's `safe_mode` keep for weights). So the code a saved
configuration names is imported only when one of these holds:

- this machine wrote the run: run.json carries a seal, an HMAC-SHA256 of the run id and the
  configuration's digest keyed by a secret kept in the user's own cache folder (`trust.key`,
  readable by the user alone), which a folder made elsewhere cannot forge;
- the command line names the same code (`train --resume auto --model mymodels:build`);
- the user says so: `--trust-code`, or SCALETRAIN_TRUST_CODE=1 (a launched job's workers inherit it).

Otherwise the command is refused in one line naming the code and the way to trust it, before
anything is imported. Built-in names import only scaletrain's own modules and are always fine.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path

from scaletrain.errors import UserError
from scaletrain.files import user_cache_dir

TRUST_ENV = "SCALETRAIN_TRUST_CODE"
KEY_FILE = "trust.key"
# The configuration keys whose value may name the user's code (config.py's model, data and task).
CODE_KEYS = (("model", "name"), ("data", "name"), ("task",))


def code_names(config: Mapping) -> list[str]:
    """The `package.module:name` values a configuration mapping names, in CODE_KEYS' order."""
    names = []
    for path in CODE_KEYS:
        value: object = config
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, str) and ":" in value and value not in names:
            names.append(value)
    return names


def trust_everything() -> None:
    """`--trust-code`: this process and the processes it starts import what a saved run names."""
    os.environ[TRUST_ENV] = "1"


def _trusts_everything() -> bool:
    return os.environ.get(TRUST_ENV, "").strip() == "1"


def _key(create: bool) -> bytes | None:
    """This user's secret (32 random bytes), made on first use; None where it cannot be read or made
    (a read-only home: the runs then carry no seal and need --trust-code to be continued)."""
    path = user_cache_dir() / KEY_FILE
    try:
        key = path.read_bytes()
        return key if len(key) >= 32 else None
    except FileNotFoundError:
        if not create:
            return None
    except OSError:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)   # two first runs: one makes it
    except FileExistsError:
        return _key(create=False)
    except OSError:
        return None
    with os.fdopen(fd, "wb") as fh:
        fh.write(secrets.token_bytes(32))
    return _key(create=False)


def seal(run_id: str, config_sha256: str, create: bool = True) -> str | None:
    """The seal this machine gives a run with this id and configuration digest (None: no key)."""
    key = _key(create)
    if key is None:
        return None
    return hmac.new(key, f"{run_id}\n{config_sha256}".encode(), hashlib.sha256).hexdigest()


def _sealed_here(run_id: object, config_sha256: str, given: object) -> bool:
    if not isinstance(run_id, str) or not isinstance(given, str):
        return False
    expected = seal(run_id, config_sha256, create=False)
    return expected is not None and hmac.compare_digest(expected, given)


def check_saved_code(config: Mapping, where: str | Path, *, run_id: object, config_sha256: str,
                     given_seal: object, named: Iterable[str] = (), recorded: Iterable[str] = ()) -> None:
    """Raises UserError where the saved `config` (of the run at `where`) names code that neither
    this machine's seal, the command line (`named`) nor the user's word lets this process import.
    `recorded`: other names the same record holds (a summary's task), sealed with nothing: trusted
    only as the configuration's own code, named, or by the user's word."""
    if _trusts_everything():
        return
    names = code_names(config)
    # The seal covers the configuration; a name only the record holds besides is never sealed.
    sealed = _sealed_here(run_id, config_sha256, given_seal)
    extra = [n for n in recorded if isinstance(n, str) and ":" in n and n not in names]
    unnamed = [n for n in [*([] if sealed else names), *extra] if n not in set(named)]
    if not unnamed:
        return
    raise UserError(f"{where} names code to import ({', '.join(unnamed)}) and was not written by a run of yours on "
                    "this machine (run.json's seal is missing or does not match), so importing it could run "
                    "anything; if you trust the folder's code, pass --trust-code (or set SCALETRAIN_TRUST_CODE=1), "
                    "or name the same code on the command line (--model, --data, --task)")
