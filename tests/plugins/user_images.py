"""A user's own image data, as a practitioner holds it: a folder of PNG files (one sub-folder per
class) read with Pillow by a torch Dataset, with a random crop and flip per training sample. The
real CLI loads it as `--data user_images:splits --data-option folder=DIR` (tests put this folder on
PYTHONPATH); `write_folder` makes the files."""

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

SIZE = 12


def write_folder(folder: Path, per_class: int, seed: int, classes: int = 3) -> Path:
    """PNG images whose class is a colour: class k has a bright channel k, with noise."""
    rng = np.random.default_rng(seed)
    for k in range(classes):
        (folder / str(k)).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 120, (SIZE, SIZE, 3))
            pixels[..., k] += 120
            Image.fromarray(pixels.astype(np.uint8)).save(folder / str(k) / f"{i:04d}.png")
    return folder


class PngFolder(Dataset):
    def __init__(self, folder, crop: int, train: bool):
        self.files = sorted(Path(folder).glob("*/*.png"))
        self.classes = sorted({p.parent.name for p in self.files})
        self.labels = [self.classes.index(p.parent.name) for p in self.files]
        self.crop, self.train = crop, train

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        with Image.open(self.files[i]) as image:
            x = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 255).permute(2, 0, 1)
        if self.train:   # a random crop and flip: drawn from torch's global generator, as transforms do
            top, left = torch.randint(0, SIZE - self.crop + 1, (2,)).tolist()
            x = x[:, top:top + self.crop, left:left + self.crop]
            if torch.rand(()) < 0.5:
                x = x.flip(-1)
        else:
            start = (SIZE - self.crop) // 2
            x = x[:, start:start + self.crop, start:start + self.crop]
        return x, self.labels[i]


def splits(folder: str, crop: int = 10):
    return {"train": PngFolder(Path(folder) / "train", crop, train=True),
            "test": PngFolder(Path(folder) / "test", crop, train=False)}
