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
