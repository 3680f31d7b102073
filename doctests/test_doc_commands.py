"""Every command in README.md and docs/*.md, run as written: a doc line that stops working fails CI.

The commands are read from the files' ```bash blocks (a line ending in `\\` continues), in order,
one working folder per file, so a line can use what an earlier one made (`runs/a`, `shards/`, the
run store). What the harness may change is agreed here, and nothing else:

- shorter: `SHORTER` appends flags per command (one epoch, a few trials, small CIFAR shards; no training
  subset of streamed shards, which would cut whole shards), `<!-- doc-test: shorter in "TEXT" =
  FLAGS -->` before a block appends FLAGS to its lines containing TEXT (a lower target where the
  line trains to one: the same search, sooner), and the data the
  lines name by folder is small and made here (`~` is a fresh home holding `data/fashion` and
  `cifar`; `DIR` is that folder for the line's `--data`); the TOML files lines name are written
  here (`FILES`), and a doc's ```python block whose first line names a file (`# mine.py`) is
  written as that file into the doc's workspaces;
- placeholders: `[--flag ...]` marks optional flags (the line runs without them); `3f9a 7c21
  b0d4` stand for the ids of runs recorded by earlier lines; a `...` in a command is filled by
  the directive before its block, `<!-- doc-test: ... = FLAGS -->` (or `... in "TEXT" = FLAGS`
  for the lines containing TEXT);
- not run here: `<!-- doc-test: skip TEXT :: WHY -->` before a block skips its lines containing
  TEXT; WHY names what needs another machine and where the same thing is tested;
- narrower: a line that trains or measures a WideResNet runs it at width 1 (`NARROWER`): the same
  layers, code paths and flags on 1/100 of the work (WRN-16-10 in bf16 took minutes a line on a
  CPU without bfloat16 instructions, and proved nothing more);
- float32 where bf16 is emulated: on a CPU without bfloat16 instructions (`avx512_bf16`,
  `amx_bf16`) a line that asks for bf16 (`--precision bf16-...`, or a recipe that does) runs with
  `--precision fp32` (`emulated_bf16`): there bf16 is float32 converted inside every kernel
  (precision/hardware.py), 7x slower for the WideResNet at width 1 (46 against 330 img/s), and
  such lines took 29 of the doc-test's 73 worker-minutes while proving nothing the float32 run
  does not. bf16 itself is trained on every CPU by tests/test_precision.py; on a CPU with the
  instructions these lines run in bf16 as written;
- side by side: `<!-- doc-test: workspace NAME -->` before a block runs its lines (or `workspace
  NAME in "TEXT"`: its lines containing TEXT) in a workspace of their own (lines naming the same
  NAME share it), which needs nothing another workspace's lines made;
  `make test` (and `make doc-test`, the doc lines alone) runs the workspaces on two pytest-xdist
  workers, each one's lines in order (a test class each: `_workspace_class`).

A line's `scaletrain` is the installed command's `main()` run in a fresh child of an interpreter
that imported torch once (`warm_scaletrain`, tests/warm_client.py; the 5-8 s a cold start costs, on 99
lines), on the line's own stdin, stdout and stderr; what it starts (torchrun's workers, a sweep's
trainings) starts from the same server (the same client stands in for each: SCALETRAIN_CHILD_COMMAND).
`SCALETRAIN_TESTS_COLD=1` runs every line's `scaletrain`, and all it starts, cold.

A command passes when it exits 0 and prints no traceback. A trailing `&` runs it in the
background; its workspace's last line waits for every one.

Run with `make test` (everything) or `make doc-test` (these alone).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scaletrain.cli.train import load_recipe, recipe_names
from tests.test_data import make_cifar_folder, make_idx_folder

REPO = Path(__file__).resolve().parent.parent
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
STARTS = ("scaletrain ", "make ", "torchrun ", "bash ", "SCALETRAIN_", "python ")

SHORTER = {
    "train": ["--epochs", "1", "--no-progress", "--train-subset", "512"],
    "scaling": ["--measure-steps", "2"],
    "sweep": ["--epochs", "1", "--repeats", "1"],
    "tune": ["--trials", "2", "--epochs", "1"],
    "autotune": ["--trials", "2", "--steps", "3", "--window-epochs", "2", "--confirm-rounds", "0"],   # (confirmed: tests/test_autotune.py)
}
# A WideResNet line (by name, or the recipe that names one) at width 1 (see the docstring).
NARROWER = (re.compile(r"--model wrn-|--recipe fashion-wrn"), ["--model-option", "width=1"])
# A line asking for bf16, by flag or by its recipe (see the docstring).
ASKS_FOR_BF16 = re.compile(r"--precision bf16|--recipe (?:" + "|".join(
    name for name in recipe_names() if load_recipe(name).get("precision", {}).get("policy", "").startswith("bf16"))
    + r")\b")
TRAINS = ("train", "sweep", "scaling", "tune", "autotune", "multi", "find-batch-size")   # not plan-memory: it plans bf16


@functools.cache
def emulated_bf16() -> bool:
    """This CPU has no bfloat16 instructions (asked only when a line runs: tests/test_doc_lines.py
    reads the lines without torch)."""
    import torch

    from scaletrain.precision.hardware import CPU_BF16_FLAGS, device_facts
    return not device_facts(torch.device("cpu")).cpu_flags & CPU_BF16_FLAGS

# Small CIFAR shards, so the harness's 1,000 images still make the 32 a doc line's pattern names.
SHORTER_CIFAR_SHARDS = ["--samples-per-shard", "25"]
FILES = {
    "run.toml": 'epochs = 1\n[model]\nname = "cnn1d"\n[data]\nname = "mnist1d"\n',
    "space.toml": '["optim.lr"]\ntype = "float"\nlow = 0.001\nhigh = 0.1\nlog = true\n',
    "a.toml": 'epochs = 1\nprogress = false\n[model]\nname = "mlp"\n[data]\nname = "digits"\n',
    "b.toml": 'epochs = 1\nprogress = false\n[model]\nname = "mlp"\n[data]\nname = "digits"\n[optim]\nlr = 0.003\n',
    "c.toml": 'epochs = 1\nprogress = false\n[model]\nname = "cnn1d"\n[data]\nname = "mnist1d"\n',
}
RUN_IDS = ("3f9a", "7c21", "b0d4")
TIMEOUT_S = 900
pytestmark = [pytest.mark.timeout(TIMEOUT_S),   # a line's own limit (the suite's 300 s is for tests)
              pytest.mark.usefixtures("processes")]


@dataclass
class Command:
    file: Path
    line: int
    text: str                       # as the doc writes it (continuations joined)
    fill: str | None = None         # what a `...` stands for
    shorter: str = ""               # flags appended to shorten this line (a `shorter in` directive)
    skip: str | None = None         # why it does not run here
    workspace: str = ""             # "": the file's own; else the file's workspace of that name

    @property
    def id(self) -> str:
        return f"{self.file.relative_to(REPO)}:{self.line}"

    @property
    def group(self) -> str:
        """The workspace's name: its lines run in order, on one worker."""
        return f"{self.file.relative_to(REPO)}#{self.workspace}" if self.workspace else str(self.file.relative_to(REPO))


