import os

import pytest
import torch

# In-process runs keep one thread count whatever the machine's load: a run that names none chooses
# from the load (training/threads.py), and two runs of one test compared bit for bit must compute
# with the same count. That count is the worker's share of the cores under pytest-xdist (the root
# conftest.py sets it before the workers start), else torch's own (one per core).
# tests/test_defaults.py tests the choice itself.
os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))

from scaletrain.config import DataConfig, ModelConfig, OptimConfig, PrecisionConfig, TrainConfig
from scaletrain.data import load_dataset


@pytest.fixture(scope="session")
def digits():
    return load_dataset(DataConfig(name="digits"))


def small_config(tmp_path, **overrides) -> TrainConfig:
    """A quick MLP-on-digits configuration; keyword overrides set top-level fields."""
    cfg = TrainConfig(
        model=ModelConfig(name="mlp", options={"hidden": [64]}),
        data=DataConfig(name="digits"),
        optim=OptimConfig(optimizer="adamw", lr=3e-3),
        precision=PrecisionConfig(policy="fp32"),
        epochs=3, batch_size=64, progress=False, run_dir=str(tmp_path / "run"), device="cpu",
    )
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


@pytest.fixture(scope="session", autouse=True)
def _one_data_cache_per_session(tmp_path_factory):
    """Generated data sets are cached (data/cache.py) in one folder for the whole session, shared
    with every CLI process a test starts: the suite generates MNIST-1D once, and never writes to
    the user's own cache (the rest of the user's cache folder is each test's own: _work_in_tmp_path)."""
    import os

    from scaletrain.data.cache import CACHE_ENV
    names = {CACHE_ENV: "data-cache"}
    before = {name: os.environ.get(name) for name in names}
    for name, folder in names.items():
        os.environ[name] = str(tmp_path_factory.mktemp(folder))
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _restore_matmul_precision():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


@pytest.fixture(autouse=True)
def _work_in_tmp_path(tmp_path, tmp_path_factory, monkeypatch):
    """Every test runs in its own folder, so the run store and run folders a training creates by
    default (./scaletrain-runs) never land in the repository, and with a user cache folder of its
    own: a probe decision another test's run kept must not change what this test's run chooses."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("user-cache")))   # (beside tmp_path: tests list it)
