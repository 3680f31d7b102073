import gzip
import pickle
import struct

import numpy as np
import pytest
import torch

from scaletrain.config import DataConfig
from scaletrain.data import ArraySplit, DeviceLoader, Normalizer, StreamingLoader, load_dataset
from scaletrain.data.augment import DeviceAugment
from scaletrain.data.idx import download
from scaletrain.errors import DataError


def write_idx(path, array, magic, gz=False, cut=0):
    header = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    raw = header + array.astype(np.uint8).tobytes()
    raw = raw[:len(raw) - cut] if cut else raw
    path.write_bytes(gzip.compress(raw) if gz else raw)


def make_idx_folder(folder, n_train=64, n_test=16, gz=True, **breakage):
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        suffix = ".gz" if gz else ""
        write_idx(folder / f"{prefix}-images-idx3-ubyte{suffix}", rng.integers(0, 256, (n, 28, 28)), 2051, gz)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte{suffix}", rng.integers(0, 10, (n,)), 2049, gz)
    return folder


@pytest.mark.parametrize("gz", [True, False])
def test_idx_folder_loads(tmp_path, gz):
    ds = load_dataset(DataConfig(name="fashion-mnist", data_dir=str(make_idx_folder(tmp_path / "f", gz=gz))))
    # 10 % of the training split is held out for validation (seeded, the same every run).
    assert ds.train.x.shape == (58, 1, 28, 28) and ds.val.x.shape == (6, 1, 28, 28) and ds.train.x.dtype == torch.uint8
    assert ds.test.y.dtype == torch.int64 and len(ds.test) == 16
    # Featurewise statistics come from the training split alone.
    assert ds.mean.item() == pytest.approx(ds.train.x.double().mean().item(), rel=1e-5)


def _load_fashion(folder):
    return load_dataset(DataConfig(name="fashion-mnist", data_dir=str(folder)))


def test_idx_missing_folder_and_file(tmp_path):
    with pytest.raises(DataError, match="data folder not found"):
        _load_fashion(tmp_path / "nowhere")
    folder = make_idx_folder(tmp_path / "f")
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte\[\.gz\]: file not found"):
        _load_fashion(folder)


def test_idx_wrong_magic_names_the_file(tmp_path):
    folder = make_idx_folder(tmp_path / "f")
    write_idx(folder / "train-images-idx3-ubyte.gz", np.zeros((64, 28, 28)), 2049, gz=True)
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte.gz: wrong magic number 2049"):
        _load_fashion(folder)


def test_idx_truncated(tmp_path):
    folder = make_idx_folder(tmp_path / "f", gz=False)
    write_idx(folder / "train-images-idx3-ubyte", np.zeros((64, 28, 28)), 2051, cut=100)
    with pytest.raises(DataError, match="train-images-idx3-ubyte: truncated file"):
        _load_fashion(folder)


def test_idx_label_out_of_range_and_count_mismatch(tmp_path):
    folder = make_idx_folder(tmp_path / "f")
    write_idx(folder / "train-labels-idx1-ubyte.gz", np.full((64,), 12), 2049, gz=True)
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte.gz: label 12 is out of range \[0, 10\)"):
        _load_fashion(folder)
    write_idx(folder / "train-labels-idx1-ubyte.gz", np.zeros((60,)), 2049, gz=True)
    with pytest.raises(DataError, match="60 labels for 64 samples"):
        _load_fashion(folder)


def test_download_verifies_the_checksum_and_keeps_nothing_bad(tmp_path):
    source = make_idx_folder(tmp_path / "src")
    target = tmp_path / "dst"
    with pytest.raises(DataError, match="failed its checksum"):
        download("mnist", target, base_url=source.as_uri() + "/")
    assert not any(target.iterdir())
    with pytest.raises(DataError, match="download of .* failed"):
        download("mnist", target, base_url=(tmp_path / "missing").as_uri() + "/")