@dataclass
class Directives:
    fills: list[tuple[str, str]] = field(default_factory=list)    # (selector, flags)
    shorter: list[tuple[str, str]] = field(default_factory=list)  # (selector, flags)
    skips: list[tuple[str, str]] = field(default_factory=list)    # (selector, why)
    workspaces: list[tuple[str, str]] = field(default_factory=list)  # (selector, name); none: the file's own

    def apply(self, command: Command) -> Command:
        for selector, why in self.skips:
            if selector in command.text:
                command.skip = why
        for selector, flags in self.fills:
            if selector in command.text:
                command.fill = flags
        for selector, name in self.workspaces:
            if selector in command.text:
                command.workspace = name
        for selector, flags in self.shorter:
            if selector in command.text:
                command.shorter = flags
        return command


def _directive(body: str, pending: Directives) -> None:
    skip = re.fullmatch(r"skip (.+?) :: (.+)", body)
    fill = re.fullmatch(r'\.\.\.(?: in "(.+?)")? = ?(.*)', body)
    workspace = re.fullmatch(r'workspace ([\w-]+)(?: in "(.+?)")?', body)
    shorter = re.fullmatch(r'shorter in "(.+?)" = (.+)', body)
    if shorter:
        pending.shorter.append((shorter.group(1), shorter.group(2)))
    elif skip:
        pending.skips.append((skip.group(1), skip.group(2)))
    elif fill:
        pending.fills.append((fill.group(1) or "", fill.group(2)))
    elif workspace:
        pending.workspaces.append((workspace.group(2) or "", workspace.group(1)))
    else:
        raise ValueError(f"unknown doc-test directive: {body}")


def commands(path: Path) -> list[Command]:
    """The commands of one file's bash blocks, with the directives before each block applied."""
    found, pending, block, joined, start = [], Directives(), None, "", 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        stripped = raw.strip()
        if block is None:
            match = re.fullmatch(r"<!--\s*doc-test:\s*(.*?)\s*-->", stripped)
            if match:
                _directive(match.group(1), pending)
            elif stripped.startswith("```"):
                block = stripped[3:]
            continue
        if stripped.startswith("```"):
            block, pending = None, Directives()
            continue
        if block not in ("bash", "sh"):
            continue
        if not joined:
            start = number
        joined += " " + stripped[:-1] if stripped.endswith("\\") else " " + stripped
        if stripped.endswith("\\"):
            continue
        text, joined = _without_comment(joined.strip()), ""
        if text.startswith(STARTS):
            found.append(pending.apply(Command(path, start, text)))
    return found


