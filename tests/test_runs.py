"""The run store and what reads it: round trip, concurrent writers, real recorded runs, compare,
the HTML report rendered in headless Chromium, TensorBoard interop, bad input."""

import json
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from itertools import pairwise

import numpy as np
import pytest

from scaletrain.tracking import RunStore, Sample
from tests.processes import DIGITS_MLP, run, run_here


def test_round_trip(tmp_path):
    path = tmp_path / "runs.db"
    with RunStore(path) as store:
        store.start_run("abc12345", name="mlp-digits-fp32", group="g", run_dir="d", config={"batch_size": 64},
                        environment={"torch": "2.x"})
        store.log_epoch("abc12345", 0, 1.5, {"val_accuracy": 0.9, "train_loss": 0.3, "warmup_epoch": True})
        store.log_epoch("abc12345", 1, 2.5, {"val_accuracy": 0.95, "train_loss": 0.2, "warmup_epoch": False})
        store.log_samples("abc12345", [Sample(0.5, 100, 50.0), Sample(1.0, 200, 75.0, 300, 99.0)])
        store.finish_run("abc12345", "finished", summary={"best_val_accuracy": 0.95})
    with RunStore(path, create=False) as store:  # a fresh connection reads what the first committed
        record = store.get("abc")
        assert (record.id, record.status, record.group, record.name, record.run_dir) == \
            ("abc12345", "finished", "g", "mlp-digits-fp32", "d")
        assert record.config == {"batch_size": 64} and record.environment == {"torch": "2.x"}
        assert record.summary == {"best_val_accuracy": 0.95}
        epochs = store.epochs("abc12345")
        assert [(e["epoch"], e["elapsed_s"], e["val_accuracy"], e["warmup_epoch"]) for e in epochs] == \
            [(0, 1.5, 0.9, True), (1, 2.5, 0.95, False)]
        assert store.samples("abc12345") == [Sample(0.5, 100, 50.0), Sample(1.0, 200, 75.0, 300, 99.0)]


WRITER = textwrap.dedent("""
    import sys, time
    from scaletrain.tracking import RunStore, Sample
    path, run_id, go = sys.argv[1], sys.argv[2], float(sys.argv[3])
    store = RunStore(path)
    while time.time() < go:  # all four start writing at the same moment
        time.sleep(0.001)
    store.start_run(run_id, name=run_id, group="concurrent", config={"writer": run_id})
    for epoch in range(60):
        store.log_epoch(run_id, epoch, epoch * 0.1, {"val_accuracy": epoch / 100, "writer": run_id})
        store.log_samples(run_id, [Sample(epoch * 0.1 + i * 0.01, 1000 + i, 10.0) for i in range(5)])
    store.finish_run(run_id, "finished", summary={"epochs_run": 60})
""")


def test_a_write_cut_short_by_a_signal_does_not_stop_the_next(tmp_path):
    """A signal between a write's BEGIN and its body leaves the transaction open (no rollback runs
    there); the interrupted run must still record that it was interrupted (seen in CI: the store
    kept "running"), and the cut write's rows must not appear."""
    store = RunStore(tmp_path / "runs.db")
    store.start_run("r")
    # What `_write` leaves when the signal lands right after its BEGIN: an open transaction.
    store._conn.execute("BEGIN IMMEDIATE")
    store._conn.execute("UPDATE runs SET name = 'half-written' WHERE id = 'r'")
    store.finish_run("r", "interrupted")
    store.close()
    with RunStore(tmp_path / "runs.db") as again:
        assert again.get("r").status == "interrupted"
        assert again.get("r").name is None


@pytest.mark.usefixtures("processes")
def test_four_concurrent_writers_lose_nothing(tmp_path):
    import time
    path = tmp_path / "runs.db"
    RunStore(path).close()
    go = time.time() + 3
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), f"writer{i}", str(go)],
                                stderr=subprocess.PIPE, text=True) for i in range(4)]
    for w in writers:
        assert w.wait(timeout=120) == 0, w.stderr.read()
    with RunStore(path, create=False) as store:
        records = store.runs(group="concurrent")
        assert sorted(r.id for r in records) == [f"writer{i}" for i in range(4)]
        for record in records:
            assert record.status == "finished" and record.summary == {"epochs_run": 60}
            epochs = store.epochs(record.id)
            assert [e["epoch"] for e in epochs] == list(range(60))
            assert all(e["writer"] == record.id for e in epochs)
            assert len(store.samples(record.id)) == 300
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


OPENER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from scaletrain.tracking import RunStore
    folder, rounds, go = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    for i in range(rounds):  # every opener opens store i at the same moment, a new file each round
        while time.time() < go + i * 0.05:
            time.sleep(0.0005)
        RunStore(folder / f"runs{i}.db").close()
