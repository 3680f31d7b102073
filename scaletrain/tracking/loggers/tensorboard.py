"""TensorBoard: each epoch's scalars as event files, at the optimizer step, for teams whose
dashboards read them (in <run folder>/tensorboard, or the job's AIP_TENSORBOARD_LOG_DIR)."""

from __future__ import annotations

from pathlib import Path


class TensorBoardLogger:
    name = "tensorboard"

    def __init__(self):
        self.writer = None

    def start(self, info) -> None:
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(log_dir=str(info.log_dir or info.run_dir / "tensorboard"))
        self.writer.add_text("config", "\n".join(f"    {k} = {v}" for k, v in sorted(info.params.items())))

    def log_epoch(self, step: int, epoch: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.add_scalar("epoch", epoch, global_step=step)
        self.writer.flush()

    def finish(self, status: str, summary: dict | None, files: list[Path]) -> None:
        self.writer.close()