def python_files(path: Path) -> dict[str, str]:
    """The doc's ```python blocks that name a file on their first line (`# mine.py`): written into
    its workspaces as shown, so the code a doc shows is the code its commands run."""
    files = {}
    for block in re.findall(r"^```python\n(.*?)^```", path.read_text(), re.S | re.M):
        first = re.fullmatch(r"# ([\w-]+\.py)", block.splitlines()[0].strip())
        if first:
            files[first.group(1)] = block
    return files


def _without_comment(text: str) -> str:
    """The line without its trailing `# comment` (a `#` outside quotes after a space)."""
    quote = None
    for i, ch in enumerate(text):
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None and (i == 0 or text[i - 1] == " "):
            return text[:i].rstrip()
    return text


ALL = [c for f in DOC_FILES for c in commands(f)]


# -- running them ---------------------------------------------------------------------------------

@functools.cache
def warm_scaletrain() -> tuple[str, str] | None:
    """(a folder whose `scaletrain` is tests/warm_client.py, the socket of the warm server it hands commands
    to), started once per test process: a line's `scaletrain` then runs the installed command's
    `main()` in a fresh child of an interpreter that imported torch once (tests/warm_cli.py), not
    in a cold one. SCALETRAIN_TESTS_COLD=1: None, every line's `scaletrain` starts cold."""
    if os.environ.get("SCALETRAIN_TESTS_COLD") == "1":
        return None
    from tests.warm_cli import start_socket_server

    folder = Path(tempfile.mkdtemp(prefix="scaletrain-warm-"))
    shim = folder / "scaletrain"
    shim.write_text(f"#!{sys.executable}\n" + (REPO / "tests" / "warm_client.py").read_text())
    shim.chmod(0o755)
    sock = folder / "server"
    start_socket_server(sock, {**os.environ, "OMP_NUM_THREADS": "1"})
    return str(folder), str(sock)


