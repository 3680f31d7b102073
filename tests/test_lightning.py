"""A LightningModule trained as it is (adapters/lightning.py): its losses equal Lightning's own
Trainer's step for step; through the real CLI (with its LightningDataModule) single process, under
torchrun with ddp, an exact resume, plan-memory, autotune and scaling; the step free of host
syncs; what is not honoured refused in one line."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import logging
import sys
import warnings

import pytest
import torch

if importlib.util.find_spec("lightning") is None:
    pytest.skip("lightning is not installed", allow_module_level=True)

from scaletrain.config import OptimConfig, TrainConfig  # noqa: E402
from scaletrain.errors import ConfigError  # noqa: E402
from scaletrain.training import Trainer  # noqa: E402
from tests.processes import PLUGINS, committed_steps, metrics, run, summary  # noqa: E402

sys.path.insert(0, str(PLUGINS))


class _ImportedOnUse:
    """The plugin module lit_classifier, imported by the first test that uses it: importing
    Lightning at collection cost each pytest worker 2.9 s, `make check`'s too."""

    def __getattr__(self, name: str):
        if name.startswith("_"):     # pytest's collection looks for marks and mocks on every module attribute
            raise AttributeError(name)
        return getattr(importlib.import_module("lit_classifier"), name)


lit_classifier = _ImportedOnUse()

LIT = ["--model", "lit_classifier:LitClassifier", "--data", "lit_classifier:Blobs", "--no-progress"]


def _lightning_losses(module_class, train, val, epochs: int) -> tuple[list[float], dict, list[float]]:
    """Per-step training losses, the last validation metrics and each step's LR under Lightning's
    own Trainer."""
    import lightning as L
    from torch.utils.data import DataLoader

    class Record(L.Callback):
        losses: list[float] = []
        lrs: list[float] = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.losses.append(float(outputs["loss"]))
            self.lrs.append(float(trainer.optimizers[0].param_groups[0]["lr"]))

    logging.getLogger("lightning").setLevel(logging.ERROR)
    L.seed_everything(0, verbose=False)
    module, record = module_class(), Record()
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[record])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, DataLoader(train, batch_size=len(train)), DataLoader(val, batch_size=64))
    return record.losses, {k: float(v) for k, v in trainer.callback_metrics.items()}, record.lrs


@pytest.mark.parametrize("module_name", ["LitClassifier", "LitAdam", "onecycle", "OnPlateau", "CycledMomentum",
                                         "CycledAdam"],
                         ids=["steplr", "adamw", "onecycle", "plateau", "onecycle-momentum", "onecycle-betas"])
def test_losses_equal_lightnings_own_trainer(tmp_path, module_name):
    """The same module, seed and data (one batch an epoch: the mean loss does not depend on the
    order), four epochs: every step's loss and the validation metrics equal Lightning's Trainer's.
    SGD with momentum and a StepLR halving the LR after epoch 2; AdamW decaying every parameter;
    SGD under a OneCycleLR stepped every step (lr_schedule 'module'); SGD under a ReduceLROnPlateau
    on val_loss, which halves the LR within the four epochs; SGD's momentum and AdamW's first beta
    cycled by a OneCycleLR as users write it (cycle_momentum=True, its default)."""
    from torch.utils.data import TensorDataset
    module_class = (functools.partial(lit_classifier.Scheduled, "onecycle", "step", 1) if module_name == "onecycle"
                    else getattr(lit_classifier, module_name))
    train, val = TensorDataset(*lit_classifier.samples(256)), TensorDataset(*lit_classifier.samples(128, seed=1))
    theirs, their_val, their_lrs = _lightning_losses(module_class, train, val, epochs=4)
    cfg = TrainConfig(epochs=4, batch_size=256, seed=0, run_dir=str(tmp_path / "run"))
    torch.manual_seed(0)
    with Trainer(module_class(), cfg) as trainer:
        history = trainer.fit(train, val=val)
        assert trainer.task.metrics == {"loss": False, "acc": True}
    settled = trainer.config.optim      # the module's own settings, in the trainer's copy (the caller's stays)
    assert [h["train_loss"] for h in history] == pytest.approx(theirs, rel=1e-5)
    assert history[-1]["val_loss"] == pytest.approx(their_val["val_loss"], rel=1e-5)
    assert history[-1]["val_acc"] == pytest.approx(their_val["val_acc"], abs=1e-9)
    if module_class is lit_classifier.LitClassifier:
        assert [h["lr"] for h in history] == pytest.approx([0.05, 0.05, 0.025, 0.025])
        assert settled.optimizer == "sgd" and settled.momentum == 0.9
    elif module_class is lit_classifier.LitAdam:
        assert settled.optimizer == "adamw" and settled.weight_decay == 0.01 and settled.decay_all
    elif module_class is lit_classifier.OnPlateau:
        assert settled.lr_schedule == "module" and [h["lr"] for h in history] == pytest.approx(their_lrs)
        assert their_lrs[-1] < their_lrs[0], their_lrs
    else:
        assert settled.lr_schedule == "module" and len({h["lr"] for h in history}) == 4


