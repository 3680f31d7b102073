"""The architecture doc is true to the code: its layer drawing is read and every import of the
package is checked against it; no base-class member exists for one strategy; a strategy is found
without being listed anywhere."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "scaletrain"


def drawn_layers() -> dict[str, int]:
    """{unit: row} from docs/architecture.md's drawing; row 0 is the top (cli)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"## The layers.*?```\n(.*?)```", text, re.S).group(1)
    rows: dict[str, int] = {}
    for row, line in enumerate(block.strip().splitlines()):
        for token in line.split():
            if not re.fullmatch(r"[a-z_]+(/|\.py)", token):
                break                                    # the description begins
            unit = token.rstrip("/").removesuffix(".py")
            assert unit not in rows, f"{token} is drawn twice"
            rows[unit] = row
    return rows


def unit_of(module: str) -> str | None:
    """The top-level unit (sub-package or module) a `scaletrain.x.y` import names."""
    parts = module.split(".")
    return parts[1] if parts[0] == "scaletrain" and len(parts) > 1 else None


def imports() -> list[tuple[str, str, str]]:
    """(importing unit, imported unit, file) for every import of one scaletrain unit by another."""
    edges = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.name == "__init__.py" and relative.parent == Path("."):
            continue                                     # the package's public API sits above everything
        source = relative.parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name == "scaletrain":
                    edges.append((source, "scaletrain", str(relative)))
                elif (target := unit_of(name)) and target != source:
                    edges.append((source, target, str(relative)))
    return edges


def test_every_unit_of_the_package_is_drawn():
    rows = drawn_layers()
    units = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")}
    assert units - set(rows) == set(), "packages or modules missing from docs/architecture.md's drawing"
    assert set(rows) - units == set(), "the drawing names units that do not exist"


def test_imports_run_downward_only():
    rows = drawn_layers()
    upward = [f"{file}: {source} (row {rows[source]}) imports {target} (row {rows.get(target, 'the package')})"
              for source, target, file in imports() if target not in rows or rows[target] < rows[source]]
    assert upward == []


def module_imports() -> dict[str, set[str]]:
    """{module: the package modules it imports}, module by module (a function's import too)."""
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        edges[name] = {m for m in found if m in modules and m != name}
    return edges


def test_no_import_circle_anywhere_in_the_package():
    edges, circles, done = module_imports(), [], set()

    def walk(module: str, path: list[str]) -> None:
        for target in sorted(edges[module]):
            if target in path:
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in done:
                walk(target, path + [target])
        done.add(module)
    for module in sorted(edges):
        if module not in done:
            walk(module, [module])
    assert circles == []


def test_every_package_folder_is_a_package():
    folders = [p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__" and any(p.glob("*.py"))]
    assert [str(p.relative_to(ROOT)) for p in folders if not (p / "__init__.py").exists()] == []


def test_no_core_strategy_member_exists_for_one_strategy_family():
    """A member of the core `Strategy` that only one family overrides is a capability waiting to be
    named (distributed/capabilities.py). Families: a strategy and its subclasses."""
    from scaletrain.distributed import STRATEGIES, Strategy
    from scaletrain.distributed.strategies.process_group import ProcessGroupStrategy
    shared = (Strategy, ProcessGroupStrategy)     # infrastructure every (multi-process) strategy builds on
    roots = {}                     # strategy class -> its family's root (the first class below the shared bases)
    for cls in STRATEGIES.values():
        roots[cls] = next(c for c in reversed(cls.__mro__) if issubclass(c, Strategy) and c not in shared)
    lonely = []
    for name, member in vars(Strategy).items():
        if name.startswith("_") or not callable(getattr(Strategy, name, None)) and not isinstance(member, property):
            continue
        if any(name in vars(c) for c in shared if c is not Strategy):
            continue                               # the shared process-group base implements it for all
        overriders = {roots[cls] for cls in STRATEGIES.values()
                      if any(name in vars(c) for c in cls.__mro__ if issubclass(c, Strategy) and c not in shared)}
        if len(overriders) == 1 and len(set(roots.values())) > 1:
            family = next(iter(overriders)).__name__
            if name not in CORE_OVERRIDDEN_BY_ONE_FAMILY:
                lonely.append(f"{name} (only {family})")
    assert lonely == []


# Core members every strategy has (a default that one family happens to replace), not capabilities.
CORE_OVERRIDDEN_BY_ONE_FAMILY = {
    "forward_backward",   # the step's forward and backward: every strategy runs one (pipelines their schedule)
    "no_sync",            # gradient accumulation's quiet micro-batches: every strategy is asked (DDP has a reducer)
}


def test_a_strategy_is_found_without_being_listed(tmp_path):
    """The registry finds a strategy by its declaration: hsdp is named only in its own files (the
    strategy and its option table)."""
    from scaletrain.config import STRATEGIES as CHOICES
    from scaletrain.distributed import STRATEGIES
    assert "hsdp" in STRATEGIES and "hsdp" in CHOICES and "ps" in STRATEGIES
    elsewhere = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
                 if p.name not in ("hsdp.py", "hsdp_options.py") and re.search(r"\bhsdp\b", p.read_text())]
    assert elsewhere == []


