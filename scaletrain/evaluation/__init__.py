"""Evaluation beside training: a sidecar that evaluates a run's checkpoints as they are committed."""

from scaletrain.evaluation.sidecar import SidecarEvaluator

__all__ = ["SidecarEvaluator"]
