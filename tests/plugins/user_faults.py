"""A user's code that fails in each way a user's code can, loaded by the real CLI (tests put this
folder on PYTHONPATH): data sets whose reads raise or lie, data functions that break the
contract, tasks and a LightningModule that raise (tests/test_user_errors.py)."""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, IterableDataset

from scaletrain.tasks import Task


def _sample(i: int):
    x = torch.randn(8, generator=torch.Generator().manual_seed(i))
    return x, int(x[:3].argmax())


class RaisingReads(Dataset):
    """Sample `bad` raises, as a decoder meeting a damaged file would. With its classes stated the
    first read of every sample is the training's (else the class count reads them first)."""

    def __init__(self, n: int, bad: int, stated: bool = True):
        self.n, self.bad = n, bad
        self.num_classes = 3 if stated else None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f"cannot decode record {i}")
        return _sample(i)


class LyingLength(Dataset):
    """Says it holds `said` samples and holds `held`."""

    num_classes = 3

    def __init__(self, said: int, held: int):
        self.said, self.samples = said, [_sample(i) for i in range(held)]

    def __len__(self):
        return self.said

    def __getitem__(self, i):
        return self.samples[i]


class RaisingStream(IterableDataset):
    num_classes = 3

    def __init__(self, n: int, bad: int):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __iter__(self):
        for i in range(self.n):
            if i == self.bad:
                raise ConnectionError(f"the stream's server went away at record {i}")
            yield _sample(i)


def raising_reads(n=512, bad=300, stated=True):
    return {"train": RaisingReads(n, bad, stated), "val": RaisingReads(64, -1)}


def lying_length(said=512, held=400):
    return {"train": LyingLength(said, held), "val": LyingLength(64, 64)}


def raising_stream(n=512, bad=300):
    return {"train": RaisingStream(n, bad), "val": RaisingStream(64, -1)}


def returns_none():
    return None


def object_array():
    x = np.empty(64, dtype=object)
    x[:] = [np.zeros(8)] * 64
    return {"train": (x, np.zeros(64, dtype=np.int64))}


def raising_function():
    raise FileNotFoundError("no such folder: /data/mine")


class WrongSums(Task):
    """eval_sums returns 3 sums where n_sums says 2."""
    metrics = {"loss": False}
    n_sums = 2

    def loss(self, output, target):
        return F.cross_entropy(output.float(), target)

    def eval_sums(self, output, target):
        return torch.stack([F.cross_entropy(output.float(), target, reduction="sum").double(),
                            torch.tensor(float(len(target)), dtype=torch.float64, device=target.device),
                            torch.zeros((), dtype=torch.float64, device=target.device)])

    def eval_metrics(self, sums):
        return {"loss": sums[0] / max(sums[1], 1)}


class RaisingInit(WrongSums):
    def __init__(self):
        raise KeyError("threshold")


try:
    import lightning as L
except ImportError:   # the lightning extra is optional: the test of this class is skipped without it
    L = None

if L is not None:
    class LitRaising(L.LightningModule):
        """A LightningModule whose 4th training_step raises."""

        def __init__(self):
            super().__init__()
            self.net, self.calls = nn.Linear(8, 3), 0

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            self.calls += 1
            if self.calls == 4:
                raise RuntimeError("the loss went the wrong way on purpose")
            x, y = batch
            return F.cross_entropy(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", F.cross_entropy(self(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)


def lit_raising(input_shape=None, num_classes=None):
    """The same module from a builder function (adapted as its class would be)."""
    return LitRaising()


# ---- the red team's fifth pass (issue 91): each once a traceback, now one line

class NegativeLength(RaisingReads):
    def __len__(self):
        return -3


def negative_length():
    return {"train": NegativeLength(8, -1), "val": RaisingReads(64, -1)}


class DyingReads(RaisingReads):
    """Its worker process ends at sample `bad`: exits with code 3, or is killed (SIGKILL)."""

    def __init__(self, n: int, bad: int, kill: bool):
        super().__init__(n, bad)
        self.kill = kill

    def __getitem__(self, i):
        if i == self.bad and torch.utils.data.get_worker_info() is not None:
            import os
            import signal
            os.kill(os.getpid(), signal.SIGKILL) if self.kill else os._exit(3)
        return _sample(i)


def dying_reads(kill=False):
    return {"train": torch.utils.data.DataLoader(DyingReads(512, 300, kill), batch_size=32, num_workers=2),
            "val": RaisingReads(64, -1)}


def own_collate_raising():
    def collate(samples):
        raise ValueError("my collate cannot pad these")
    return {"train": torch.utils.data.DataLoader(RaisingReads(512, -1), batch_size=32, collate_fn=collate),
            "val": RaisingReads(64, -1)}


def wrong_width(input_shape, num_classes):
    """torch's layers only: no frame of the user's when the first one meets the data's 8 features."""
    return nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, num_classes))


def outputs(input_shape, num_classes, width=2):
    """`width` outputs whatever the classes (the data has 3)."""
    return nn.Sequential(nn.Linear(input_shape[-1], 16), nn.ReLU(), nn.Linear(16, width))


class NeedsArgument(WrongSums):
    def __init__(self, weight):
        super().__init__()
