"""The generated-data cache (data/cache.py): a second start reads what the first generated, a
damaged entry is rebuilt and never trusted, a change of generator or parameters is a new entry."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from processes import cli_env

from scaletrain.data.cache import CACHE_ENV, cached_tensors

# Loads MNIST-1D as a run does and prints whether the generator ran, and a fingerprint of the data.
LOAD = """
import sys
from scaletrain.config import DataConfig
from scaletrain.data import load_dataset
ds = load_dataset(DataConfig(name="mnist1d"))
print("GENERATED" if "mnist1d" in sys.modules else "CACHED", float(ds.train.x.sum()), int(ds.test.y.sum()), len(ds.val))
"""


@pytest.mark.usefixtures("processes")
def test_a_second_start_reads_mnist1d_from_the_cache(tmp_path):
    env = cli_env(**{CACHE_ENV: str(tmp_path / "cache")})
    runs = [subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, env=env, timeout=120)
            for _ in range(2)]
    first, second = (r.stdout.split() for r in runs)
    assert first[0] == "GENERATED" and second[0] == "CACHED", [r.stderr for r in runs]
    assert first[1:] == second[1:]                         # the same data, split the same way
    assert len(list((tmp_path / "cache").glob("mnist1d-*.npz"))) == 1


class Counting:
    """A real build that counts how often it ran."""

    def __init__(self, offset: float = 0.0):
        self.calls, self.offset = 0, offset

    def __call__(self) -> dict[str, torch.Tensor]:
        self.calls += 1
        return {"x": torch.arange(12, dtype=torch.float32).reshape(3, 4) + self.offset, "y": torch.tensor([0, 1, 2])}


def _entry(folder, suffix):
    (path,) = folder.glob(f"gen-*{suffix}")
    return path


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "empty", "no commit", "commit garbled",
                                    "commit names a missing array", "arrays of another entry"])
def test_a_damaged_entry_is_rebuilt_never_trusted(tmp_path, monkeypatch, damage):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    build = Counting()
    good = cached_tensors("gen", "1", {"n": 3}, build)
    arrays, commit = _entry(tmp_path, ".npz"), _entry(tmp_path, ".json")
    payload = arrays.read_bytes()
    if damage == "flip a byte":
        arrays.write_bytes(payload[:100] + bytes([payload[100] ^ 0xFF]) + payload[101:])
    elif damage == "truncate":
        arrays.write_bytes(payload[: len(payload) // 2])
    elif damage == "empty":
        arrays.write_bytes(b"")
    elif damage == "no commit":
        commit.unlink()
    elif damage == "commit garbled":
        commit.write_text("{not json")
    elif damage == "commit names a missing array":
        commit.write_text(commit.read_text().replace('"y"', '"z"'))
    else:       # a well-formed file that is not this entry's: only the digest tells
        other = tmp_path / "other"
        monkeypatch.setenv(CACHE_ENV, str(other))
        cached_tensors("gen", "1", {"n": 3}, Counting(offset=100.0))
        arrays.write_bytes(_entry(other, ".npz").read_bytes())
        monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    again = cached_tensors("gen", "1", {"n": 3}, build)
    assert build.calls == 2                                  # rebuilt, not read
    assert all(torch.equal(good[k], again[k]) for k in good)
    cached_tensors("gen", "1", {"n": 3}, build)
    assert build.calls == 2                                  # and the repaired entry is read again


def test_generator_version_and_parameters_address_the_entry(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    build = Counting()
    for version, params in [("1", {"n": 3}), ("1", {"n": 3}), ("2", {"n": 3}), ("1", {"n": 4})]:
        cached_tensors("gen", version, params, build)
    assert build.calls == 3 and len(list(tmp_path.glob("gen-*.npz"))) == 3


def test_a_cache_that_cannot_be_written_or_is_off_costs_only_the_cache(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for setting in (str(blocker / "cache"), "off"):
        monkeypatch.setenv(CACHE_ENV, setting)
        build = Counting()
        first, second = (cached_tensors("gen", "1", {}, build) for _ in range(2))
        assert build.calls == 2 and torch.equal(first["x"], second["x"])
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]
