"""Models: plain nn.Modules by name from a registry (each file registers its own builders)."""

from scaletrain.models.builder import MODEL_BUILDERS, register_model
from scaletrain.models.registry import build_model, model_names

__all__ = ["MODEL_BUILDERS", "build_model", "model_names", "register_model"]
