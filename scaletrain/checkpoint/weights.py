"""A saved model's weights (a run's `model.pt`: a plain state dict) read without executing code,
and put into a model with every key and shape checked first.

`--init-from`, `ensemble` and `export` all read weights through here, so a corrupt file, a file
that is not a state dict and a model of another shape give the same one-line errors everywhere.
"""

from __future__ import annotations

import warnings
import zipfile
from pathlib import Path

import torch
from torch import nn

from scaletrain.errors import UserError


def weights_flag(path: str | Path) -> str:
    """How an error names the weights a configuration starts from (`model.init_from`): a run's own
    model.pt by its run folder (predict, export and ensemble read one without the user naming a
    flag), any other file as the flag that names it."""
    path = Path(path)
    if path.name == "model.pt" and (path.parent / "run.json").is_file():
        return f"the saved model of run folder {path.parent}:"
    return "--init-from"


def read_weights(path: str | Path, flag: str = "the weights file") -> dict[str, torch.Tensor]:
    """The state dict saved at `path`, on the host. `weights_only=True`: tensors and plain
    containers only, so a crafted file cannot run code on load."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{flag} {path}: no such file; pass a model.pt written by a run")
    if not zipfile.is_zipfile(path):   # torch.save's format; a raw pickle is never handed to an unpickler
        raise UserError(f"{flag} {path} is not a whole file of torch.save's (cut short, a raw pickle, or another "
                        "format); nothing in it was run: pass a model.pt written by a run")
    try:
        with warnings.catch_warnings():   # torch's warnings about the file's protocol: the error below says it
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:   # the restricted unpickler fails on a damaged file in many ways (KeyError, ...)
        detail = (str(exc).splitlines() or [""])[0][:100]
        raise UserError(f"{flag} {path} cannot be read as saved weights ({type(exc).__name__}: {detail}); "
                        "pass a model.pt written by a run") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise UserError(f"{flag} {path} holds a {type(state).__name__}, not a model's state dict (names to "
                        "tensors); pass a model.pt written by a run")
    return state


def load_weights(model: nn.Module, path: str | Path, flag: str = "the weights file") -> None:
    """Fills `model` in place from the state dict at `path`, after checking that every name and
    shape matches (`check_fits`)."""
    state = read_weights(path, flag)
    check_fits(model, state, path, flag)
    model.load_state_dict(state)


def check_fits(model: nn.Module, state: dict[str, torch.Tensor], path: str | Path, flag: str) -> None:
    """Raises UserError naming the first name or shape of `state` that `model` (real or on the
    meta device: only shapes are read) does not have, with the fix."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        parts = ([f"missing {len(missing)} (e.g. {missing[0]})"] if missing else []) + \
                ([f"{len(unexpected)} the model lacks (e.g. {unexpected[0]})"] if unexpected else [])
        raise UserError(f"{flag} {path} does not fit the model: its names differ ({'; '.join(parts)}); "
                        "use the --model and --model-option values the weights were trained with")
    for key, tensor in own.items():
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise UserError(f"{flag} {path} does not fit the model: {key} is {tuple(state[key].shape)} there, "
                            f"{tuple(tensor.shape)} here; use the --model, --model-option and data the weights "
                            "were trained with")
