"""A user's code that raised, shown as theirs: one line naming their function that failed, its
file and line, the exception, and what scaletrain was doing (the sample it read, the step it
took: `errors.add_context`); then the traceback cut to their own frames. The frames of scaletrain,
torch, the standard library and installed packages are left out: they say how the call reached
the user's code, which the one line already says.

A DataLoader worker's exception reaches the training process re-raised by torch with the
worker's traceback as text ("Original Traceback ..."): that text is read the same way."""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from scaletrain.errors import NOTE_PREFIX

_PACKAGE = str(Path(__file__).resolve().parents[1])
# Where code that is not the user's lives: scaletrain, the standard library, installed packages.
_NOT_USERS = tuple(sorted({os.path.realpath(p) for p in (
    _PACKAGE, sys.prefix, sys.base_prefix, sys.exec_prefix,
    *(sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib"))) if p}))
# How a user's failure's line begins (a launcher puts the failing worker's role before the rest).
HEADLINE_START = "scaletrain: your code failed: "
_WORKER_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.+)$')
_WORKER_HEADER = re.compile(r"^Caught (?P<type>\S+) in DataLoader worker process \d+\.")


@dataclass(frozen=True, slots=True)
class Frame:
    file: str
    line: int
    name: str        # the function's qualified name where known (RaisingReads.__getitem__)
    code: str        # the source line


@dataclass(frozen=True, slots=True)
class UserFailure:
    headline: str    # the one line
    frames: str      # the traceback cut to the user's frames, and the exception

    def report(self) -> str:
        return f"{self.headline}\n{self.frames}"


def is_users(file: str) -> bool:
    """A file of the user's: a real path outside scaletrain, the standard library and site-packages."""
    if file.startswith("<"):
        return False
    path = os.path.realpath(file)
    return not any(path == root or path.startswith(root + os.sep) for root in _NOT_USERS)


def user_failure(exc: BaseException) -> UserFailure | None:
    """The user's failure in `exc` (or in the exception it was raised from or during), or None
    where no frame of the user's code is in it (a failure of ours keeps its whole traceback)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        found = _worker_failure(exc) or _local_failure(exc) or _layer_failure(exc)
        if found is not None:
            return found
        exc = exc.__cause__ or exc.__context__
    return None


def _local_failure(exc: BaseException) -> UserFailure | None:
    frames, tb = [], exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append(Frame(code.co_filename, tb.tb_lineno, getattr(code, "co_qualname", code.co_name),
                            _source_line(code.co_filename, tb.tb_lineno)))
        tb = tb.tb_next
    notes = [n[len(NOTE_PREFIX):] for n in getattr(exc, "__notes__", ()) if n.startswith(NOTE_PREFIX)]
    message = str(exc).splitlines()[0] if str(exc) else ""
    return _failure(frames, type(exc).__name__, message, notes)


def _worker_failure(exc: BaseException) -> UserFailure | None:
    """A DataLoader worker's exception, re-raised with the worker's traceback as its message."""
    text = str(exc)
    header = _WORKER_HEADER.match(text)
    if header is None or "Original Traceback" not in text:
        return None
    lines = text.split("Original Traceback (most recent call last):\n", 1)[1].splitlines()
    frames, rest, i = [], [], 0
    while i < len(lines):
        match = _WORKER_FRAME.match(lines[i])
        if match:
            code = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].startswith("    ") else ""
            frames.append(Frame(match["file"], int(match["line"]), match["name"], code))
            i += 2 if code else 1
            while i < len(lines) and lines[i].startswith("    "):   # the ^^^ markers under a line
                i += 1
            continue
        if not lines[i].startswith("  "):
            rest.append(lines[i])
        i += 1
    # The worker's notes (the sample it read), then the training process's (the step it took).
    notes = [n[len(NOTE_PREFIX):] for n in [*rest, *getattr(exc, "__notes__", ())] if n.startswith(NOTE_PREFIX)]
    final = [n for n in rest if n and not n.startswith(NOTE_PREFIX)]
    name = header["type"]
    message = final[0].partition(": ")[2] if final and final[0].startswith(name) else (final[0] if final else "")
    return _failure(frames, name, message, notes)


def _failure(frames: list[Frame], exc_name: str, message: str, notes: list[str]) -> UserFailure | None:
    mine = [f for f in frames if is_users(f.file)]
    if not mine:
        return None
    last = mine[-1]
    said = f"{exc_name}: {message}" if message else exc_name
    where = f", {'; '.join(dict.fromkeys(notes))}" if notes else ""
    headline = f"{HEADLINE_START}{last.name} ({Path(last.file).name}:{last.line}) raised {said}{where}"
    cut = "".join(f'  File "{f.file}", line {f.line}, in {f.name}\n' + (f"    {f.code}\n" if f.code else "")
                  for f in mine)
    return UserFailure(headline, f"Traceback (your code's frames only, most recent call last):\n{cut}{said}")


def _layer_failure(exc: BaseException) -> UserFailure | None:
    """A torch layer of the user's model that raised with no frame of the user's on the way (an
    `nn.Sequential` of torch's layers whose input width does not match the data): the layer by its
    name in the model, what it was given, and torch's message, in one line."""
    calls, tb = [], exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "_call_impl" and frame.f_code.co_filename.endswith(_MODULE_FILE):
            calls.append(frame.f_locals)
        elif calls and frame.f_code.co_filename.startswith(_PACKAGE + os.sep) \
                and frame.f_code.co_name not in _PASS_THROUGH:
            return None      # our own code ran inside the layer: a failure of ours keeps its traceback
        tb = tb.tb_next
    if not calls:
        return None
    root, layer = calls[0].get("self"), calls[-1].get("self")
    name = next((n for n, m in root.named_modules() if m is layer), None) if hasattr(root, "named_modules") else None
    given = ", ".join(str(tuple(a.shape)) for a in calls[-1].get("args", ()) if hasattr(a, "shape"))
    notes = [n[len(NOTE_PREFIX):] for n in getattr(exc, "__notes__", ()) if n.startswith(NOTE_PREFIX)]
    where = f", {'; '.join(dict.fromkeys(notes))}" if notes else ""
    message = (str(exc).splitlines() or [""])[0]
    layer_text = f"layer {name!r} ({layer!r})" if name else f"layer {layer!r}"
    headline = (f"{HEADLINE_START}your model's {layer_text.splitlines()[0]} was given input shaped {given or '?'} "
                f"and raised {type(exc).__name__}: {message}{where}; check the model's layer sizes against "
                "the data's samples")
    return UserFailure(headline, "")


_MODULE_FILE = os.path.join("torch", "nn", "modules", "module.py")
# Our frames that every op of a traced step passes through (the planner's byte counter): not ours
# to blame for an op that fails inside them.
_PASS_THROUGH = ("__torch_dispatch__", "__torch_function__")


def _source_line(file: str, line: int) -> str:
    import linecache
    return linecache.getline(file, line).strip()
