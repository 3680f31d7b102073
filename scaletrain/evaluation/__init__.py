"""Evaluation beside training: a sidecar that evaluates a run's checkpoints as they are committed."""

from typing import TYPE_CHECKING

from scaletrain.lazy import lazy_exports

_EXPORTS = {
    "SidecarEvaluator": "scaletrain.evaluation.sidecar",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from scaletrain.evaluation.sidecar import SidecarEvaluator
