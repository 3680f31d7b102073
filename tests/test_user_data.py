"""Data as users hold it (data/user.py): a torch Dataset, a DataLoader or arrays through the
Python API; `--data package.module:function` and a float-target .npz through the real CLI, under
torchrun, killed and resumed."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, WeightedRandomSampler, get_worker_info

from scaletrain.config import TrainConfig
from scaletrain.data.loaders import Normalizer, StreamingLoader
from scaletrain.data.user import StreamSplit, TorchSplit, as_dataset
from scaletrain.errors import ConfigError, DataError, Terminated
from scaletrain.training import Trainer
from tests.processes import PLUGINS, kill_slowed_run_after_checkpoint, metrics, run, summary


class Pairs(Dataset):
    """Learnable: the class is which of the first three features is largest."""

    def __init__(self, n=480, seed=0, noise=False):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x[:, :3].argmax(1)
        self.noise = noise

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i] + (0.1 * torch.randn(8) if self.noise else 0)   # a random transform, from torch's generator
        return x, self.y[i]


class Dicts(Pairs):
    """The same samples as Hugging Face datasets yield them."""

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return {"features": x, "label": int(y)}


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))


def _config(tmp_path, **overrides):
    cfg = TrainConfig(epochs=3, batch_size=32, progress=False, run_dir=str(tmp_path / "run"), device="cpu")
    cfg.optim.lr = 1e-2
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def test_a_map_style_dataset_trains_and_its_task_is_read_off_its_targets(tmp_path):
    with Trainer(_model(), _config(tmp_path)) as trainer:
        history = trainer.fit(Pairs(), val=Pairs(160, seed=1), test=Pairs(160, seed=2))
        assert trainer.task.name == "classification"
        assert history[-1]["val_accuracy"] >= 0.85 and trainer.test_logs["test_accuracy"] >= 0.85
        # evaluate() on a split as the user holds it: every sample once.
        assert trainer.evaluate(Pairs(160, seed=2)) == pytest.approx(
            {k[5:]: v for k, v in trainer.test_logs.items()})


def test_dict_samples_through_a_dataloader_with_workers_train_exactly_like_the_same_pairs(tmp_path):
    """The DataLoader's batch size, collate and 2 workers are used; the order, shares and per-batch
    random draws are the trainer's, so the histories agree to the bit."""
    with Trainer(_model(), _config(tmp_path)) as pairs:
        expected = pairs.fit(Pairs(noise=True))
    with Trainer(_model(), _config(tmp_path)) as dicts:
        got = dicts.fit(DataLoader(Dicts(noise=True), batch_size=32, num_workers=2, shuffle=True))
    keys = ("train_loss", "train_accuracy", "val_loss", "val_accuracy")
    assert [[e[k] for k in keys] for e in got] == [[e[k] for k in keys] for e in expected]


def test_a_dataloaders_batch_size_is_adopted_as_the_per_process_batch(tmp_path):
    """A DataLoader of 16 under a configuration of 32 trains as a configuration of 16 would, to the
    bit, and says where its batch came from; a per-process batch the configuration names is not
    overridden but refused in one line."""
    with Trainer(_model(), _config(tmp_path, batch_size=16)) as configured:
        expected = configured.fit(Pairs(noise=True))
    with Trainer(_model(), _config(tmp_path)) as given:
        got = given.fit(DataLoader(Pairs(noise=True), batch_size=16))
        assert (given.batch.per_replica, given.batch.global_batch) == (16, 16)
        assert given.batch.describe().endswith("16 per process: the training DataLoader's batch_size")
    keys = ("train_loss", "val_loss", "val_accuracy")
    assert [[e[k] for k in keys] for e in got] == [[e[k] for k in keys] for e in expected]
    with Trainer(_model(), _config(tmp_path, per_replica_batch_size=32)) as named:
        with pytest.raises(ConfigError, match="batch_size is 16 but per_replica_batch_size is 32; leave"):
            named.fit(DataLoader(Pairs(), batch_size=16))