@pytest.mark.parametrize("member", ["replicas", "replica_rank", "records_metrics", "collective_size", "trains",
                                    "serve", "cuts_epochs", "epoch_cut", "begin_epoch", "end_epoch", "epoch_metrics",
                                    "wrap_optimizer", "evaluation_range", "checkpoint_group", "join_checkpoint",
                                    "state_to_save", "optimizer_parameters"])
def test_one_strategy_members_left_the_core(member):
    from scaletrain.distributed import Strategy
    assert not hasattr(Strategy, member)


def _registries():
    from scaletrain.data import DATA_SOURCES
    from scaletrain.distributed import STRATEGIES
    from scaletrain.models import MODEL_BUILDERS
    from scaletrain.precision import POLICIES
    from scaletrain.tasks import TASKS
    return {"model": MODEL_BUILDERS, "data set": DATA_SOURCES, "precision": POLICIES, "strategy": STRATEGIES,
            "task": TASKS}


def test_no_list_in_the_code_repeats_a_registry():
    """Choice lists are derived from the registries: a literal tuple, list or set naming three or
    more registered names of one kind would drift from the registry the day one is added."""
    repeats = []
    for kind, registry in _registries().items():
        names = set(registry)
        for path in PACKAGE.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                    listed = {e.value for e in node.elts if isinstance(e, ast.Constant)} & names
                    if len(listed) >= 3:
                        repeats.append(f"{path.relative_to(ROOT)}:{node.lineno} lists {kind}s {sorted(listed)}")
    assert repeats == []


def _plugin(tmp_path, monkeypatch, package: str, module: str, source: str) -> None:
    """A user's package `package` with one module, importable for the test's duration."""
    folder = tmp_path / package
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / module).write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_every_registry_is_filled_by_discovering_its_package(tmp_path, monkeypatch):
    """A new model, data set, task or strategy is one decorated definition in one new file: the
    package's discovery imports it, and the config's choices grow with it."""
    import sys

    from scaletrain.config import DATA_SETS
    from scaletrain.registry import discover
    _plugin(tmp_path, monkeypatch, "ring_plugin", "ring.py",
            "from scaletrain.data import register_dataset\n"
            "@register_dataset('ring-test', sample=((2,), 2, 'classification'))\n"
            "def ring(cfg, seed):\n    raise NotImplementedError\n")
    from scaletrain.data import DATA_SOURCES
    try:
        discover(__import__("ring_plugin"))
        assert "ring-test" in DATA_SOURCES and "ring-test" in DATA_SETS
        assert DATA_SOURCES.get("ring-test").known_sample(None) == ((2,), 2, "classification")
    finally:
        DATA_SOURCES._entries.pop("ring-test", None)
        DATA_SETS._names.discard("ring-test")
        sys.modules.pop("ring_plugin.ring", None)
        sys.modules.pop("ring_plugin", None)


