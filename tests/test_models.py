import pytest
import torch

from scaletrain.errors import ConfigError
from scaletrain.models import build_model


@pytest.mark.parametrize("name,shape,options", [
    ("cnn1d", (1, 40), {}),
    ("mlp", (1, 8, 8), {"hidden": [32, 32]}),
    ("resnet", (3, 32, 32), {}),
    ("resnet-18", (3, 32, 32), {}),
    ("wrn-10-2", (1, 28, 28), {}),
    ("vit-tiny", (3, 32, 32), {"depth": 2}),
])
def test_models_forward_and_backward(name, shape, options):
    model = build_model(name, shape, 10, **options)
    out = model(torch.randn(4, *shape))
    assert out.shape == (4, 10)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_wrn_16_10_is_the_labs_model():
    """Seed 003: WideResNet-16-10 on 28x28x1, about ten million parameters (千万级)."""
    with torch.device("meta"):
        model = build_model("wrn-16-10", (1, 28, 28), 10)
    n = sum(p.numel() for p in model.parameters())
    assert 10e6 < n < 20e6
    widths = [m.out_channels for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert widths[0] == 16 and max(widths) == 640


def test_vit_1_3b_matches_seed_004_size():
    with torch.device("meta"):
        model = build_model("vit-1.3b", (3, 224, 224), 1000)
    n = sum(p.numel() for p in model.parameters())
    assert 1.2e9 < n < 1.4e9


def test_unknown_model_and_bad_options():
    with pytest.raises(ConfigError, match="unknown model 'alexnet'"):
        build_model("alexnet", (3, 32, 32), 10)
    with pytest.raises(ConfigError, match="bad model.options"):
        build_model("mlp", (1, 8, 8), 10, widths=[3])
    with pytest.raises(ConfigError, match="depth must be 6n\\+4"):
        build_model("wrn-15-2", (1, 28, 28), 10)


BUILDER = '''
import torch
from torch import nn

def build(input_shape, num_classes):
    with open("calls.txt", "a") as calls:
        calls.write("built\\n")
    width = int(torch.tensor(input_shape).prod().item())         # a size computed with a tensor
    net = nn.Sequential(nn.Flatten(), nn.Linear(width, 32), nn.ReLU(), nn.Linear(32, num_classes))
    with torch.no_grad():                                          # a shape checked by running it
        assert net(torch.zeros(2, *input_shape)).shape == (2, num_classes)
    return net
'''


@pytest.mark.usefixtures("processes")
def test_a_builder_that_computes_with_tensors_trains_from_the_cli_and_the_api(tmp_path, monkeypatch):
    """The meta build (models/structure.py) is an optimisation: a builder the meta device cannot
    run ("Tensor.item() cannot be called on meta tensors") is built for real instead."""
    from tests.processes import DIGITS_MLP, run
    (tmp_path / "computing.py").write_text(BUILDER)
    done = run(["train", "--model", "computing:build", *DIGITS_MLP[4:], "--epochs", "1", "--run-dir", "r"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "r" / "model.pt").exists()
    # An ordinary builder runs twice a run: once on the meta device (every check reads that
    # structure), once for real.
    (tmp_path / "plain.py").write_text(BUILDER.replace("int(torch.tensor(input_shape).prod().item())",
                                                       "math.prod(input_shape)").replace("import torch", "import math, torch"))
    (tmp_path / "calls.txt").unlink()
    done = run(["train", "--model", "plain:build", *DIGITS_MLP[4:], "--epochs", "1", "--run-dir", "p"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "calls.txt").read_text().count("built") == 2
    # Through the Python API's door for a configuration.
    from scaletrain.config import DataConfig, ModelConfig, TrainConfig
    from scaletrain.training.build import build_training
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = TrainConfig(model=ModelConfig(name="computing:build"), data=DataConfig(name="digits"), epochs=1,
                      progress=False)
    cfg.tracking.record = False
    with build_training(cfg) as built:
        built.trainer.fit(built.dataset)
        assert built.trainer.history[-1]["train_loss"] > 0