""")


@pytest.mark.usefixtures("processes")
def test_processes_creating_one_new_store_at_once_all_open_it(tmp_path):
    """Seen in CI: two `multi` trainings opening a new store together, one failed with "database
    is locked" (SQLite answers the switch to WAL with BUSY at once while another opener switches)."""
    import time
    rounds, go = 30, time.time() + 3
    openers = [subprocess.Popen([sys.executable, "-c", OPENER, str(tmp_path), str(rounds), str(go)],
                                stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for opener in openers:
        assert opener.wait(timeout=120) == 0, opener.stderr.read()
    for i in range(rounds):
        conn = sqlite3.connect(tmp_path / f"runs{i}.db")
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall() == [("1",)]
        conn.close()


def test_a_store_locked_past_its_timeout_is_one_line_not_unreadable(tmp_path):
    from scaletrain.errors import UserError
    path = tmp_path / "runs.db"
    RunStore(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(UserError, match=r"stayed locked by another process for 0.2 s; wait for it"):
            RunStore(path, timeout_s=0.2)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    RunStore(path, timeout_s=0.2).close()   # free again: it opens


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two real CLI runs in a git repository: one to a target, one in bf16 with TensorBoard."""
    cwd = tmp_path_factory.mktemp("recorded")
    subprocess.run(["git", "init", "-q"], cwd=cwd, check=True)
    (cwd / "notes.txt").write_text("x")
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "add", "notes.txt"], cwd=cwd, check=True)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"], cwd=cwd, check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True).stdout.strip()
    first = run(["train", *DIGITS_MLP, "--epochs", "6", "--target-accuracy", "0.9", "--patience", "2",
                 "--sample-interval-s", "0.05"], cwd)
    assert first.returncode == 0, first.stderr
    second = run(["train", *DIGITS_MLP, "--epochs", "3", "--precision", "bf16-mixed", "--batch-size", "32",
                  "--tensorboard", "--group", "bf16"], cwd)
    assert second.returncode == 0, second.stderr
    store = RunStore(cwd / "scaletrain-runs" / "runs.db", create=False)
    yield cwd, store, commit
    store.close()


@pytest.mark.usefixtures("processes")
def test_a_train_run_is_recorded_with_its_environment(recorded):
    cwd, store, commit = recorded
    first, second = store.runs()
    summary = json.loads((cwd / first.run_dir / "summary.json").read_text())
    assert first.status == "finished" and first.summary == summary
    assert (first.config["target"], first.config["target_metric"]) == (0.9, "accuracy") and first.config["model"]["name"] == "mlp"
    assert first.environment["git"]["commit"] == commit and first.environment["torch"]
    assert first.environment["device"] == summary["device"] and first.environment["host"]
    epochs = store.epochs(first.id)
    assert len(epochs) == summary["epochs_run"]
    assert [e["val_accuracy"] for e in epochs][-1] == pytest.approx(summary["final_val_accuracy"])
    assert all(a["elapsed_s"] < b["elapsed_s"] for a, b in pairwise(epochs))
    samples = store.samples(first.id)
    assert samples and all(s.rss_bytes > 10 * 2**20 and s.cpu_percent is not None for s in samples)
    assert second.group == "bf16" and second.summary["precision"] == "bf16-mixed"
    assert (cwd / second.run_dir / "run_id").read_text().strip() == second.id


@pytest.mark.usefixtures("processes")
def test_tensorboard_event_files_hold_the_epoch_scalars(recorded):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    cwd, store, _ = recorded
    second = store.runs()[1]
    events = EventAccumulator(str(cwd / second.run_dir / "tensorboard"))
    events.Reload()
    values = [e.value for e in events.Scalars("val_accuracy")]
    assert values == pytest.approx([e["val_accuracy"] for e in store.epochs(second.id)], rel=1e-6)
    # At the optimizer step, the x axis every tracker shares (tracking/loggers/base.py).
    assert [e.step for e in events.Scalars("val_accuracy")] == [e["optimizer_steps"] for e in store.epochs(second.id)]
    assert [e.value for e in events.Scalars("epoch")] == [1, 2, 3]


def _store_with_known_runs(path):
    store = RunStore(path)
    for run_id, precision, batch, train_s, target_s, acc, ips, peak in [
            ("aaaa1111", "fp32", 128, 12.5, 10.25, 0.9312, 15000.0, 3 * 2**30),
            ("bbbb2222", "bf16-mixed", 256, 5.0, None, 0.8811, 41000.0, 2 * 2**30)]:
        store.start_run(run_id, name=run_id, config={"model": {"name": "wrn-16-10"}, "data": {"name": "fashion-mnist"}},
                        environment={"device": "NVIDIA H100 80GB HBM3"})
        store.finish_run(run_id, "finished", summary={
            "precision": precision, "batch_size": batch, "epochs_run": 4, "train_time_s": train_s,
            "wall_time_s": train_s + 3, "target_accuracy": 0.9, "time_to_target_s": target_s,
            "best_val_accuracy": acc, "images_per_sec": ips, "peak_memory_bytes": peak})
    return store


@pytest.mark.usefixtures("processes")
def test_compare_lines_up_known_runs(tmp_path):
    _store_with_known_runs(tmp_path / "runs.db").close()
    out = run_here(["runs", "compare", "aaaa", "bbbb2222", "--store", str(tmp_path / "runs.db")], tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:4]]
            for line in out.stdout.splitlines() if line.count("│") == 4}
    assert rows["precision"] == ["fp32", "bf16-mixed"]
    assert rows["batch"] == ["128", "256"]
    assert rows["train time"] == ["12.50 s", "5.00 s"]
    assert rows["time to target"] == ["10.25 s", "not reached (0.9)"]
    assert rows["best acc"] == ["0.9312", "0.8811"]
    assert rows["images/sec"] == ["15,000", "41,000"]
    assert rows["peak memory"] == ["3.00 GiB", "2.00 GiB"]
    as_json = json.loads(run_here(["runs", "compare", "aaaa", "bbbb", "--json", "--store", str(tmp_path / "runs.db")],
                             tmp_path).stdout)
    assert [r["images/sec"] for r in as_json] == [15000.0, 41000.0]
    assert [r["time to target"] for r in as_json] == [10.25, None]


@pytest.mark.usefixtures("processes")
def test_runs_list_where_nothing_was_trained_is_an_empty_table(tmp_path):
    for extra, expected in (([], "0 runs"), (["--json"], "[]")):
        out = run_here(["runs", "list", *extra], tmp_path)     # no store in this folder
        assert out.returncode == 0 and out.stderr == "", out.stderr
        assert expected in out.stdout
    assert not (tmp_path / "scaletrain-runs").exists()          # listing creates nothing


@pytest.mark.usefixtures("processes")
def test_bad_run_ids_and_stores_give_one_line(tmp_path):
    store = _store_with_known_runs(tmp_path / "runs.db")
    store.start_run("aaaa9999", name="x")
    store.close()
    db = ["--store", str(tmp_path / "runs.db")]
    cases = [(["runs", "show", "zzzz", *db], "no run 'zzzz'"),
             (["runs", "show", "aaaa", *db], "ambiguous"),
             (["runs", "compare", "aaaa1111", "nope", *db], "no run 'nope'"),
             (["runs", "show", "%", *db], "no run '%'"),   # no wildcard: '%' matches only itself
             (["runs", "show", "aaaa_", *db], "no run 'aaaa_'"),
             (["runs", "show", "aaaa1111", "--store", str(tmp_path / "missing.db")], "no run store at"),
             (["runs", "report", "--group", "none", *db], "no runs in group 'none'")]
    (tmp_path / "corrupt.db").write_bytes(b"this is not a database" * 100)
    cases.append((["runs", "list", "--store", str(tmp_path / "corrupt.db")], "not a readable SQLite database"))
    for args, message in cases:
        out = run_here(args, tmp_path)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert message in out.stderr and "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.usefixtures("processes")
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/setup-system.sh installs it)")
def test_report_renders_offline_in_headless_chromium_with_its_plots(recorded, tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image
    cwd, store, _ = recorded
    out = run(["runs", "report", "-o", str(tmp_path / "report.html")], cwd)
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "report.html").read_text()
    assert page.count("<svg") == 6  # inline: nothing to fetch, no script to run
    assert not any(ref in page for ref in ("<script", "<link", 'src="http', "url(http", "<img"))
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars", "--window-size=1280,2000",
                    f"--screenshot={shot}", (tmp_path / "report.html").as_uri()],
                   capture_output=True, timeout=120, check=True)
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int32).reshape(-1, 3)
    non_white = int((pixels.sum(axis=1) < 720).sum())
    assert non_white > 0.02 * len(pixels), "the screenshot is (nearly) blank"

    def near(colour, tolerance=40):
        return int((np.abs(pixels - np.array(colour)).max(axis=1) <= tolerance).sum())
    # Both runs' line colours (tab:blue, tab:orange) are drawn: the plots rendered, not just the text.
    assert near((0x1f, 0x77, 0xb4)) > 500 and near((0xff, 0x7f, 0x0e)) > 500


def test_a_locked_store_never_ends_a_training(tmp_path, capsys, digits):
    """Another process holding the store's write lock past the timeout: the run trains to the
    end, warns once, and the lock holder's data is untouched."""
    from scaletrain.tracking.recorder import RunRecorder
    from tests.conftest import small_config
    from tests.helpers import fit
    path = tmp_path / "runs.db"
    store = RunStore(path, timeout_s=0.2)
    store.start_run("locked01", name="x")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        recorder = RunRecorder(store, "locked01", wall_start=0.0)
        trainer = fit(small_config(tmp_path, epochs=2), digits, callbacks=[recorder])
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert len(trainer.history) == 2 and recorder.failed is not None
    assert capsys.readouterr().err.count("stopped recording run locked01") == 1
    assert store.epochs("locked01") == []
    store.close()