@pytest.mark.parametrize("form", ["torch", "arrays"])
def test_drop_last_off_trains_every_sample_each_epoch(tmp_path, form):
    """450 training samples in batches of 32: 14 steps of 32 by default (2 left out each epoch),
    and with drop_last off a 15th step of the 2 (through a DataLoader and on the device alike);
    what needs one shape refuses it in one line."""
    seen = []
    for drop_last in (True, False):
        model = _model()
        rows = []
        model.register_forward_pre_hook(lambda m, args: rows.append(len(args[0])) if m.training else None)
        cfg = _config(tmp_path, epochs=2)
        cfg.data.drop_last = drop_last
        data = Pairs(450) if form == "torch" else (Pairs(450).x, Pairs(450).y)
        with Trainer(model, cfg) as trainer:
            trainer.fit(data, val=Pairs(64, seed=1))
        seen.append(rows[-trainer.steps_per_epoch * 2:])
    assert seen[0] == [32] * 14 * 2 and seen[1] == ([32] * 14 + [2]) * 2
    cfg = _config(tmp_path, steps_per_execution=2)
    cfg.data.drop_last = False
    with pytest.raises(ConfigError, match="'data.drop_last' false .* but --steps-per-execution needs every step"):
        cfg.validate()


def test_float_targets_train_as_regression(tmp_path):
    class Linear(Dataset):
        def __init__(self):
            g = torch.Generator().manual_seed(0)
            self.x = torch.randn(400, 8, generator=g)
            self.y = self.x @ torch.linspace(-1, 1, 8)

        def __len__(self):
            return 400

        def __getitem__(self, i):
            return self.x[i], self.y[i]

    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    with Trainer(model, _config(tmp_path, epochs=6)) as trainer:
        history = trainer.fit(Linear())
    assert trainer.task.name == "regression" and history[-1]["val_r2"] > 0.8


def test_arrays_take_the_device_resident_path(tmp_path):
    data = Pairs()
    ds = as_dataset((data.x.numpy(), data.y.numpy()))
    assert not isinstance(ds.train, TorchSplit) and ds.task == "classification" and ds.num_classes == 3
    with Trainer(_model(), _config(tmp_path)) as trainer:
        assert trainer.fit((data.x, data.y))[-1]["val_accuracy"] >= 0.85