def test_the_names_read_from_the_source_are_the_registered_ones():
    """`list`, `--help` and the config's checks read the registered names from the source
    (registry.py's `Declarations`) so they need no torch: they must be exactly what registering
    finds, variants included, or a user is offered a name that does not exist (or denied one that does)."""
    from scaletrain.models import MODEL_BUILDERS
    for kind, registry in _registries().items():
        declared = registry.choices.declared.variants()
        assert sorted(declared) == list(registry), f"{kind}: declared {sorted(declared)}, registered {list(registry)}"
    declared_models = MODEL_BUILDERS.choices.declared.variants()
    assert {n: b.variants for n, b in MODEL_BUILDERS.items()} == declared_models
    assert declared_models["gpt"] == ("tiny", "small", "medium", "large")   # read through `tuple(PRESETS)`


def test_a_registered_name_that_is_not_a_literal_is_not_declared(tmp_path, monkeypatch):
    """The reader only takes what it can read: a computed name is left out (and the test above
    then fails for our own packages), never guessed."""
    from scaletrain.registry import Declarations
    _plugin(tmp_path, monkeypatch, "computed_plugin", "things.py",
            "SIZES = {'s': 1, 'm': 2}\nNAME = 'two'\n"
            "@register_thing('one', variants=tuple(SIZES))\ndef one(): pass\n"
            "@register_thing(NAME)\ndef two(): pass\n"
            "register_thing('three', variants='D-K')\n")
    assert Declarations("computed_plugin", "register_thing").variants() == {"one": ("s", "m"), "three": "D-K"}


def test_every_lazy_export_of_every_package_resolves():
    """A package's `__all__` names resolve on first use (lazy.py): a re-export left pointing at a
    module that no longer defines the name (an unused import removed there) fails here, not in a
    user's first `from scaletrain.data import ...`."""
    import importlib
    packages = sorted({".".join(("scaletrain", *p.relative_to(PACKAGE).parent.parts))
                       for p in PACKAGE.rglob("__init__.py")})
    missing = []
    for name in packages:
        package = importlib.import_module(name)
        for export in getattr(package, "__all__", ()):
            try:
                getattr(package, export)
            except (AttributeError, ImportError) as exc:
                missing.append(f"{name}.{export}: {exc}")
    assert missing == []


def test_the_step_strategies_run_is_a_contract_both_sides_keep(tmp_path, digits):
    """Strategies see the training step only through `StepContract`: TrainStep has every member
    of it, and no strategy reads a member outside it."""
    from scaletrain.distributed.strategies.step_contract import StepContract
    from scaletrain.training import Trainer
    from tests.conftest import small_config
    from tests.helpers import make_mlp
    cfg = small_config(tmp_path, epochs=1)
    with Trainer(make_mlp(digits), cfg) as trainer:
        trainer.fit(digits)
        assert isinstance(trainer.train_step, StepContract)
    members = {name for name in vars(StepContract) if not name.startswith("_")} | set(StepContract.__annotations__)
    used = set()
    for path in (PACKAGE / "distributed").rglob("*.py"):
        used |= set(re.findall(r"\bstep\.([A-Za-z_]\w*)\b(?!`)", path.read_text())) - {"py"}   # not "step.py"
    assert used - members == set(), "strategies use members of the step outside StepContract"