class Workspace:
    """One doc file's working folder, home and background commands."""

    def __init__(self, root: Path, files: dict[str, str]):
        self.root, self.home = root / "work", root / "home"
        self.root.mkdir()
        # 800 images: 720 train after the 10 % validation split, so the README sweep's batch 700 fits.
        make_idx_folder(self.home / "data" / "fashion", n_train=800, n_test=32)
        make_cifar_folder(self.home / "cifar", per_batch=200)   # 1,000 train: 3 steps of the docs' batch 256
        for name, text in {**FILES, **files}.items():
            (self.root / name).write_text(text)
        self.background: list[tuple[str, subprocess.Popen]] = []
        bin_dirs = [str(Path(sys.executable).parent)]
        warm = warm_scaletrain()
        if warm is not None:   # a line's `scaletrain` starts warm (tests/warm_client.py), and so do its processes
            bin_dirs.insert(0, warm[0])
        # One thread a line: two workers share the two cores (torch's default, a thread per core in
        # each, left both lines waiting on each other's threads: the 8-point sweep took 3.2x its time alone).
        self.env = {**os.environ, "HOME": str(self.home), "PATH": os.pathsep.join([*bin_dirs, os.environ["PATH"]]),
                    "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        # A line that compiles starts cold: a --compile training forked from the warm server hung on
        # a lock (2026-11-29, guide.md's wrn line), where the same training cold ends in seconds.
        self.cold_env = {**self.env, "PATH": os.pathsep.join([*bin_dirs[1:], os.environ["PATH"]])} \
            if warm is not None else self.env
        if warm is not None:   # what the line's command starts (workers, trainings): the same client
            from tests.warm_cli import child_env
            self.env.update(child_env(Path(warm[1])))
        # A user's data cache under their home: not the one tests/conftest.py sets for its session,
        # which a doc line would otherwise share when `make test` runs both on one worker.
        from scaletrain.data.cache import CACHE_ENV  # here: reading the lines needs no torch
        self.env.pop(CACHE_ENV, None)
        self.cold_env.pop(CACHE_ENV, None)

    def run_ids(self) -> list[str]:
        """Runs of the default recipe's model and data recorded so far, oldest first (the docs'
        `runs` and `ensemble` lines compare and average like runs)."""
        store = self.root / "scaletrain-runs" / "runs.db"
        if not store.is_file():
            return []
        with sqlite3.connect(store) as conn:
            rows = conn.execute("SELECT id, config FROM runs WHERE status = 'finished' ORDER BY created_at").fetchall()
        return [rid for rid, config in rows if '"name": "cnn1d"' in config and '"name": "mnist1d"' in config]

    def resolve(self, command: Command) -> str:
        text = re.sub(r"\s*\[[^\]]*\]", "", command.text)          # optional flags: the base form
        if "..." in text:
            assert command.fill is not None, f"{command.id}: a '...' with no `doc-test: ... =` directive"
            text = text.replace("...", command.fill)
        data_dir = str(self.home / ("cifar" if "--data cifar10" in text else "data/fashion"))
        text = re.sub(r"(?<=\s)DIR(?=\s|$)", data_dir, text)
        ids = self.run_ids()
        for placeholder in RUN_IDS:
            if re.search(rf"\b{placeholder}\b", text):
                assert ids, f"{command.id}: no recorded run to stand for {placeholder}"
                text = re.sub(rf"\b{placeholder}\b", ids[RUN_IDS.index(placeholder) % len(ids)], text)
        words = shlex.split(text.rstrip("&").strip(), posix=True)
        verb = next((w for w in words if not re.fullmatch(r"[A-Z_]+=.*", w)), "")
        sub = words[words.index(verb) + 1] if verb == "scaletrain" and len(words) > 1 else ""
        extra = [*SHORTER.get(sub, []), *command.shorter.split()]
        if NARROWER[0].search(text):
            extra = [*extra, *NARROWER[1]]
        if sub in TRAINS and ASKS_FOR_BF16.search(text) and emulated_bf16():
            extra = [*extra, "--precision", "fp32"]
        if sub == "shard" and "--data cifar10" in text:
            extra = SHORTER_CIFAR_SHARDS
        if "--data shards" in text:
            # Streamed shards are cut to a subset by whole shards: the README's own shards are small.
            extra = [flag for flag in extra if flag not in ("--train-subset", "512")]
        background = text.endswith("&")
        base = text.rstrip("&").strip()
        return f"{base} {' '.join(extra)}" + (" &" if background else "")

    def run(self, command: Command) -> None:
        text = self.resolve(command)
        # The repository's own commands (make, its scripts) run where a user runs them: its root.
        cwd = REPO if text.startswith(("make ", "bash scripts/")) else self.root
        env = self.cold_env if "--compile" in text else self.env   # (see cold_env)
        if text.endswith("&"):
            proc = subprocess.Popen(["bash", "-c", text[:-1]], cwd=cwd, env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            self.background.append((text, proc))
            return
        result = subprocess.run(["bash", "-c", text], cwd=cwd, env=env, text=True,
                                capture_output=True, timeout=TIMEOUT_S)
        _check(text, result.returncode, result.stdout + result.stderr)

    def wait(self) -> None:
        for text, proc in self.background:
            out, _ = proc.communicate(timeout=TIMEOUT_S)
            _check(text, proc.returncode, out)
        self.background.clear()


def _check(text: str, code: int, output: str) -> None:
    assert code == 0 and "Traceback" not in output, f"`{text}` exited {code}:\n{output[-4000:]}"


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory):
    made: dict[str, Workspace] = {}

    def workspace(group: str) -> Workspace:
        if group not in made:
            made[group] = Workspace(tmp_path_factory.mktemp(re.sub(r"\W", "-", group)),
                                    python_files(REPO / group.split("#")[0]))
        return made[group]
    yield workspace
    for space in made.values():
        for _, proc in space.background:
            proc.kill()


def _runs(command: Command, workspaces) -> None:
    if command.skip:
        pytest.skip(command.skip)
    space = workspaces(command.group)
    space.run(command)
    if command is [c for c in ALL if c.group == command.group and not c.skip][-1]:
        space.wait()      # the workspace's last line: every background line must have passed too


def _workspace_class(group: str) -> type:
    """One test class a workspace, its lines as one parametrized test in doc order: under
    `--dist loadscope` a class's tests run on one worker, in order. (xdist's `loadgroup` would say
    this with a mark, but under pytest 9.2 its group never reaches the node id: its tests spread.)"""
    lines = [c for c in ALL if c.group == group]

    @pytest.mark.parametrize("command", lines, ids=[c.id for c in lines])
    def test_doc_command_runs(self, command, workspaces):
        _runs(command, workspaces)
    return type("TestDocs_" + re.sub(r"\W", "_", group), (), {"test_doc_command_runs": test_doc_command_runs})


# A class a workspace, in doc order (the repository's conftest.py starts the longest first).
_GROUPS = dict.fromkeys(c.group for c in ALL)
for _class in map(_workspace_class, _GROUPS):
    globals()[_class.__name__] = _class


def test_every_doc_file_was_read():
    """A file whose commands the reader missed (a block in another form) would pass silently."""
    assert {c.file.name for c in ALL} >= {"README.md", "data.md", "distributed.md", "model-parallel.md",
                                          "autotune.md", "scaling-predictor.md"}
    assert len(ALL) >= 60