def _lightning_lrs(module, train, epochs: int, batch_size: int) -> list[float]:
    """The LR each optimizer step of Lightning's own Trainer used."""
    import lightning as L
    from torch.utils.data import DataLoader

    class Record(L.Callback):
        lrs: list[float] = []

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self.lrs.append(float(trainer.optimizers[0].param_groups[0]["lr"]))

    logging.getLogger("lightning").setLevel(logging.ERROR)
    record = Record()
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0, callbacks=[record])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, DataLoader(train, batch_size=batch_size))
    return record.lrs


@pytest.mark.parametrize("kind, interval, frequency", [
    ("onecycle", "step", 1), ("onecycle", "step", 3), ("cosine", "epoch", 1), ("cosine", "step", 2),
    ("lambda", "epoch", 2), ("lambda", "step", 1), ("warmup-cosine", "step", 1), ("warmup-cosine", "epoch", 1)])
def test_the_schedulers_lightning_users_write_set_every_steps_lr_as_lightnings_trainer(kind, interval, frequency):
    """OneCycleLR (sized by self.trainer.estimated_stepping_batches), CosineAnnealingLR, LambdaLR and
    a LinearLR warm-up chained to a cosine by SequentialLR, each stepped every `frequency` steps or
    epochs: the LR every optimizer step applied equals what Lightning's Trainer applied, to 1e-5,
    over 4 epochs of 5 steps (a frequency that does not divide the epoch restarts with it, as
    Lightning counts batches within the epoch)."""
    from torch.utils.data import TensorDataset
    train = TensorDataset(*lit_classifier.samples(320))
    theirs = _lightning_lrs(lit_classifier.Scheduled(kind, interval, frequency), train, epochs=4, batch_size=64)

    class Applied:
        lrs: list[float] = []

        def on_train_batch_end(self, trainer, step, logs):
            self.lrs.append(float(trainer.train_step.optimizer.param_groups[0]["lr"]))
    applied = Applied()
    cfg = TrainConfig(epochs=4, batch_size=64, seed=0)
    with Trainer(lit_classifier.Scheduled(kind, interval, frequency), cfg, callbacks=[applied]) as trainer:
        trainer.fit(train, val=TensorDataset(*lit_classifier.samples(64, seed=1)))
    assert trainer.config.optim.lr_schedule == "module"
    assert len(theirs) == 20 and len(set(theirs)) >= 2, theirs
    assert applied.lrs == pytest.approx(theirs, rel=1e-5, abs=1e-9)


@pytest.mark.parametrize("module, words", [
    ("Manual", "uses manual optimisation"),
    ("TwoOptimizers", "returns 2 optimizers; scaletrain trains with one"),
    ("EpochHook", "overrides on_train_epoch_end: scaletrain does not call these Lightning hooks"),
    ("PlateauOnNothing", "ReduceLROnPlateau monitors 'val_f1', which validation_step does not log \\(it logs val_acc, "
                         "val_loss\\)")])
def test_what_is_not_honoured_is_refused_in_one_line(tmp_path, module, words):
    from torch.utils.data import TensorDataset
    with pytest.raises(ConfigError, match=words):
        with Trainer(getattr(lit_classifier, module)(), TrainConfig(epochs=1, batch_size=64)) as trainer:
            trainer.fit(TensorDataset(*lit_classifier.samples(256)))


@pytest.mark.parametrize("interval, frequency, words", [
    ("batch", 1, "lr_scheduler interval 'batch': Lightning takes 'step' or 'epoch'"),
    ("step", 0, "lr_scheduler frequency 0: a whole number of intervals, 1 or more"),
    ("step", 1.5, "lr_scheduler frequency 1.5: a whole number of intervals, 1 or more")])
def test_a_scheduler_configuration_lightning_would_refuse_is_one_line(interval, frequency, words):
    with pytest.raises(ConfigError, match=words):
        Trainer(lit_classifier.Scheduled("cosine", interval, frequency), TrainConfig(epochs=1, batch_size=64))