# -- no wall-clock claim in a test (issue 67) ------------------------------------------------------
# A test may wait (tests/processes.py's wait_for, a subprocess timeout, pytest-timeout: guards long
# enough that only a hang meets them), but it never claims how fast something was: a busy machine
# makes every duration longer and every rate lower, so `duration < bound` and `rate > bound` fail
# under load while the code is right. Such claims are benchmarks (benchmarks/, BENCHMARKS.md), and
# the arithmetic behind them is tested on stubbed clocks. Bounds a busy machine cannot break stay:
# a duration at least, a rate at most, two figures of one run against each other.
_DURATION = re.compile(r"(_s|_ms|seconds|elapsed|took|latency|trips)$")
_RATE = re.compile(r"(^|_)(rate|rates|rate_bps|per_sec|throughput)$")
_SPREAD = {"min", "max", "median", "low", "high"}   # a record's spread of figures: bounds its own kind
_CLOCKS = {"time", "monotonic", "perf_counter", "process_time", "monotonic_ns", "perf_counter_ns"}


def _quantities(node: ast.AST) -> tuple[bool, bool]:
    """Whether `node` reads a duration (a clock, or a name, attribute or key naming one), and a rate
    (a record's "min", "max", "median", "low" or "high" counts as either: it bounds its own kind)."""
    words, spread = [], False
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _CLOCKS \
                and isinstance(n.func.value, ast.Name) and n.func.value.id == "time":
            return True, False
        if isinstance(n, ast.Name):
            words.append(n.id)
        elif isinstance(n, ast.Attribute):
            words.append(n.attr)
        elif isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str):
            words.append(n.slice.value)     # a record's key: m["epoch_train_time_s"]
            spread = spread or n.slice.value in _SPREAD
    return spread or any(_DURATION.search(w) for w in words), spread or any(_RATE.search(w) for w in words)


