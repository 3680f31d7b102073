"""Streamed shards: the writer, which process reads what, exact resume, damaged shards (real files,
real DataLoader worker processes, a real torchrun)."""

from __future__ import annotations

import io
import json
import re
import shutil

import numpy as np
import pytest
import torch
import webdataset

from scaletrain.config import DataConfig
from scaletrain.data import ArraySplit, Dataset, Normalizer, load_dataset, make_dataset
from scaletrain.data.shards import Manifest, ShardLoader, load_shards, write_shards
from scaletrain.data.shards.reader import read_split
from scaletrain.errors import DataError
from scaletrain.evaluation.sidecar import read_evaluations
from tests.processes import DIGITS_MLP, kill_slowed_run_after_checkpoint, metrics, run, summary

pytestmark = pytest.mark.timeout(300)


def _numbered(n: int, test: int = 16) -> Dataset:
    """Samples whose single feature is their own index: what a loader yields names the sample."""
    x = torch.arange(n + test, dtype=torch.float32).reshape(-1, 1, 1)
    y = torch.arange(n + test) % 3
    return make_dataset("numbered", ArraySplit(x[:n], y[:n]), ArraySplit(x[n:], y[n:]), 3)


def _epoch(loader, epoch: int, start: int = 0) -> list[list[int]]:
    loader.set_epoch(epoch, start)
    return [x.flatten().long().tolist() for x, _ in loader]


def _loaders(folder, world: int, workers: int, batch: int = 16, pattern: str | None = None):
    ds = load_shards(pattern or str(folder))
    return [ShardLoader(ds.train, batch, torch.device("cpu"), Normalizer(None, None, torch.float32), shuffle=True,
                        drop_last=True, seed=3, rank=r, world_size=world, num_workers=workers, prefetch=2,
                        shuffle_buffer=40) for r in range(world)]


@pytest.mark.usefixtures("processes")
def test_shard_command_round_trips_every_split_with_checksums(tmp_path):
    out = tmp_path / "digits"
    result = run(["shard", "--data", "digits", "--out", str(out), "--samples-per-shard", "200"], tmp_path)
    assert result.returncode == 0, result.stderr
    manifest = Manifest.read(out)
    original = load_dataset(DataConfig(name="digits"))
    for name in ("train", "val", "test"):
        split = getattr(original, name)
        assert sum(s.samples for s in manifest.split(name)) == len(split)
        assert max(s.samples for s in manifest.split(name)) <= 200
        back = read_split(manifest, name)
        assert torch.equal(back.x, split.x) and torch.equal(back.y, split.y)
    assert manifest.statistics()[0].item() == pytest.approx(original.mean.item())
    # The shards are WebDataset's: its own reader reads the same samples.
    first = manifest.split("train")[0]
    theirs = list(webdataset.WebDataset(str(out / first.name), shardshuffle=False, empty_check=False))
    assert len(theirs) == first.samples and theirs[0]["__key__"] == "000000000"
    assert torch.equal(torch.from_numpy(np.load(io.BytesIO(theirs[0]["x.npy"]))), original.train.x[0])
    # A finished output is never overwritten or merged into.
    again = run(["shard", "--data", "digits", "--out", str(out)], tmp_path)
    assert again.returncode == 2 and "already holds files" in again.stderr and "Traceback" not in again.stderr
    zero = run(["shard", "--data", "digits", "--out", str(tmp_path / "z"), "--samples-per-shard", "0"], tmp_path)
    assert zero.returncode == 2 and "--samples-per-shard must be >= 1" in zero.stderr


@pytest.mark.parametrize("shards,world", [(8, 2), (7, 2)])
def test_ranks_and_workers_read_distinct_samples_equal_steps_and_resume_exactly(tmp_path, shards, world):
    write_shards(_numbered(shards * 48), tmp_path, samples_per_shard=48)
    loaders = _loaders(tmp_path, world=world, workers=2)
    assert len({len(loader) for loader in loaders}) == 1           # every rank runs the same steps
    steps = len(loaders[0])
    epochs = [[_epoch(loader, e) for loader in loaders] for e in (0, 1)]
    for per_rank in epochs:
        assert all(len(batches) == steps for batches in per_rank)
        seen = [i for batches in per_rank for batch in batches for i in batch]
        assert len(seen) == len(set(seen))                           # no sample twice in an epoch
        if shards % (world * 2) == 0:
            assert sorted(seen) == list(range(shards * 48))          # and every one once
    assert epochs[0] != epochs[1]                                    # reshuffled per epoch
    # A resume at any step yields exactly the rest of the epoch, on every rank.
    for start in (1, 5, steps - 1):
        for rank, loader in enumerate(loaders):
            assert _epoch(loader, 1, start) == epochs[1][rank][start:]