def test_a_random_transform_draws_the_same_per_sample_whoever_reads_it_and_leaves_the_trainers_generator_alone():
    split = TorchSplit(Pairs(96, noise=True), "noisy")

    def batches(workers, start_batch=0):
        loader = StreamingLoader(split, 16, torch.device("cpu"), Normalizer(None, None, torch.float32), shuffle=True,
                                 drop_last=True, seed=3, num_workers=workers)
        loader.set_epoch(1, start_batch)
        return [x for x, _ in loader]

    torch.manual_seed(0)
    in_process = batches(0)
    after = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(3))        # reading samples drew nothing from the trainer's generator
    assert all(torch.equal(a, b) for a, b in zip(in_process, batches(2), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(in_process[2:], batches(2, start_batch=2), strict=True))


class Counted(IterableDataset):
    """Pairs' samples from a generator, with no __len__ (the trainer counts them by reading through).
    Written as torch's documentation shows, it splits itself among DataLoader workers: the
    trainer must still see the whole stream and split it itself."""

    def __init__(self, n=200, seed=0, noise=False):
        self.n, self.seed, self.noise = n, seed, noise

    def __iter__(self):
        pairs, info = Pairs(self.n, self.seed, self.noise), get_worker_info()
        for i in range(self.n) if info is None else range(info.id, self.n, info.num_workers):
            yield pairs[i]


def _stream_batches(split, rank, workers, start_batch=0, train=True):
    loader = StreamingLoader(split, 16, torch.device("cpu"), Normalizer(None, None, torch.float32), shuffle=train,
                             drop_last=train, seed=3, num_workers=workers, rank=rank, world_size=2 if train else 1)
    loader.set_epoch(1, start_batch)
    return [x for x, _ in loader]


def test_a_stream_is_read_once_across_ranks_and_workers_in_the_same_batches_and_draws():
    stream = StreamSplit(Counted(), "stream")
    assert len(stream) == 200                      # counted: no __len__
    index = {float(x[0]): i for i, (x, _) in enumerate(Pairs(200))}
    ids = lambda batches: [[index[float(x[0])] for x in batch] for batch in batches]   # noqa: E731
    # Two replicas of batch 16, each read by 2 workers: rank r's step j is samples
    # [32j + 16r, 32j + 16r + 16), as the map-style path slices global batches; 200 // 32 = 6 steps.
    for rank in (0, 1):
        got = ids(_stream_batches(stream, rank, workers=2))
        assert got == [list(range(32 * j + 16 * rank, 32 * j + 16 * rank + 16)) for j in range(6)]
    # Evaluation ranges of two replicas: every sample once, the last batch short.
    halves = [ids(_stream_batches(stream.part(a, b), 0, workers=2, train=False)) for a, b in ((0, 100), (100, 200))]
    assert sorted(i for half in halves for batch in half for i in batch) == list(range(200))
    # A random transform draws the same whoever reads the batch; a resumed epoch reads its tail;
    # the trainer's own generator is left alone.
    noisy = StreamSplit(Counted(noise=True), "noisy")
    torch.manual_seed(0)
    in_process = _stream_batches(noisy, 1, workers=0)
    after = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(3))
    assert all(torch.equal(a, b) for a, b in zip(in_process, _stream_batches(noisy, 1, workers=2), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(in_process[2:], _stream_batches(noisy, 1, 2, start_batch=2),
                                                 strict=True))


def test_a_stream_is_written_into_shards_in_one_pass_each_sample_in_order(tmp_path):
    from scaletrain.data.shards.reader import read_split
    from scaletrain.data.shards.writer import write_shards

    class Passes(Counted):
        passes = 0

        def __iter__(self):
            Passes.passes += 1
            return super().__iter__()

    manifest = write_shards(as_dataset(Passes(200), val=Counted(40, seed=1)), tmp_path / "shards",
                            samples_per_shard=25)
    assert Passes.passes <= 4           # counted, first samples, classes, then written: not once a shard
    assert len(manifest.split("train")) == 8
    written, pairs = read_split(manifest, "train"), Pairs(200)
    assert torch.equal(written.x, pairs.x) and torch.equal(written.y, pairs.y)


def test_a_stream_trains_through_a_dataloader_with_workers(tmp_path):
    with Trainer(_model(), _config(tmp_path)) as trainer:
        history = trainer.fit(DataLoader(Counted(480, noise=True), batch_size=32, num_workers=2),
                              val=Counted(160, seed=1))
    assert trainer.task.name == "classification" and history[-1]["val_accuracy"] >= 0.85


class StopsAtStep:
    """A callback raising the stop a SIGTERM raises, at one step's start: inside the training step,
    not inside a read from the loader."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_begin(self, trainer, step):
        if step == self.step:
            raise Terminated()


@pytest.mark.parametrize("loader_workers", ["the data's own", "configured"])
def test_a_stop_raised_in_a_step_ends_the_loaders_workers_before_it_goes_on(tmp_path, loader_workers):
    """fit() raises the stop, and the loader's worker processes are gone by then: not left to the
    DataLoader's shutdown when it is collected, which joins a worker stuck in a user's read 5 s
    (10 s a rank, stopping a job of hung reads mid-step), or never, in a launched worker that
    leaves through os._exit (an orphan asleep in the read for good: tests/test_trust.py's jobs)."""
    import multiprocessing
    cfg = _config(tmp_path, epochs=1)
    if loader_workers == "configured":   # a Dataset, read by the trainer's DataLoader with --num-workers 2
        cfg.data.num_workers, data = 2, Pairs()
    else:
        data = DataLoader(Pairs(), batch_size=32, num_workers=2)
    with Trainer(_model(), cfg, callbacks=[StopsAtStep(2)]) as trainer, pytest.raises(Terminated) as stopped:
        trainer.fit(data, val=Pairs(64, seed=1))
    # `stopped` holds the traceback, so fit's loaders live on here: only the stop ended their workers.
    left = [child.pid for child in multiprocessing.active_children() if child.daemon]
    del stopped
    gc.collect()    # the loaders go, and their DataLoaders shut down what the stop left
    assert left == []


class ThreeClasses(Pairs):
    num_classes = 3

    def __getitem__(self, i):
        return self.x[i], 7 if i == 100 else int(self.y[i])   # one stray label


@pytest.mark.parametrize("data, problem", [
    (DataLoader(Pairs(), batch_size=32, sampler=WeightedRandomSampler([1.0] * 480, 480)), "sampler of its own"),
    (Counted(), "a stream cannot be split at random for validation; give val="),
    (DataLoader(Counted(), batch_size=None), "batch_size=None"),
    ([{"features": torch.zeros(8)}] * 4, "needs its target under one of"),
    ([("text", 1)] * 4, "samples must hold tensors"),
    ([], "the split is empty"),
    ([(torch.zeros(8), 0), (torch.zeros(9), 1)] * 40, "collating a batch failed: .*different shapes"),
    (ThreeClasses(), r"label 7 is out of range \[0, 3\)"),
    ((torch.zeros(40, 8), torch.arange(40) % 3), None),
    ({"x": torch.zeros(4, 8)}, "cannot read dict"),
])
def test_data_a_trainer_cannot_take_is_refused_in_one_line(tmp_path, data, problem):
    with Trainer(_model(), _config(tmp_path)) as trainer:
        if problem is None:   # in memory: 3 classes in training, a 4th in validation, refused before training
            with pytest.raises(DataError, match=r"label 3 is out of range \[0, 3\)"):
                trainer.fit(data, val=(torch.zeros(8, 8), torch.arange(8) % 4))
            return
        with pytest.raises((ConfigError, DataError), match=problem):
            trainer.fit(data)


@pytest.mark.parametrize("form", ["arrays", "torch"])
def test_a_val_split_without_a_test_split_keeps_its_name(form):
    """A user's val split where there is no test split stands in for the test split: shown and
    asked for as val, never as a test split it is not, in memory and through a torch Dataset."""
    x, y = torch.randn(96, 4), torch.randint(0, 3, (96,))
    pair = (lambda a, b: (a, b)) if form == "arrays" else (lambda a, b: torch.utils.data.TensorDataset(a, b))
    given = as_dataset(pair(x[:64], y[:64]), val=pair(x[64:], y[64:]), name="mine")
    assert given.describe_splits() == "64 train / 32 val" and len(given.split("val")) == 32
    with pytest.raises(DataError, match="mine has no test split \\(it has train, val\\); use --split train or val"):
        given.split("test")
    held = as_dataset(pair(x, y), val_fraction=0.25, name="mine")   # val held out of train, no test
    assert held.describe_splits() == "72 train / 24 val"
    full = as_dataset(pair(x[:64], y[:64]), val=pair(x[64:80], y[64:80]), test=pair(x[80:], y[80:]), name="mine")
    assert full.describe_splits() == "64 train / 16 val / 16 test" and len(full.split("test")) == 16


def test_classification_asked_of_float_targets_is_refused():
    with pytest.raises(DataError, match="classification needs integer labels"):
        as_dataset([(torch.zeros(8), 0.5)] * 4, task="classification")


# --------------------------------------------------------------------------- the command line
def _plugin(name: str):
    """A module of tests/plugins/, as the CLI's `--data module:function` imports it."""
    sys.path.insert(0, str(PLUGINS))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(PLUGINS))


def _images(tmp_path: Path) -> Path:
    write_folder = _plugin("user_images").write_folder
    folder = tmp_path / "images"
    write_folder(folder / "train", per_class=40, seed=0)
    write_folder(folder / "test", per_class=8, seed=1)
    return folder


def _image_run(folder: Path, run_dir: Path, strategy: str) -> list[str]:
    return ["train", "--model", "mlp", "--model-option", "hidden=[32]", "--data", "user_images:splits",
            "--data-option", f"folder={str(folder)!r}", "--num-workers", "2", "--nproc", "2", "--strategy", strategy,
            "--epochs", "3", "--batch-size", "16", "--lr", "0.003", "--no-progress", "--checkpoint-every", "5",
            "--run-dir", str(run_dir)]


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_png_folder_with_random_crops_through_two_workers_per_rank_resumes_bitwise(tmp_path, strategy):
    folder = _images(tmp_path)
    full = run(_image_run(folder, tmp_path / "full", strategy), tmp_path)
    assert full.returncode == 0, full.stderr[-3000:]
    assert "(108 train / 12 val / 24 test, classification)" in full.stdout   # 120 images, 10 % held out
    assert summary(tmp_path / "full")["target"] is None                    # nothing promised about user data
    kill_slowed_run_after_checkpoint(_image_run(folder, tmp_path / "cut", strategy), tmp_path, tmp_path / "cut",
                                     step=10, delay_s=0.05)
    resumed = run(["train", "--run-dir", str(tmp_path / "cut"), "--resume", "auto", "--nproc", "2"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    keys = ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "optimizer_steps")
    assert [[m[k] for k in keys] for m in metrics(tmp_path / "full")] == \
           [[m[k] for k in keys] for m in metrics(tmp_path / "cut")]
    assert metrics(tmp_path / "full")[-1]["val_accuracy"] >= 0.75


def _form(form: str, tmp_path: Path) -> tuple[list[str], str]:
    """(model and data flags, an autotune knob that applies) for one form a user's data comes in."""
    if form == "png":
        folder = _images(tmp_path)
        return ["--model", "mlp", "--data", "user_images:splits", "--data-option", f"folder={str(folder)!r}"], \
            "num_workers"
    if form == "hf":   # token ids into an embedding: the planners trace integer inputs
        pytest.importorskip("datasets")
        (tmp_path / "reviews.py").write_text(HF_MODULE)
        return ["--model", "reviews:build", "--data", "reviews:splits"], "num_workers"
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 6))
    np.savez(tmp_path / "reg.npz", x=x, y=x @ np.linspace(-1, 1, 6))
    return ["--model", "mlp", "--data", "npz", "--data-dir", "reg.npz"], "threads"