def test_a_plateau_stepped_per_step_is_refused_naming_the_interval_that_works():
    module = lit_classifier.OnPlateau()
    configure = module.configure_optimizers

    def per_step():
        config = configure()
        config["lr_scheduler"]["interval"] = "step"
        return config
    module.configure_optimizers = per_step
    with pytest.raises(ConfigError, match="scaletrain steps it after each validation \\(interval 'epoch'\\)"):
        Trainer(module, TrainConfig(epochs=1, batch_size=64))


@pytest.mark.usefixtures("processes")
def test_lr_schedule_module_without_a_lightning_module_is_one_line_before_the_run(tmp_path):
    done = run(["train", "--model", "mlp", "--data", "digits", "--epochs", "1", "--no-progress", "--no-record",
                "--lr-schedule", "module", "--run-dir", tmp_path / "run"], tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        "scaletrain: error: --lr-schedule module reads a LightningModule's own scheduler; mlp is not one: choose "
        "constant, step, cosine or onecycle"], done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.usefixtures("processes")
@pytest.mark.timeout(600)   # a dozen commands, three of them launchers: a hang guard, not a speed claim
def test_a_lightning_module_through_the_cli(tmp_path):
    """Its DataModule's loaders give the splits; a target on a metric it logs stops the run; an
    optimizer flag its configure_optimizers sets is refused before anything starts; then ddp on two
    processes, an ensemble of two runs, plan-memory, autotune and scaling on it."""
    result = run(["train", *LIT, "--batch-size", "64", "--epochs", "6", "--target", "0.85", "--target-metric", "acc",
                  "--run-dir", tmp_path / "one"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "optimizer from LitClassifier.configure_optimizers: sgd lr 0.05, LR x0.5 at epochs 2, 4, 6" in result.stdout
    reported = summary(tmp_path / "one")
    # The run records the optimizer that trained, not the recipe's defaults it replaced.
    recorded = json.loads((tmp_path / "one" / "config.json").read_text())["optim"]
    assert (recorded["optimizer"], recorded["lr"], recorded["momentum"], recorded["lr_schedule"],
            recorded["step_milestones"], recorded["step_gamma"]) == ("sgd", 0.05, 0.9, "step", [2.0, 4.0, 6.0], 0.5)
    assert reported["task"] == "lightning:LitClassifier" and reported["reached_target"]
    assert "val acc >= 0.85" in result.stdout
    logged = metrics(tmp_path / "one")
    assert logged[-1]["val_acc"] >= 0.85 > logged[0]["val_acc"] - 0.5 and "val_loss" in logged[-1]

    # predict and export run the module's own forward (class probabilities): the same as loading
    # model.pt into the class by hand.
    predicted = run(["predict", reported["run_id"], "--split", "val", "--out", tmp_path / "p.npy"], tmp_path)
    assert predicted.returncode == 0, predicted.stderr[-2000:]
    exported = run(["export", reported["run_id"]], tmp_path)
    assert exported.returncode == 0 and "max |difference| 0" in exported.stdout, exported.stderr[-2000:]
    import numpy as np

    from scaletrain.checkpoint.weights import read_weights
    module = lit_classifier.LitClassifier()
    state = read_weights(str(tmp_path / "one" / "model.pt"), "model")
    module.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
    x, _ = lit_classifier.samples(1200)
    with torch.no_grad():
        expected = torch.softmax(module(x[900:]), dim=-1).numpy()
    assert np.allclose(np.load(tmp_path / "p.npy"), expected, atol=1e-6)

    refused = run(["train", *LIT, "--lr", "0.1", "--run-dir", tmp_path / "refused"], tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "--lr: lit_classifier:LitClassifier is a LightningModule whose configure_optimizers" in refused.stderr
    assert not (tmp_path / "refused").exists()
    unknown = run(["train", *LIT, "--target", "0.9", "--target-metric", "f1", "--run-dir", tmp_path / "f1"], tmp_path)
    assert unknown.returncode == 2 and "reports loss, acc" in unknown.stderr, unknown.stderr[-2000:]

    # The DataModule batches 64 a replica: the global batch of two replicas is 128.
    ddp = run(["train", *LIT, "--batch-size", "128", "--epochs", "3", "--nproc", "2", "--strategy", "ddp",
               "--run-dir", tmp_path / "ddp"], tmp_path)
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    assert summary(tmp_path / "ddp")["world_size"] == 2
    # Two modules' mean class probabilities, scored as the data's classification (their own metrics
    # are what validation_step logs, which a mean of predictions does not carry).
    combined = run(["ensemble", reported["run_id"], summary(tmp_path / "ddp")["run_id"]], tmp_path)
    assert combined.returncode == 0, combined.stderr[-2000:]
    assert "averaged probabilities" in combined.stdout and "test accuracy" in combined.stdout
    # fsdp shards it as any model (AdamW: torch has no sharded fused SGD, tests/test_sharded.py).
    fsdp = run(["train", "--model", "lit_classifier:LitAdam", *LIT[2:], "--batch-size", "128", "--epochs", "2",
                "--nproc", "2", "--strategy", "fsdp", "--run-dir", tmp_path / "fsdp"], tmp_path)
    assert fsdp.returncode == 0, fsdp.stderr[-2000:]
    servers = run(["train", *LIT, "--strategy", "ps", "--nproc", "3", "--run-dir", tmp_path / "ps"], tmp_path)
    assert servers.returncode == 2 and "its servers build the optimizer from the config" in servers.stderr
    assert not (tmp_path / "ps").exists()

    flags = [*LIT[:4], "--batch-size", "64"]
    planned = run(["plan-memory", *flags], tmp_path)
    assert planned.returncode == 0 and "activations traced" in planned.stdout, planned.stderr[-2000:]
    tuned = run(["autotune", *flags, "--trials", "2", "--confirm-rounds", "0", "--steps", "3", "--knobs", "steps_per_execution",
                 "--out", tmp_path / "tuned"], tmp_path)
    assert tuned.returncode == 0 and "best:" in tuned.stdout, tuned.stdout[-2000:] + tuned.stderr[-2000:]
    assert "refused" not in tuned.stdout     # fused steps give the same loss through training_step
    scaled = run(["scaling", *flags, "--measure-steps", "2", "--json"], tmp_path)
    assert scaled.returncode == 0, scaled.stderr[-2000:]
    assert json.loads(scaled.stdout)[0]["step_time_s"] > 0


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("model", [[], ["--model", "lit_classifier:Scheduled", "--model-option", "kind=onecycle",
                                         "--model-option", "interval=step", "--model-option", "frequency=3"],
                                   ["--model", "lit_classifier:OnPlateau"]],
                         ids=["steplr", "onecycle-every-3-steps", "plateau"])
def test_a_lightning_run_resumed_from_a_checkpoint_equals_the_whole_run(tmp_path, model):
    """Mid-epoch (step 10 of 15 an epoch) under its StepLR, under a OneCycleLR stepped every 3
    steps, whose LR changes within the epoch, and under a ReduceLROnPlateau, whose state and
    reductions so far the checkpoint carries: the resumed run's figures equal the whole run's."""
    common = ["train", *LIT, *model, "--batch-size", "64", "--epochs", "4", "--no-record", "--checkpoint-every", "10"]
    full = run([*common, "--run-dir", tmp_path / "full"], tmp_path)
    assert full.returncode == 0, full.stderr[-2000:]
    steps = committed_steps(tmp_path / "full" / "checkpoints")
    mid = tmp_path / "full" / "checkpoints" / f"step-{steps[0]:09d}"
    resumed = run([*common, "--run-dir", tmp_path / "cut", "--resume", mid], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    figures = [[m[k] for k in ("train_loss", "val_loss", "val_acc", "lr")] for m in metrics(tmp_path / "full")]
    assert figures == [[m[k] for k in ("train_loss", "val_loss", "val_acc", "lr")] for m in metrics(tmp_path / "cut")]


def test_the_lightning_step_stays_free_of_host_syncs(tmp_path):
    """The no-host-sync rule of tests/test_trainer.py holds through training_step (its self.log
    included), under fp16's loss scaling and clipping too."""
    from torch.utils.data import TensorDataset

    from scaletrain.config import PrecisionConfig
    from tests.test_trainer import steps_without_host_syncs
    cfg = TrainConfig(epochs=1, batch_size=64, precision=PrecisionConfig(policy="fp16-mixed"),
                      optim=OptimConfig(clip_grad_norm=1.0), run_dir=str(tmp_path / "run"))
    with Trainer(lit_classifier.LitClassifier(), cfg) as trainer:
        dataset = trainer.as_dataset(TensorDataset(*lit_classifier.samples(512)))
        trainer.fit(dataset)
        x, y = next(iter(trainer.loader(dataset.train, train=True)))
        steps_without_host_syncs(trainer, x, y)
