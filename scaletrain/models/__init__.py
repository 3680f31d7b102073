"""Models: plain nn.Modules by name from a registry."""

from scaletrain.models.registry import MODEL_NAMES, build_model

__all__ = ["MODEL_NAMES", "build_model"]
