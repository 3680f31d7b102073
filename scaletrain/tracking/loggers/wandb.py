"""Weights & Biases: the run as a W&B run (id = the scaletrain run id, so a resume continues it),
in the project WANDB_PROJECT (default "scaletrain"), grouped by the run's group. Offline, writing
into <run folder>/wandb for a later `wandb sync`, when WANDB_MODE says so or no API key is set
(WANDB_API_KEY or a netrc entry); W&B's own console capture is off, so scaletrain's output is
unchanged."""

from __future__ import annotations

import netrc
import os
from pathlib import Path


def has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode() -> str:
    return os.environ.get("WANDB_MODE") or ("online" if has_api_key() else "offline")


class WandbLogger:
    name = "wandb"

    def __init__(self):
        self.run = None

    def start(self, info) -> None:
        import wandb
        settings = wandb.Settings(console="off", silent=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "scaletrain"), group=info.group,
                              name=info.name, id=info.run_id, resume="allow", config=info.params,
                              tags=[f"{k}:{v}" for k, v in sorted(info.tags.items())][:64],
                              dir=str(info.run_dir), mode=wandb_mode(), settings=settings)

    def log_epoch(self, step: int, epoch: int, metrics: dict[str, float]) -> None:
        self.run.log({**metrics, "epoch": epoch}, step=step)

    def finish(self, status: str, summary: dict | None, files: list[Path]) -> None:
        if summary:
            self.run.summary.update({f"summary/{k}": v for k, v in summary.items()
                                     if isinstance(v, (int, float, str, bool)) and v is not None})
        for path in files:
            self.run.save(str(path), base_path=str(Path(path).parent), policy="now")
        self.run.finish(exit_code=0 if status == "finished" else 1)
