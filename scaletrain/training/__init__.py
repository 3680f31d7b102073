"""The training loop: the Trainer, its step, device counters, clock and warm-up snapshot, and
`build_training`, which wires a whole run from its config."""

from typing import TYPE_CHECKING

from scaletrain.lazy import lazy_exports

_EXPORTS = {
    "TrainingParts": "scaletrain.training.build",
    "Trainer": "scaletrain.training.trainer",
    "build_training": "scaletrain.training.build",
    "resolve_device": "scaletrain.training.trainer",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from scaletrain.training.build import TrainingParts, build_training
    from scaletrain.training.trainer import Trainer, resolve_device
