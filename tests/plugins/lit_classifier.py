"""A LightningModule and LightningDataModule written as Lightning's docs write them, with no
scaletrain in sight (tests/test_lightning.py trains them through scaletrain and through
Lightning's own Trainer; docs/lightning.md shows the same)."""

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class LitClassifier(L.LightningModule):
    def __init__(self, features: int = 16, classes: int = 4, hidden: int = 64, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean())

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        return {"optimizer": optimizer,
                "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)}


class LitAdam(LitClassifier):
    """AdamW with torch's default decay on every parameter, and no scheduler."""

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def samples(n=1200, features=16, classes=4, seed=0):
    """Points labelled by which of `classes` random directions they lie closest to."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x @ torch.randn(features, classes, generator=g)).argmax(dim=1)
    return x, y


class Blobs(L.LightningDataModule):
    def __init__(self, n: int = 1200, batch_size: int = 64):
        super().__init__()
        self.n, self.batch_size = n, batch_size

    def setup(self, stage):
        x, y = samples(self.n)
        cut = self.n * 3 // 4
        self.train_set, self.val_set = TensorDataset(x[:cut], y[:cut]), TensorDataset(x[cut:], y[cut:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)


# ---- modules scaletrain refuses, each in one line
class Manual(LitClassifier):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False


class TwoOptimizers(LitClassifier):
    def configure_optimizers(self):
        return [torch.optim.SGD(self.net[0].parameters(), lr=0.1), torch.optim.SGD(self.net[2].parameters(), lr=0.1)]


class EpochHook(LitClassifier):
    def on_train_epoch_end(self):
        pass


class Scheduled(LitClassifier):
    """SGD under the scheduler `kind`, stepped every `frequency` `interval`s (Lightning's
    configuration dict), for the schedules Lightning users write."""

    def __init__(self, kind: str = "onecycle", interval: str = "step", frequency: int = 1):
        super().__init__()
        self.kind, self.interval, self.frequency = kind, interval, frequency

    def configure_optimizers(self):
        from torch.optim import lr_scheduler as s
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        steps = int(self.trainer.estimated_stepping_batches // (max(self.frequency, 1) if self.interval == "step" else 1))
        epochs = self.trainer.max_epochs
        make = {
            "onecycle": lambda: s.OneCycleLR(optimizer, max_lr=0.2, total_steps=int(steps) + 1, cycle_momentum=False),
            "cosine": lambda: s.CosineAnnealingLR(optimizer, T_max=epochs if self.interval == "epoch" else steps,
                                                  eta_min=0.001),
            "lambda": lambda: s.LambdaLR(optimizer, lambda n: 0.97 ** n),
            "warmup-cosine": lambda: s.SequentialLR(optimizer, [
                s.LinearLR(optimizer, start_factor=0.1, total_iters=3),
                s.CosineAnnealingLR(optimizer, T_max=max(int(steps) - 3, 1))], milestones=[3]),
        }
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": make[self.kind](), "interval": self.interval,
                                 "frequency": self.frequency}}


class CycledMomentum(LitClassifier):
    """SGD under a OneCycleLR as users write it: it cycles the momentum too (cycle_momentum=True)."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return [optimizer], [{"scheduler": torch.optim.lr_scheduler.OneCycleLR(optimizer, 0.2, total_steps=8),
                              "interval": "step"}]


class CycledAdam(LitClassifier):
    """AdamW under a OneCycleLR as users write it: it cycles Adam's first beta."""

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.01)
        return [optimizer], [{"scheduler": torch.optim.lr_scheduler.OneCycleLR(optimizer, 0.05, total_steps=8),
                              "interval": "step"}]


class OnPlateau(LitClassifier):
    """SGD whose LR halves when val_loss stops improving (patience 0: at once), as Lightning's docs
    configure a ReduceLROnPlateau."""

    def __init__(self, lr: float = 0.5, frequency: int = 1):
        super().__init__(lr=lr)
        self.frequency = frequency

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0, threshold=0.01)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss", "frequency": self.frequency}}


class PlateauOnNothing(OnPlateau):
    def configure_optimizers(self):
        config = super().configure_optimizers()
        config["lr_scheduler"]["monitor"] = "val_f1"
        return config


class OneCycleTooShort(LitClassifier):
    """A OneCycleLR sized for 5 steps: the run takes more (Lightning stops at torch's ValueError)."""

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        cycle = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=5, cycle_momentum=False)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": cycle, "interval": "step"}}
