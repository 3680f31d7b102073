"""TensorBoard interop: per-epoch scalars as event files, for teams whose dashboards read them.
Optional: needs the `tensorboard` package (`pip install 'scaletrain[tensorboard]'`)."""

from __future__ import annotations

from pathlib import Path

from scaletrain.errors import UserError
from scaletrain.tracking.recorder import plain_metrics


class TensorBoardLogger:
    def __init__(self, log_dir: str | Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError("--tensorboard needs the tensorboard package: pip install 'scaletrain[tensorboard]'") from None
        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def on_epoch_end(self, trainer, epoch: int, logs: dict) -> None:
        for key, value in plain_metrics(logs).items():
            if isinstance(value, float):
                self.writer.add_scalar(key, value, global_step=epoch + 1)
        self.writer.flush()

    def on_train_end(self, trainer, logs: dict) -> None:
        self.writer.close()