def wall_clock_claims(source: str) -> list[tuple[int, str]]:
    """(line, comparison) of every assert that bounds a duration from above or a rate from below
    by a figure that is neither zero nor another measured quantity."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assert):
            continue
        for cmp in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            sides = [cmp.left, *cmp.comparators]
            for op, small, large in zip(cmp.ops, sides, sides[1:], strict=False):   # a chain: ops between sides
                if isinstance(op, (ast.Gt, ast.GtE)):
                    small, large = large, small
                elif not isinstance(op, (ast.Lt, ast.LtE)):
                    continue
                small_q, large_q = _quantities(small), _quantities(large)
                fixed = lambda q, side: not any(q) and not (isinstance(side, ast.Constant) and side.value == 0)  # noqa: E731
                if (small_q[0] and fixed(large_q, large)) or (large_q[1] and fixed(small_q, small)):
                    found.append((node.lineno, ast.unparse(cmp)))
    return found


def test_no_test_claims_how_fast_the_machine_was():
    claims = [f"{path.relative_to(ROOT)}:{line}: {text}"
              for path in sorted([*(ROOT / "tests").glob("*.py"), *(ROOT / "doctests").glob("*.py")])
              for line, text in wall_clock_claims(path.read_text())]
    assert not claims, "a wall-clock bound in a test (a benchmark's claim; see above):\n" + "\n".join(claims)


@pytest.mark.parametrize("claim, caught", [
    ("assert took < 5.0", True),
    ("assert time.monotonic() - sent < 8", True),
    ("assert m['epoch_train_time_s'] < (late + 1) * 1.5", True),
    ("assert 0.85 * 200e6 < rate", True),
    ("assert b['images_per_sec'] / a['images_per_sec'] > 0.7", True),
    ("assert 0 < p['transfer_s'] < 0.01", True),
    ("assert min(trips) >= 2 * latency_ms / 1e3", False),       # at least: load only lengthens
    ("assert 0 < rate <= 1.01 * 200e6", False),                 # at most: load only slows
    ("assert b['checkpoint_time_s'] > 0", False),
    ("assert trained <= train_s < saved_s / 1e4", False),          # two figures of one run
    ("assert a['elapsed_s'] < b['elapsed_s']", False),
    ("assert len(lines) < 5", False),
])
def test_the_wall_clock_rule_tells_a_speed_claim_from_a_safe_bound(claim, caught):
    assert bool(wall_clock_claims(claim)) is caught



# Optional packages whose import takes seconds: a test module imports them in the tests that use
# them, never at its top (pytest's collection runs every module's top in every worker and in
# `make check`: Lightning's and MLflow's cost each worker 5.5 s of its 9.9).
HEAVY_AT_COLLECTION = ("lightning", "pytorch_lightning", "mlflow", "transformers", "wandb", "tensorboard")


def heavy_imports_at_collection(source: str) -> list[tuple[int, str]]:
    """(line, package) of each heavy package a module imports at its top level (statements under
    an `if` or `try` there and class bodies included), directly or through pytest.importorskip."""
    found, pending = [], list(ast.parse(source).body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue                           # runs when called: its own cost
        if isinstance(node, ast.ClassDef):
            pending += node.body               # a class body runs at import
            continue
        if isinstance(node, (ast.If, ast.Try)):
            pending += [*node.body, *node.orelse, *getattr(node, "finalbody", []),
                        *(s for h in getattr(node, "handlers", []) for s in h.body)]
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            if isinstance(call.func, ast.Attribute) and call.func.attr == "importorskip" and call.args \
                    and isinstance(call.args[0], ast.Constant):
                names.append(call.args[0].value)
        found += [(node.lineno, name) for name in names if name.split(".")[0] in HEAVY_AT_COLLECTION]
    return sorted(found)


def test_no_test_module_imports_a_heavy_package_when_collected():
    found = [f"{path.relative_to(ROOT)}:{line}: {name}"
             for path in sorted([*(ROOT / "tests").glob("*.py"), *(ROOT / "doctests").glob("*.py")])
             for line, name in heavy_imports_at_collection(path.read_text())]
    assert not found, ("imported at collection (check `importlib.util.find_spec` there and import it in the "
                       "tests instead):\n" + "\n".join(found))


@pytest.mark.parametrize("source, caught", [
    ('pytest.importorskip("lightning")', True),
    ('mlflow = pytest.importorskip("mlflow")', True),
    ("import lightning as L", True),
    ("from transformers import AutoModel", True),
    ("try:\n    import wandb\nexcept ImportError:\n    wandb = None", True),
    ('def test_x():\n    pytest.importorskip("lightning")', False),     # inside a test: its own cost
    ('if importlib.util.find_spec("mlflow") is None:\n    pytest.skip("no mlflow", allow_module_level=True)', False),
    ('pytest.importorskip("optuna")', False),
])
def test_the_collection_rule_finds_a_heavy_import_at_a_modules_top(source, caught):
    assert bool(heavy_imports_at_collection(source)) is caught

# -- the processes tier by construction (issue 67) -------------------------------------------------

def test_a_test_that_did_not_declare_processes_cannot_start_one():
    """Whatever the way (subprocess, a shell, multiprocessing's spawn, the warm CLI), starting an
    interpreter raises before any process exists; conftest.py wraps every test without the
    `processes` fixture so. A quick tool the library asks (`uname -p`) still answers."""
    import multiprocessing
    import subprocess
    import sys

    from tests.processes import UndeclaredProcess, run, starting_processes
    with starting_processes(False):
        for attempt in (lambda: subprocess.run([sys.executable, "-c", "pass"]),
                        lambda: subprocess.Popen(["torchrun", "--help"]),
                        lambda: subprocess.run("python3 -c pass", shell=True),
                        lambda: subprocess.check_output(["/usr/bin/env", "python3", "-V"]),
                        lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
                        lambda: run(["--help"], ".")):
            with pytest.raises(UndeclaredProcess, match="`processes` fixture"):
                attempt()
        assert subprocess.run(["uname", "-p"], capture_output=True).returncode == 0


@pytest.mark.usefixtures("processes")
def test_a_test_that_declared_processes_starts_them_and_is_in_their_tier(request):
    import subprocess
    import sys
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0
    assert request.node.get_closest_marker("processes") is not None     # `make check` leaves it out


# -- a suite time says whether it compiled afresh (issue 67) --------------------------------------

@pytest.mark.usefixtures("processes")
def test_make_tests_compile_cache_is_the_checkouts_and_timed_sh_says_whether_it_held_kernels(tmp_path):
    """A rerun reuses inductor's kernels (the compiled checkpointing test 102 s cold, 10 s warm), so
    a suite time is a cold run's only if the cache was empty: the test targets keep it in the
    checkout (a fresh clone's is empty) and timed.sh's line says which it was."""
    import subprocess
    dry = subprocess.run(["make", "-p", "-n", "check"], cwd=ROOT, capture_output=True, text=True).stdout
    for target in ("check", "test", "doc-test"):
        assert f"{target}: TORCHINDUCTOR_CACHE_DIR = $(CURDIR)/.cache/torchinductor" in dry, target
    cache = tmp_path / "inductor"

    def timed_line() -> str:
        done = subprocess.run(["bash", str(ROOT / "scripts" / "timed.sh"), "t", "true"], capture_output=True,
                              text=True, env={"PATH": "/usr/bin:/bin", "TORCHINDUCTOR_CACHE_DIR": str(cache)})
        assert done.returncode == 0, done.stderr
        return done.stdout
    assert "inductor cache cold" in timed_line()        # no folder yet
    cache.mkdir()
    assert "inductor cache cold" in timed_line()        # an empty one
    (cache / "fxgraph").mkdir()
    assert "inductor cache warm" in timed_line()


# -- each pytest-xdist worker computes on its share of the cores (issue 67) ------------------------

@pytest.mark.usefixtures("processes")
def test_each_xdist_worker_starts_with_its_share_of_the_cores_unless_the_caller_chose(tmp_path):
    """conftest.py sets OMP_NUM_THREADS on the controller before the workers start (a thread per
    core in each worker spun on the other's cores). A real session of two workers, in this
    repository's conftest, reports what each worker's torch computes on."""
    import os
    import subprocess
    import sys
    probe = ROOT / "tests" / f"test_zz_threads_probe_{os.getpid()}.py"
    probe.write_text("import os, torch\n\n"
                     "def test_report():\n"
                     "    with open(os.environ['PROBE_OUT'] + '.' + os.environ['PYTEST_XDIST_WORKER'], 'w') as f:\n"
                     "        f.write(f\"{os.environ.get('OMP_NUM_THREADS')} {torch.get_num_threads()}\")\n")
    try:
        def workers_see(**given) -> set[str]:
            out = tmp_path / f"seen{len(given)}"
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PYTEST_ADDOPTS")}
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
                                   str(probe.relative_to(ROOT))], cwd=ROOT, capture_output=True, text=True,
                                  env={**env, "PROBE_OUT": str(out), **given}, timeout=240)
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
            return {p.read_text() for p in tmp_path.glob(f"{out.name}.gw*")}
        share = max(1, len(os.sched_getaffinity(0)) // 2)
        assert workers_see() == {f"{share} {share}"}
        # The caller's choice is kept (torch itself caps a count above the cores, so the variable is read).
        assert {seen.split()[0] for seen in workers_see(OMP_NUM_THREADS="3")} == {"3"}
    finally:
        probe.unlink()


# -- the user's code has one owner (issue 65) ------------------------------------------------------

def _lightning_questions(path: Path) -> list[str]:
    """Where `path` asks about Lightning itself: imports it, or names one of its classes."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found += [f"imports {n}" for n in names if n.split(".")[0] in ("lightning", "pytorch_lightning")]
        elif isinstance(node, ast.Constant) and node.value in ("LightningModule", "LightningDataModule"):
            found.append(f"names {node.value!r}")
    return found


def test_only_user_code_and_the_adapter_ask_about_lightning():
    """A LightningModule or DataModule is recognised in user_code/lightning.py and trained through
    adapters/lightning.py; everyone else asks them (`names_lightning_module`, `adapted`)."""
    allowed = {PACKAGE / "user_code" / "lightning.py", PACKAGE / "adapters" / "lightning.py"}
    asked = [f"{path.relative_to(ROOT)}: {what}" for path in sorted(PACKAGE.rglob("*.py")) if path not in allowed
             for what in _lightning_questions(path)]
    assert not asked, asked
    assert _lightning_questions(PACKAGE / "user_code" / "lightning.py")     # the rule sees what it looks for


def test_only_user_code_imports_a_users_module():
    """`package.module:name` is imported in one place (user_code/importing.py, once a process);
    the registries, the model builder and the data loader ask it."""
    importers = sorted(str(path.relative_to(ROOT)) for path in PACKAGE.rglob("*.py")
                       if "def import_function" in path.read_text() or "FUNCTION_NAME = " in path.read_text())
    assert importers == ["scaletrain/user_code/importing.py"], importers
    # What the registries build and load is the user's code as written; adapting it is the training's.
    assert drawn_layers()["adapters"] < min(drawn_layers()[unit] for unit in ("data", "models", "tasks"))


def test_data_asks_a_task_its_questions_never_its_name():
    """data/ reads targets as the task asks (`Task.integer_labels`, `class_outputs`, `vocabulary`,
    `normalised_inputs`, `any_targets`, through `targets_of`), so a task of a new kind is one file in tasks/: no
    module of data/ compares anything with a task's name."""
    from scaletrain.config import TASKS

    names = set(TASKS) - {"auto"}
    branches = []
    for path in (PACKAGE / "data").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                literals = {s.value for s in sides if isinstance(s, ast.Constant)} | {
                    e.value for s in sides if isinstance(s, (ast.Tuple, ast.List, ast.Set))
                    for e in s.elts if isinstance(e, ast.Constant)}
                if literals & names:
                    branches.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert names >= {"classification", "regression", "language-model"}
    assert branches == [], branches


def test_the_task_is_chosen_in_tasks_alone():
    """Which task a run trains (the one named, the model's own, its own loss, the data's) is
    `tasks.build_task`'s decision: no module outside tasks/ compares a configuration's task with a
    name. (The data's own task, read off its targets, is data/'s: `infer_task`.)"""
    compared = []
    for path in PACKAGE.rglob("*.py"):
        if "tasks" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Attribute) and s.attr == "task" for s in sides) and any(
                        isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides):
                    compared.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert compared == [], compared


def test_the_serving_rule_is_written_once():
    """Whether a strategy may train a model that brings its own optimizer (parameter servers build
    theirs from the config) is one function, `own_optimizer_problem`, which the CLI and the Trainer
    both ask."""
    defining = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
                if "def own_optimizer_problem" in p.read_text()]
    assert defining == ["scaletrain/distributed/capabilities.py"], defining
    askers = {str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
              if "own_optimizer_problem(" in p.read_text() and "def own_optimizer_problem" not in p.read_text()}
    assert {"scaletrain/cli/train.py", "scaletrain/training/trainer.py"} <= askers, askers


MODULE_LINES = 600   # STYLE.md: readable file sizes; past it a module holds more than one job


def long_modules(package: Path, limit: int = MODULE_LINES) -> list[str]:
    """The package's modules longer than `limit` lines, each with its length."""
    return [f"{path.relative_to(package)}: {n} lines"
            for path in sorted(package.rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > limit]


def test_no_module_is_past_the_line_rule():
    assert long_modules(PACKAGE) == [], f"split these modules by concern (STYLE.md): {long_modules(PACKAGE)}"


def test_the_line_rule_finds_a_long_module(tmp_path):
    (tmp_path / "short.py").write_text("x = 1\n" * MODULE_LINES)
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "long.py").write_text("x = 1\n" * (MODULE_LINES + 1))
    assert long_modules(tmp_path) == [f"deep/long.py: {MODULE_LINES + 1} lines"]