HF_MODULE = """
from hf_reviews import BagOfChars, reviews

def splits():
    return {"train": reviews(200, seed=0)[0], "val": reviews(64, seed=1)[0]}

def build(input_shape, num_classes):
    return BagOfChars(reviews(1, seed=0)[1], num_classes)
"""


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("form", ["png", "hf", "npz"])
def test_plan_memory_and_autotune_take_each_form_of_a_users_data(tmp_path, form):
    """A PNG folder read by Pillow, a Hugging Face text set (token ids) and a float-target .npz (the
    stream: test_a_stream_by_module_and_function_...) through the two planning commands."""
    flags, knob = _form(form, tmp_path)
    planned = run(["plan-memory", *flags, "--batch-size", "32"], tmp_path)
    assert planned.returncode == 0 and "activations traced" in planned.stdout, planned.stderr[-2000:]
    tuned = run(["autotune", *flags, "--batch-size", "32", "--trials", "1", "--steps", "2", "--knobs", knob], tmp_path)
    assert tuned.returncode == 0 and "best:" in tuned.stdout, tuned.stdout[-2000:] + tuned.stderr[-2000:]


USER_MODULE = '''
import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

class Signals(Dataset):
    num_classes = 2
    def __init__(self, n):
        g = torch.Generator().manual_seed(n)
        self.y = torch.randint(0, 2, (n,), generator=g)
        self.x = torch.randn(n, 1, 16, generator=g) + self.y[:, None, None]
    def __len__(self):
        return len(self.y)
    def __getitem__(self, i):
        return {"signal": self.x[i], "label": self.y[i]}

def splits(size=200):
    return {"train": Signals(size), "test": Signals(64)}

class Stream(IterableDataset):
    """The same signals from a generator: no __len__, read in its own order."""
    def __init__(self, n):
        self.signals = Signals(n)
    def __iter__(self):
        return (self.signals[i] for i in range(len(self.signals.y)))

def streams(size=200):
    return {"train": Stream(size), "val": Stream(64)}

def broken():
    raise FileNotFoundError("no such folder: /data/mine")
'''