def make_cifar_folder(folder, per_batch=20):
    """CIFAR-10's python-batch folder (data_batch_1..5, test_batch) in the real files' form."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(folder / name, "wb") as fh:
            pickle.dump({b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                         b"labels": list(rng.integers(0, 10, per_batch))}, fh)
    return folder


def test_cifar10_batches(tmp_path):
    make_cifar_folder(tmp_path)
    ds = load_dataset(DataConfig(name="cifar10", data_dir=str(tmp_path)))
    assert ds.train.x.shape == (90, 3, 32, 32) and ds.val.x.shape == (10, 3, 32, 32) and ds.mean.shape == (3, 1, 1)
    (tmp_path / "data_batch_3").write_bytes(b"garbage")
    with pytest.raises(DataError, match="data_batch_3: not a readable CIFAR python batch"):
        load_dataset(DataConfig(name="cifar10", data_dir=str(tmp_path)))


def test_npz_files(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, x=np.random.rand(50, 6), y=np.arange(50) % 3)
    ds = load_dataset(DataConfig(name="npz", data_dir=str(path)))
    assert ds.train.x.dtype == torch.float32 and ds.num_classes == 3 and ds.input_shape == (1, 6)
    np.savez(path, x=np.random.rand(50, 6), y=np.arange(40))
    with pytest.raises(DataError, match="40 labels for 50 samples"):
        load_dataset(DataConfig(name="npz", data_dir=str(path)))
    np.savez(path, x=np.random.rand(50, 6), y=np.arange(50) - 1)
    with pytest.raises(DataError, match="label -1 is out of range"):
        load_dataset(DataConfig(name="npz", data_dir=str(path)))
    np.savez(path, features=np.random.rand(5, 2))
    with pytest.raises(DataError, match=r"missing array\(s\) \['x', 'y'\]"):
        load_dataset(DataConfig(name="npz", data_dir=str(path)))
    path.write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not a readable .npz file"):
        load_dataset(DataConfig(name="npz", data_dir=str(path)))


def test_mnist1d_is_float32_with_the_paper_split():
    ds = load_dataset(DataConfig(name="mnist1d"))
    assert (len(ds.train) + len(ds.val), len(ds.val)) == (4000, 400) and ds.test.x.shape == (1000, 1, 40)
    assert ds.train.x.dtype == torch.float32


def test_synthetic_any_shape():
    ds = load_dataset(DataConfig(name="synthetic", shape=[3, 8, 8], num_samples=100, num_classes=7))
    assert ds.train.x.shape == (90, 3, 8, 8) and int(ds.train.y.max()) < 7


def _split(n=100):
    x = torch.arange(n, dtype=torch.float32).view(n, 1, 1).expand(n, 1, 4).contiguous()
    return ArraySplit(x, torch.arange(n))


@pytest.mark.parametrize("cls", [DeviceLoader, StreamingLoader])
def test_loaders_cover_every_sample_once_and_reshuffle_reproducibly(cls):
    norm = Normalizer(torch.zeros(1, 1), torch.ones(1, 1), torch.float32)
    loader = cls(_split(), 10, torch.device("cpu"), norm, shuffle=True, drop_last=True, seed=3)

    def epoch(e):
        loader.set_epoch(e)
        return torch.cat([y for _, y in loader])

    e0, e1, e0_again = epoch(0), epoch(1), epoch(0)
    assert sorted(e0.tolist()) == list(range(100))
    assert not torch.equal(e0, e1) and torch.equal(e0, e0_again)


def test_normalizer_casts_to_the_policy_dtype():
    norm = Normalizer(torch.full((1, 1), 2.0), torch.full((1, 1), 4.0), torch.bfloat16)
    out = norm(torch.full((2, 1, 3), 10, dtype=torch.uint8))
    assert out.dtype == torch.bfloat16 and torch.all(out == 2.0)


def test_device_augment_shifts_and_flips_per_sample():
    g = torch.Generator().manual_seed(0)
    x = torch.zeros(64, 1, 8, 8)
    x[:, :, 4, 4] = 1.0
    out = DeviceAugment(["shift"], 2, g)(x)
    assert out.shape == x.shape
    positions = {tuple((img[0] == 1).nonzero()[0].tolist()) for img in out}
    assert len(positions) > 5 and all(2 <= r <= 6 and 2 <= c <= 6 for r, c in positions)
    seq = torch.arange(6.0).view(1, 1, 6).repeat(32, 1, 1)
    flipped = DeviceAugment(["flip"], 0, g)(seq)
    n_flipped = sum(torch.equal(s[0], torch.arange(5.0, -1, -1)) for s in flipped)
    assert 0 < n_flipped < 32 and all(torch.equal(s[0], seq[0, 0]) or torch.equal(s[0], seq[0, 0].flip(0))
                                      for s in flipped)


def test_validation_is_held_out_of_training_and_never_the_test_split():
    from scaletrain.data.dataset import hold_out_validation, make_dataset
    x = torch.arange(200, dtype=torch.float32).view(100, 1, 2)   # every sample distinct
    y = torch.arange(100) % 3
    base = make_dataset("ids", ArraySplit(x, y), ArraySplit(x[:10] + 1000, y[:10]), num_classes=3)
    ds = hold_out_validation(base, 0.2)
    ids = lambda split: set(split.x[:, 0, 0].tolist())  # noqa: E731
    assert len(ds.val) == 20 and len(ds.train) == 80
    assert not ids(ds.val) & ids(ds.train) and ids(ds.val) | ids(ds.train) == ids(base.train)
    assert ids(ds.test) == ids(base.test)
    assert torch.equal(hold_out_validation(base, 0.2).val.x, ds.val.x)   # the same samples every run
    # Statistics come from what is trained on, not the held-out samples.
    assert ds.mean.item() == pytest.approx(ds.train.x.double().mean().item(), rel=1e-5)
    digits = load_dataset(DataConfig(name="digits", val_fraction=0.25))
    assert len(digits.val) == round(1438 * 0.25) and len(digits.train) + len(digits.val) == 1438


def test_npz_keeps_its_own_validation_split(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "own.npz"
    np.savez(path, x=rng.normal(size=(40, 5)), y=np.arange(40) % 4, x_test=rng.normal(size=(8, 5)),
             y_test=np.arange(8) % 4, x_val=rng.normal(size=(6, 5)), y_val=np.arange(6) % 4)
    ds = load_dataset(DataConfig(name="npz", data_dir=str(path)))
    assert (len(ds.train), len(ds.val), len(ds.test)) == (40, 6, 8)
    np.savez(path, x=rng.normal(size=(40, 5)), y=np.arange(40) % 4, x_val=rng.normal(size=(6, 5)))
    with pytest.raises(DataError, match="x_val and y_val must come together"):
        load_dataset(DataConfig(name="npz", data_dir=str(path)))


def test_a_quoted_home_in_the_data_dir_is_expanded(tmp_path, monkeypatch):
    """'~/shards/train-{0000..0031}.tar' is quoted so the shell keeps its braces: the ~ reaches us."""
    monkeypatch.setenv("HOME", str(tmp_path))
    np.savez(tmp_path / "d.npz", x=np.random.rand(50, 6), y=np.arange(50) % 3)
    assert load_dataset(DataConfig(name="npz", data_dir="~/d.npz")).input_shape == (1, 6)
    from scaletrain.data.registry import sample_shape
    assert sample_shape(DataConfig(name="npz", data_dir="~/d.npz"))[0] == (1, 6)
