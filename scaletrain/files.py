"""Reading the JSON and TOML files a run is handed or finds (configs, shard manifests, measurement
files, a run folder's own records, a checkpoint's manifest), bounded and named: whatever the bytes,
one line naming the file and what is wrong with it (unreadable, too large, not UTF-8, not JSON,
nested too deeply, the wrong type at the top), never a traceback and never code run (JSON and TOML
are data). The callers check their own fields (issue 66: a manifest nested 100,000 deep raised a
RecursionError traceback; a measurement file's point given as a string, a TypeError).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from scaletrain.errors import UserError

MAX_BYTES = 64 * 2**20     # no file of ours is near this; a larger one is not one of ours
MAX_DEPTH = 64             # our deepest file (a config's tables) is 4 levels deep


def user_cache_dir() -> Path:
    """The user's own scaletrain folder for what is kept between runs: `$XDG_CACHE_HOME/scaletrain`,
    else `~/.cache/scaletrain` (the data cache may be moved with SCALETRAIN_CACHE_DIR: data/cache.py)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "scaletrain"


def keep_compiled_artifacts() -> None:
    """torch.compile's compiled graphs kept in the user's cache folder (`<user_cache_dir>/inductor`)
    rather than inductor's default under /tmp, which a reboot empties: the next run of the same
    model compiles from them (benchmarks/compile_cache.py). Said before torch first asks for its
    folder (it fixes it then, even a meta build asks); a TORCHINDUCTOR_CACHE_DIR the user set is kept."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(user_cache_dir() / "inductor"))


def nesting_depth(value: Any) -> int:
    """How deeply lists and objects nest in `value` (0: a scalar), counted without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth <= MAX_DEPTH:
            todo += [(child, depth + 1) for child in children]
    return deepest


def check_nesting(value: Any, name: str, error: type[UserError] = UserError) -> Any:
    if nesting_depth(value) > MAX_DEPTH:
        raise error(f"{name} nests lists or tables more than {MAX_DEPTH} levels deep; it is not one of the files "
                    "it stands for")
    return value


def read_text(path: str | Path, name: str | None = None, error: type[UserError] = UserError) -> str:
    """A text file's contents, bounded: unreadable, too large or not UTF-8 is one line."""
    path = Path(path)
    name = name or str(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise error(f"{name} is {size / 2**20:.0f} MiB, larger than any file of this kind ({MAX_BYTES // 2**20} "
                        "MiB at most)")
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"{name} cannot be read ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{name} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def parse_json(text: str, name: str, expect: type | None = dict, error: type[UserError] = UserError) -> Any:
    """JSON text as a value of type `expect` (None: any), bounded in depth; one line otherwise."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{name} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except ValueError as exc:   # an integer of more digits than Python converts (4,300): no file of ours
        raise error(f"{name} holds a number too long to be one of its values ({str(exc).split(':')[0]})") from None
    except RecursionError:
        raise error(f"{name} nests lists or objects more than {MAX_DEPTH} levels deep; it is not one of the files "
                    "it stands for") from None
    check_nesting(value, name, error)
    if expect is not None and not isinstance(value, expect):
        kind = {dict: "an object", list: "a list"}.get(expect, expect.__name__)
        raise error(f"{name} holds {type(value).__name__} at its top level, not {kind}")
    return value


def read_json(path: str | Path, name: str | None = None, expect: type | None = dict,
              error: type[UserError] = UserError) -> Any:
    return parse_json(read_text(path, name, error), name or str(path), expect, error)
