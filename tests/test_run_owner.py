"""One owner of a run (lifecycle/run.py): its configuration is checked once, and every party that
records it (the folder, the store, the trackers) hears once how it ended, whatever ended it.
Real runs on digits, in this process; the parties are the real ones, counted where they are told."""

from __future__ import annotations

import json

import pytest

from scaletrain.cli.main import main
from scaletrain.config import TrainConfig
from scaletrain.errors import WriteFailed
from scaletrain.lifecycle.plan import TakenFolder
from scaletrain.tracking import RunStore
from scaletrain.tracking.tracked_run import TrackedRun
from tests.processes import DIGITS_MLP


@pytest.fixture
def checks(monkeypatch):
    """How many times a configuration's values were checked, from a clean slate."""
    count = {"n": 0}
    original = TrainConfig._check_values

    def counted(self):
        count["n"] += 1
        return original(self)
    monkeypatch.setattr(TrainConfig, "_check_values", counted)
    return count


def _train(tmp_path, *flags) -> int:
    return main(["train", *DIGITS_MLP, "--epochs", "1", "--batch-size", "128", "--device", "cpu",
                 "--run-dir", str(tmp_path / "run"), "--store", str(tmp_path / "runs.db"), *flags])


def test_a_cli_run_checks_its_configuration_once(tmp_path, checks, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _train(tmp_path, "--checkpoint-every", "1") == 0
    # The flags' configuration, then the settled one (`--precision auto` written in as the
    # device's policy, which the run saves): each once, never again by the build or the trainer.
    assert checks["n"] == 2
    # A resume adopts the run's saved configuration: the flags' and the adopted one, each once.
    checks["n"] = 0
    assert _train(tmp_path, "--epochs", "2", "--resume", "auto", "--checkpoint-every", "1") == 0
    assert 1 <= checks["n"] <= 2
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "finished"


@pytest.fixture
def told(monkeypatch):
    """{party.method: calls} for the folder's and the store record's endings."""
    calls: dict[str, int] = {}
    for cls, name in ((TakenFolder, "finish"), (TakenFolder, "fail"), (TrackedRun, "finish"), (TrackedRun, "fail")):
        original = getattr(cls, name)

        def counted(self, *args, _original=original, _key=f"{cls.__name__}.{name}", **kwargs):
            calls[_key] = calls.get(_key, 0) + 1
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(cls, name, counted)
    return calls


class _FailsAtEpoch:
    def on_epoch_end(self, trainer, epoch, logs):
        raise RuntimeError("the user's callback broke")


def test_a_run_that_raises_mid_training_is_told_failed_once(tmp_path, told, monkeypatch):
    from scaletrain.runner import run_training
    from tests.conftest import small_config
    monkeypatch.chdir(tmp_path)
    cfg = small_config(tmp_path, epochs=2)
    cfg.tracking.store = str(tmp_path / "runs.db")
    with pytest.raises(RuntimeError, match="callback broke"):
        run_training(cfg, callbacks=[_FailsAtEpoch()])
    assert told == {"TrackedRun.fail": 1, "TakenFolder.fail": 1}
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["status"] == "failed"
    with RunStore(tmp_path / "runs.db") as store:
        assert store.get(meta["run_id"]).status == "failed"


def test_a_run_whose_results_cannot_be_written_is_failed_not_finished(tmp_path, told, monkeypatch):
    """The end, too, can fail (the summary's path taken by a folder after the run started): every
    party is told `failed` once, none hears `finished`."""
    from scaletrain.runner import run_training
    from tests.conftest import small_config
    monkeypatch.chdir(tmp_path)
    cfg = small_config(tmp_path, epochs=1)
    cfg.tracking.store = str(tmp_path / "runs.db")
    cfg.summary_json = str(tmp_path / "out" / "summary.json")

    class TakeTheSummaryPath:
        def on_train_begin(self, trainer):
            (tmp_path / "out" / "summary.json").mkdir(parents=True)

    with pytest.raises(WriteFailed, match="summary.json \\(Is a directory\\)"):
        run_training(cfg, callbacks=[TakeTheSummaryPath()])
    assert told == {"TrackedRun.fail": 1, "TakenFolder.fail": 1}
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["status"] == "failed"
    with RunStore(tmp_path / "runs.db") as store:
        assert store.get(meta["run_id"]).status == "failed"
