"""A user's data set whose reads hang inside the loader workers (a network read that never
returns): the real CLI loads it as `--data hung_stream:splits --num-workers 2` (tests put this
folder on PYTHONPATH). In this process (the class count reads every target) it reads; in a worker,
the first `reads` samples come, then every read blocks forever. Where HUNG_STREAM_MARKS names a
folder, a worker writes a file there (hung-PID) as it hangs, so a test waits for the hang itself."""

import os
import time

import torch
from torch.utils.data import Dataset, get_worker_info


class HangingReads(Dataset):
    def __init__(self, n: int, reads: int):
        self.n, self.reads, self.done = n, reads, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if get_worker_info() is not None:
            self.done += 1
            if self.done > self.reads:
                marks = os.environ.get("HUNG_STREAM_MARKS")
                if marks:
                    open(os.path.join(marks, f"hung-{os.getpid()}"), "w").close()
                time.sleep(3600)          # hung: no exception, no data, no end
        x = torch.randn(8, generator=torch.Generator().manual_seed(i))
        return x, int(x.sum() > 0)


def splits(n: int = 4096, reads: int = 300):
    return {"train": HangingReads(n, reads), "val": HangingReads(64, 10**9), "test": HangingReads(64, 10**9)}