@pytest.mark.usefixtures("processes")
def test_streamed_run_killed_mid_epoch_resumes_bitwise(tmp_path):
    write = run(["shard", "--data", "digits", "--out", str(tmp_path / "s"), "--samples-per-shard", "160"], tmp_path)
    assert write.returncode == 0, write.stderr

    def args(name):
        return ["train", *DIGITS_MLP, "--data", "shards", "--data-dir", str(tmp_path / "s"), "--num-workers", "2",
                "--model-option", "dropout=0.1", "--epochs", "2", "--batch-size", "64", "--checkpoint-every", "7",
                "--run-dir", str(tmp_path / name)]
    full = run(args("full"), tmp_path)
    assert full.returncode == 0, full.stderr
    # Step 21 is mid epoch 1: 9 shards of 143-144 samples; worker 0 reads 5 (11 batches of 64),
    # worker 1 reads 4 (9 batches), 20 steps an epoch.
    kill_slowed_run_after_checkpoint(args("cut"), tmp_path, tmp_path / "cut", step=21, delay_s=0.05)
    resumed = run(["train", "--run-dir", str(tmp_path / "cut"), "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout
    keys = ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "optimizer_steps")
    assert [m["optimizer_steps"] for m in metrics(tmp_path / "full")] == [20, 40]
    assert [[m[k] for k in keys] for m in metrics(tmp_path / "full")] == \
           [[m[k] for k in keys] for m in metrics(tmp_path / "cut")]
    a, b = (torch.load(tmp_path / n / "model.pt", weights_only=True) for n in ("full", "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert summary(tmp_path / "full")["data_wait_s"] > 0


@pytest.mark.usefixtures("processes")
def test_two_ranks_with_two_workers_each_train_on_eight_shards(tmp_path):
    write_shards(load_dataset(DataConfig(name="digits")), tmp_path / "s", samples_per_shard=162)
    assert len(Manifest.read(tmp_path / "s").split("train")) == 8
    result = run(["train", *DIGITS_MLP, "--data", "shards", "--data-dir", str(tmp_path / "s"), "--num-workers", "2",
                  "--epochs", "2", "--batch-size", "32", "--nproc", "2", "--checkpoint-every", "40",
                  "--run-dir", str(tmp_path / "r")], tmp_path)
    assert result.returncode == 0, result.stderr
    # 8 shards of 161-162 samples: 2 workers x 2 shards per rank, 20 batches of 16 per worker.
    assert [m["optimizer_steps"] for m in metrics(tmp_path / "r")] == [40, 80]
    assert metrics(tmp_path / "r")[-1]["val_accuracy"] > 0.8
    # The sidecar evaluator reads the two ranks' checkpoints on one process: the loop's numbers.
    evaluated = run(["evaluate", "--watch", str(tmp_path / "r"), "--once"], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    for e, m in zip(read_evaluations(tmp_path / "r"), metrics(tmp_path / "r"), strict=True):
        assert e["epoch"] == m["epoch"] and e["val_accuracy"] == m["val_accuracy"]
        assert e["val_loss"] == pytest.approx(m["val_loss"], rel=1e-6)


@pytest.mark.usefixtures("processes")
def test_damaged_missing_and_mismatched_shards_are_named(tmp_path):
    write_shards(_numbered(4 * 48), tmp_path / "s", samples_per_shard=48)
    folder = tmp_path / "s"

    def train(data_dir, *extra):
        return run(["train", "--model", "mlp", "--data", "shards", "--data-dir", data_dir, "--no-progress",
                    "--epochs", "1", "--batch-size", "16", "--run-dir", str(tmp_path / "r"), *extra], tmp_path)

    # --train-subset N takes the fewest leading shards holding N samples.
    assert [s.name for s in load_shards(str(folder), train_subset=100).train.shards] == \
           ["train-0000.tar", "train-0001.tar", "train-0002.tar"]
    # A corrupt byte, same size: found by the checksum as the shard is read; training stops.
    shard = folder / "train-0002.tar"
    data = bytearray(shard.read_bytes())
    data[700] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match="train-0002.tar does not match its SHA-256"):
        for _ in _loaders(folder, world=1, workers=0)[0]:
            pass
    result = train(str(folder))
    assert result.returncode == 2 and "train-0002.tar" in result.stderr and "Traceback" not in result.stderr
    # Where steps ran before the bad shard came (shards are read in a shuffled order) the folder
    # stays and says the run failed; where every shard is bad no step runs, and no folder is left
    # from a run that never trained.
    assert not (tmp_path / "r").exists() or \
        json.loads((tmp_path / "r" / "run.json").read_text())["status"] == "failed"
    first = tmp_path / "first-bad"
    shutil.copytree(folder, first)
    for other in first.glob("train-*.tar"):
        damaged = bytearray(other.read_bytes())
        damaged[700] ^= 0xFF
        other.write_bytes(bytes(damaged))
    result = run(["train", "--model", "mlp", "--data", "shards", "--data-dir", str(first), "--no-progress",
                  "--epochs", "1", "--batch-size", "16", "--run-dir", str(tmp_path / "r0")], tmp_path)
    assert result.returncode == 2 and "does not match its SHA-256" in result.stderr, result.stderr
    assert not (tmp_path / "r0").exists()
    # A damaged member header: the shard is named, nothing is guessed.
    data[700] ^= 0xFF
    data[1024 + 257] = ord("X")
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match="train-0002.tar cannot be read as a shard tar"):
        for _ in _loaders(folder, world=1, workers=0)[0]:
            pass
    # Truncated: named before any training.
    shard.write_bytes(bytes(data[:4096]))
    result = train(str(folder))
    assert result.returncode == 2 and "train-0002.tar has 4096 bytes" in result.stderr
    # A pattern naming shards the manifest does not list; no manifest; fewer shards than ranks.
    result = train(str(folder / "train-{0003..0005}.tar"))
    assert result.returncode == 2 and "train-0004.tar is not a training shard" in result.stderr
    result = train(str(tmp_path))
    assert result.returncode == 2 and "holds no manifest.json" in result.stderr
    with pytest.raises(DataError, match="1 training shard.*cannot feed 2 ranks"):
        _loaders(folder, world=2, workers=1, pattern=str(folder / "train-0000.tar"))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["shards"] = [s for s in manifest["shards"] if s["split"] != "train"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    result = train(str(folder))
    assert result.returncode == 2 and "lists no training shards" in result.stderr


@pytest.mark.usefixtures("processes")
def test_a_damaged_array_header_names_its_shard_and_leaves_no_folder(tmp_path):
    """An array's .npy header altered in every training shard, the manifest's size and checksum
    rewritten to match (so only the header gives it away): the line names a shard and the sample,
    and a run that never stepped leaves no folder (issue 66: it named the folder, and left one)."""
    import hashlib
    write_shards(_numbered(2 * 48), tmp_path / "s", samples_per_shard=48)
    folder = tmp_path / "s"
    manifest = json.loads((folder / "manifest.json").read_text())
    for entry in manifest["shards"]:
        shard = folder / entry["name"]
        data = bytearray(shard.read_bytes())
        at = data.index(b"\x93NUMPY") + 20        # inside the first array's header text
        data[at] = ord("?")
        shard.write_bytes(bytes(data))
        entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    result = run(["train", "--model", "mlp", "--data", "shards", "--data-dir", str(folder), "--no-progress",
                  "--epochs", "1", "--batch-size", "16", "--run-dir", str(tmp_path / "r")], tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert re.search(r"shard \S+-000\d\.tar cannot be read as a shard tar \(sample \S+'s x\.npy is not a float32",
                     result.stderr), result.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("field, value, problem", [
    ("x_dtype", "object", "x_dtype must be one of"),
    ("y_dtype", "<U8", "y_dtype must be one of"),
    ("sample_shape", [1, -40], "sample_shape must be a list of sizes of at least 1"),
    ("sample_shape", [], "sample_shape must be a list of sizes"),
    ("num_classes", 0, "num_classes must be a whole number of at least 1"),
    ("num_classes", "3", "num_classes must be a whole number"),
    ("task", "poetry", "task must be one of"),
    ("mean", [float("nan")], "mean must be 1 finite numbers"),
    ("std", [0.0], "std must be positive"),
    ("extra", 1, "unknown fields ['extra']"),
    ("shard name", "../outside.tar", "is not a file inside the folder"),
    ("shard name", "/etc/passwd", "is not a file inside the folder"),
    ("shard split", "holdout", "split must be one of"),
    ("shard samples", -1, "samples and bytes must be whole numbers"),
    ("shard sha256", "abc", "sha256 must be 64 hexadecimal digits"),
])
def test_a_manifest_is_read_through_its_schema(tmp_path, field, value, problem):
    write_shards(_numbered(48), tmp_path / "s", samples_per_shard=48)
    path = tmp_path / "s" / "manifest.json"
    manifest = json.loads(path.read_text())
    if field.startswith("shard "):
        manifest["shards"][0][field.split()[1]] = value
    else:
        manifest[field] = value
    path.write_text(json.dumps(manifest))
    with pytest.raises(DataError) as caught:
        Manifest.read(tmp_path / "s")
    assert str(path) in str(caught.value) and problem in str(caught.value)


@pytest.mark.usefixtures("processes")
def test_labels_beyond_the_manifests_classes_and_a_missing_folder_are_one_line(tmp_path):
    write_shards(_numbered(96), tmp_path / "s", samples_per_shard=48)        # labels 0, 1, 2
    path = tmp_path / "s" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["num_classes"] = 2
    path.write_text(json.dumps(manifest))
    common = ["train", "--model", "mlp", "--data", "shards", "--no-progress", "--epochs", "1", "--batch-size", "16",
              "--run-dir", str(tmp_path / "r")]
    result = run([*common, "--data-dir", str(tmp_path / "s")], tmp_path)
    assert result.returncode == 2, result.stderr
    assert "has the label 2, outside the manifest's 2 classes" in result.stderr and "Traceback" not in result.stderr
    result = run([*common, "--data-dir", "does-not-exist"], tmp_path)
    assert result.returncode == 2 and "--data-dir does-not-exist: no such folder" in result.stderr
