"""Models: plain nn.Modules by name from a registry (each file registers its own builders)."""

from typing import TYPE_CHECKING

from scaletrain.lazy import lazy_exports

_EXPORTS = {
    "MODEL_BUILDERS": "scaletrain.models.registry",
    "build_model": "scaletrain.models.registry",
    "model_names": "scaletrain.models.names",
    "register_model": "scaletrain.models.builder",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from scaletrain.models.builder import register_model
    from scaletrain.models.names import model_names
    from scaletrain.models.registry import MODEL_BUILDERS, build_model
