"""`scaletrain export`: a run's model as a self-contained program for serving, checked against
the trained model before it is kept.

The exported program takes raw samples shaped like the training data and returns the task's
predictions (class probabilities; values for regression): the input normalisation from the
training split and the task's output transform are part of it, so a server needs nothing of
scaletrain. Formats:

    pt2    torch.export's ExportedProgram (`torch.export.load(path).module()(x)`), batch size dynamic
    onnx   through torch.onnx's exporter (dynamo); needs the optional `onnx` extra

The export is in float32 whatever the run trained in (a mixed-precision run's weights are float32
already; a bf16-true run's are widened), so it runs on any device. Before the file is published
(written beside, then renamed), it is loaded back and its predictions on the first test samples
are compared with the trainer's own `predict`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from scaletrain.checkpoint.weights import load_weights
from scaletrain.errors import UserError
from scaletrain.inference.saved import saved_model_path, saved_run_config
from scaletrain.tracking.store import RunRecord
from scaletrain.training import build_training

FORMATS = ("pt2", "onnx")
CHECK_SAMPLES = 64           # test samples the exported program is compared on
TOLERANCE = 1e-4             # largest absolute difference accepted (float32 kernels may differ in order)


@dataclass(frozen=True, slots=True)
class ExportResult:
    path: Path
    fmt: str
    input_shape: tuple[int, ...]      # one sample's
    checked_samples: int
    max_abs_diff: float | None        # None: nothing to run the file with (onnxruntime not installed)


class Served(nn.Module):
    """Raw samples -> the task's predictions: normalise, run the model, transform its outputs."""

    def __init__(self, model: nn.Module, normalizer, task):
        super().__init__()
        self.model, self.task = model, task
        if normalizer.mean is not None:
            self.register_buffer("mean", normalizer.mean.detach().to("cpu", torch.float32).clone())
            self.register_buffer("std", normalizer.std.detach().to("cpu", torch.float32).clone())
        else:
            self.mean = self.std = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mean is not None:
            x = (x.to(torch.float32) - self.mean) / self.std
        return self.task.predictions(self.model(x))


def default_export_path(record: RunRecord, fmt: str) -> Path:
    return saved_model_path(record).with_suffix(f".{fmt}")


def check_export_target(path: Path, fmt: str) -> None:
    """Before anything is built: the format's packages are there and the file may be written,
    and never over an earlier export (a published file is a result)."""
    from scaletrain.lifecycle.paths import check_writable_file
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: unknown; use one of {', '.join(FORMATS)}")
    if fmt == "onnx":
        missing = [name for name in ("onnx", "onnxscript") if not _importable(name)]
        if missing:
            raise UserError(f"--format onnx needs {' and '.join(missing)}: pip install 'scaletrain[onnx]'")
    if path.exists():
        raise UserError(f"--out {path} already exists; pass another --out (an export is never overwritten)")
    check_writable_file(path, "--out")


def _importable(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None


def export_run(record: RunRecord, out: Path, fmt: str = "pt2", data_dir: str | None = None) -> ExportResult:
    check_export_target(out, fmt)
    cfg = saved_run_config(record, device="cpu", data_dir=data_dir)
    cfg.precision.policy, cfg.channels_last = "fp32", False
    with build_training(cfg) as built:
        trainer, dataset = built.trainer, built.dataset
        trainer.adopt(dataset)
        load_weights(trainer.model, saved_model_path(record), f"run {record.id}'s model")
        head = dataset.test.head(CHECK_SAMPLES).x
        if isinstance(head, dict):
            raise UserError(f"export serves a model of one input tensor; run {record.id}'s samples have several "
                            f"named inputs ({', '.join(head)}). Its weights are in {saved_model_path(record)} "
                            "(load them into your model, then use its own export, e.g. transformers' save_pretrained)")
        samples = torch.as_tensor(head)
        expected = trainer.predict(samples)
        served = Served(trainer.model, trainer.normalizer, trainer.task).eval()
        example = samples[:2] if len(samples) >= 2 else samples.repeat(2, *([1] * (samples.dim() - 1)))
        if example.is_floating_point():
            example = example.to(torch.float32)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp.{fmt}")   # torch.export.save wants the .pt2 ending
        try:
            write = _write_pt2 if fmt == "pt2" else _write_onnx
            write(served, example, tmp)
            got = (_run_pt2 if fmt == "pt2" else _run_onnx)(tmp, samples)
            diff = None if got is None else (got - expected).abs().max().item()
            if diff is not None and not diff <= TOLERANCE:
                raise UserError(f"the exported program's predictions differ from the trained model's by {diff:.3g} "
                                f"(> {TOLERANCE:g}); nothing was written. Please report this model.")
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    return ExportResult(out, fmt, tuple(samples.shape[1:]), len(samples), diff)


def _dynamic_batch(example: torch.Tensor):
    return {"x": {0: torch.export.Dim.AUTO}}


def _write_pt2(served: nn.Module, example: torch.Tensor, path: Path) -> None:
    with torch.no_grad():
        program = torch.export.export(served, (example,), dynamic_shapes=_dynamic_batch(example))
    torch.export.save(program, path)


def _run_pt2(path: Path, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.export.load(path).module()(_float_input(x))


def _write_onnx(served: nn.Module, example: torch.Tensor, path: Path) -> None:
    with torch.no_grad():
        program = torch.onnx.export(served, (example,), dynamo=True, dynamic_shapes=_dynamic_batch(example),
                                    verbose=False)
    program.save(str(path))


def _run_onnx(path: Path, x: torch.Tensor) -> torch.Tensor | None:
    if not _importable("onnxruntime"):
        return None
    import onnxruntime
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return torch.from_numpy(session.run(None, {name: _float_input(x).numpy()})[0])


def _float_input(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32) if x.is_floating_point() else x