def _console(*args, cwd):
    """The installed console script, with no PYTHONPATH: what a user types in their own folder."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = shutil.which("scaletrain", path=str(Path(sys.executable).parent))
    return subprocess.run([script, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.mark.usefixtures("processes")
def test_data_by_module_and_function_from_the_working_folder_through_every_kind_of_command(tmp_path):
    (tmp_path / "mine.py").write_text(USER_MODULE)
    trained = _console("train", "--model", "cnn1d", "--data", "mine:splits", "--data-option", "size=320",
                       "--epochs", "2", "--no-progress", "--run-dir", "r", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert "on mine:splits (288 train / 32 val / 64 test, classification)" in trained.stdout
    assert summary(tmp_path / "r")["target"] is None
    # Predictions on the user's test split: in order, the same from 2 replicas as from one; export
    # draws its example input from the same split.
    run_id = summary(tmp_path / "r")["run_id"]
    for nproc, out in (("1", "one.npy"), ("2", "two.npy")):
        predicted = run(["predict", run_id, "--split", "test", "--out", out, "--nproc", nproc], tmp_path)
        assert predicted.returncode == 0, predicted.stderr[-2000:]
    one, two = np.load(tmp_path / "one.npy"), np.load(tmp_path / "two.npy")
    assert one.shape == (64, 2) and np.array_equal(one, two)
    exported = run(["export", run_id], tmp_path)
    assert exported.returncode == 0 and "max |difference| 0 " in exported.stdout, exported.stderr[-2000:]
    # Written into shards (read shard by shard), then streamed from them.
    sharded = run(["shard", "--data", "mine:splits", "--data-option", "size=320", "--out", "shards"], tmp_path)
    assert sharded.returncode == 0, sharded.stderr[-2000:]
    streamed = run(["train", "--model", "cnn1d", "--data", "shards", "--data-dir", "shards", "--epochs", "1",
                    "--no-progress", "--run-dir", "s"], tmp_path)
    assert streamed.returncode == 0 and "(288 train / 32 val / 64 test, classification)" in streamed.stdout, \
        streamed.stderr[-2000:]
    planned = _console("plan-memory", "--model", "cnn1d", "--data", "mine:splits", "--batch-size", "64", cwd=tmp_path)
    assert planned.returncode == 0 and "activations traced" in planned.stdout, planned.stderr[-2000:]
    tuned = run(["autotune", "--model", "cnn1d", "--data", "mine:splits", "--trials", "1", "--steps", "2",
                 "--knobs", "num_workers"], tmp_path)
    assert tuned.returncode == 0 and "best:" in tuned.stdout, tuned.stdout[-2000:] + tuned.stderr[-2000:]


@pytest.mark.usefixtures("processes")
def test_a_stream_by_module_and_function_trains_on_two_ranks_of_two_workers_and_plans(tmp_path):
    (tmp_path / "mine.py").write_text(USER_MODULE)
    trained = run(["train", "--model", "cnn1d", "--data", "mine:streams", "--data-option", "size=320", "--nproc", "2",
                   "--num-workers", "2", "--batch-size", "32", "--epochs", "2", "--no-progress",
                   "--checkpoint-every", "4", "--run-dir", "r"], tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert "on mine:streams (320 train / 64 val, classification)" in trained.stdout   # its val, named so
    assert metrics(tmp_path / "r")[-1]["val_accuracy"] >= 0.8
    # Its batches were seeded per replica: another process count cannot resume them exactly.
    other = run(["train", "--run-dir", "r", "--resume", "auto", "--nproc", "1"], tmp_path)
    assert other.returncode == 2 and "resume with 2 replicas (the same --nproc)" in other.stderr, other.stderr
    planned = run(["plan-memory", "--model", "cnn1d", "--data", "mine:streams", "--batch-size", "64"], tmp_path)
    assert planned.returncode == 0 and "activations traced" in planned.stdout, planned.stderr[-2000:]
    tuned = run(["autotune", "--model", "cnn1d", "--data", "mine:streams", "--trials", "1", "--steps", "2",
                 "--knobs", "num_workers"], tmp_path)
    assert tuned.returncode == 0 and "best:" in tuned.stdout, tuned.stdout[-2000:] + tuned.stderr[-2000:]


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("data, problem", [
    ("nowhere:splits", "cannot import module 'nowhere'"),
    ("mine:absent", "module 'mine' has no function 'absent'"),
    ("mine:broken", "raised FileNotFoundError: no such folder: /data/mine"),
    ("mine:splits --data-option colour=3", "bad --data-option"),
    ("script:splits", "importing 'script' called sys.exit(0); put the module's script code under"),
])
def test_a_data_function_that_cannot_give_data_is_one_line_and_exit_2(tmp_path, data, problem):
    (tmp_path / "mine.py").write_text(USER_MODULE)
    (tmp_path / "script.py").write_text("import sys\n\ndef splits():\n    pass\n\nsys.exit(0)\n")   # a script's exit
    result = run(["train", "--data", *data.split(), "--run-dir", "r"], tmp_path)
    assert result.returncode == 2, result.stderr
    assert problem in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.usefixtures("processes")
def test_a_float_target_npz_trains_as_regression_from_the_command_line(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 6))
    np.savez(tmp_path / "reg.npz", x=x, y=x @ np.linspace(-1, 1, 6))
    result = run(["train", "--data", "npz", "--data-dir", "reg.npz", "--model", "mlp", "--epochs", "4",
                  "--no-progress", "--run-dir", "r"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "regression)" in result.stdout
    assert summary(tmp_path / "r")["target"] is None and metrics(tmp_path / "r")[-1]["val_r2"] > 0.8


# --------------------------------------------------------------------------- Hugging Face datasets
def test_a_hugging_face_dataset_trains_as_dict_batches_map_style_and_streamed(tmp_path):
    pytest.importorskip("datasets")
    hf = _plugin("hf_reviews")
    train, vocab = hf.reviews(480, seed=0)
    val, _ = hf.reviews(96, seed=1)
    torch.manual_seed(0)
    with Trainer(hf.BagOfChars(vocab), _config(tmp_path, epochs=4)) as trainer:
        history = trainer.fit(train, val=val)
        assert trainer.task.name == "classification" and history[-1]["val_accuracy"] >= 0.9
    # The same rows as a Hugging Face stream (it splits itself among workers; the trainer reads it whole).
    torch.manual_seed(0)
    with Trainer(hf.BagOfChars(vocab), _config(tmp_path, epochs=4)) as trainer:
        history = trainer.fit(DataLoader(train.to_iterable_dataset(), batch_size=32, num_workers=2), val=val)
        assert history[-1]["val_accuracy"] >= 0.9


@pytest.mark.usefixtures("processes")
@pytest.mark.timeout(300)
def test_every_command_reads_a_dataloaders_batch_as_the_batch_that_trains(tmp_path, monkeypatch):
    """A DataLoader of 16 under the default --batch-size 128: the run records 16 (what trains and
    what a resume continues, `--resume auto` finding it too), plan-memory plans 16 a device, autotune's trials and best.toml hold
    16, and find-batch-size (which builds its own batches) says what to build the DataLoader with."""
    import tomllib

    from tests.processes import run_here
    monkeypatch.syspath_prepend(str(PLUGINS))
    data = ["--data", "batch_kinds:loaders_of_16", "--model", "batch_kinds:model", "--no-progress"]
    trained = run(["train", *data, "--epochs", "1", "--run-dir", tmp_path / "r"], tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert "global batch 16 = 1 replica(s) x 16; 16 per process: the training DataLoader's batch_size" in trained.stdout
    assert json.loads((tmp_path / "r" / "config.json").read_text())["batch_size"] == 16
    # `--resume auto` with no folder finds such a run though the command names no batch (the run
    # recorded the DataLoader's 16, the command's default is 128).
    first = run(["train", *data, "--epochs", "1", "--checkpoint-every", "5"], tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = run(["train", *data, "--epochs", "2", "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0 and "resuming run" in resumed.stdout, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    planned = run_here(["plan-memory", *data, "--devices", "2", "--strategy", "ddp", "--json"], tmp_path)
    assert planned.returncode == 0, planned.stderr
    assert [(p["batch_size"], p["per_device_batch_size"]) for p in json.loads(planned.stdout)] == [(32, 16)]
    found = run(["find-batch-size", *data, "--memory-limit", "1GB", "--max-batch-size", "16"], tmp_path)
    assert "the training DataLoader's batch_size is 16: build it with batch_size=" in found.stdout, found.stderr[-2000:]
    tuned = run(["autotune", *data, "--trials", "1", "--confirm-rounds", "0", "--steps", "2", "--out", "at"], tmp_path)
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    assert tomllib.loads((tmp_path / "at" / "best.toml").read_text())["batch_size"] == 16
