"""What every part of the GPU run shares: its result file, written as it goes, and the summary.

A part is a module of this folder with `TITLE`, `LIMIT_S` (its wall-clock limit on the GPU
machine) and `run(part: Part)`. It runs in its own process (a crash, a hung kernel or a CUDA error
costs that part only) and records each finished case at once with `part.add(row)`, so a part
stopped at its limit still leaves every case it finished.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

# Run in this order; `--parts` picks some. Each name is a module of this folder.
PARTS = ("environment", "smoke", "precision", "peers", "memory_lab", "autotune", "compiled")
# Run only when named (`--parts no_flags`), as a call of their own: a call brings back 8 files, and
# the default parts and summary.md are 8.
EXTRA_PARTS = ("no_flags", "fp8")


def result_path(out: Path, name: str) -> Path:
    return out / f"{name}.json"


@dataclass
class Part:
    name: str
    out: Path
    rehearse: bool
    limit_s: float
    rows: list[dict] = field(default_factory=list)
    notes: dict = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    status: str = "running"
    error: str | None = None
    hang_after_plan: bool = False   # `--hang PART`: the runner's limit is what ends it (tests the runner)

    @property
    def device(self) -> torch.device:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def left_s(self) -> float:
        return self.limit_s - (time.monotonic() - self.started)

    def plan(self, names) -> None:
        """The cases this part means to run: those its limit leaves unreached stay listed."""
        self.notes["unreached"] = list(names)
        self.save()
        while self.hang_after_plan:
            time.sleep(3600)

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if row.get("case") in self.notes.get("unreached", ()):
            self.notes["unreached"].remove(row["case"])
        self.save()

    def note(self, **items) -> None:
        self.notes.update(items)
        self.save()

    def save(self) -> None:
        record = {"part": self.name, "status": self.status, "seconds": round(time.monotonic() - self.started, 2),
                  "limit_s": self.limit_s, "rehearsal": self.rehearse, "error": self.error,
                  "notes": self.notes, "rows": self.rows}
        path = result_path(self.out, self.name)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1, default=str))
        os.replace(tmp, path)   # a part killed mid-write leaves the last whole file


def error_line(exc: BaseException) -> str:
    """The exception as one line: its type, its message's first line and where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}{where}"[:400]


def case(part: Part, name: str, fn, **fields) -> dict:
    """Runs one case of a part; its failure is recorded as a row (with its error line) and the
    part goes on. Returns the row: `fn`'s dict merged in, `status` passed/failed/skipped."""
    start = time.monotonic()
    row = {"case": name, **fields}
    try:
        result = fn()
        row.update(result or {})
        row.setdefault("status", "passed")
    except Skip as skip:
        row.update(status="skipped", error=str(skip))
    except Exception as exc:  # noqa: BLE001 - every failure is recorded; the next case runs
        row.update(status="failed", error=error_line(exc))
        traceback.print_exc()
    row["seconds"] = round(time.monotonic() - start, 2)
    part.add(row)
    print(f"  {part.name}/{name}: {row['status']} in {row['seconds']} s" +
          (f" - {row['error']}" if row.get("error") else ""), flush=True)
    if part.cuda:
        torch.cuda.empty_cache()
    return row


class Skip(Exception):
    """A case that does not apply here (no CUDA, a rehearsal): reported as skipped, with why."""


def read_results(out: Path) -> dict[str, dict]:
    found = {}
    for name in PARTS + EXTRA_PARTS:
        path = result_path(out, name)
        if path.exists():
            try:
                found[name] = json.loads(path.read_text())
            except json.JSONDecodeError:
                found[name] = {"part": name, "status": "unreadable", "rows": [], "notes": {}}
    return found


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value).replace("|", "/").replace("\n", " ")


def table(rows: list[dict]) -> list[str]:
    if not rows:
        return ["(no rows)"]
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns and not isinstance(row[k], (dict, list))]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return lines


def write_summary(out: Path, command: str) -> Path:
    """summary.md from every part's result file: rewritten after each part."""
    results = read_results(out)
    env = results.get("environment", {}).get("notes", {})
    lines = ["# scaletrain on a GPU: one prepared run", "",
             f"Command: `{command}`", "",
             "Device: " + ", ".join(f"{k} {env[k]}" for k in ("device", "memory_gib", "driver", "cuda", "torch",
                                                                 "capability", "python", "commit", "date")
                                     if k in env), ""]
    lines += ["| part | status | seconds | limit s | error |", "|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r.get('status')} | {r.get('seconds')} | {r.get('limit_s')} | "
                     f"{_cell(r.get('error'))} |")
    for name, r in results.items():
        lines += ["", f"## {name}: {r.get('status')}", ""]
        notes = {k: v for k, v in r.get("notes", {}).items() if not isinstance(v, dict)}
        lines += [f"- {k}: {_cell(', '.join(map(str, v)) if isinstance(v, list) else v)}" for k, v in notes.items()
                  if v not in ([], None)]
        lines += [""] + table(r.get("rows", []))
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path
