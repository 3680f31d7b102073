"""The Trainer's forward-only side: the task's metrics over a split (`evaluate`, each validation
pass) and its predictions (`predict`), on one device or as one replica of many.

A mixin of the Trainer (training/trainer.py), whose state it reads: the model and its evaluation
forward, the task, policy, strategy and layout, the normaliser, the clock and callbacks, and the
pad input the warm-up took (a replica without samples still runs its forwards)."""

from __future__ import annotations

from itertools import islice

import numpy as np
import torch

from scaletrain.data import Dataset, as_features
from scaletrain.distributed.shapes import agreed_shape
from scaletrain.errors import ConfigError
from scaletrain.inputs import Inputs, map_inputs
from scaletrain.tasks import checked_sums


class Evaluating:
    @torch.no_grad()
    def evaluate_loader(self, loader, max_batches: int | None = None, reduce: bool = True,
                        report: bool = True) -> dict:
        """The task's metrics over a loader (`val_loss`, `val_accuracy`, ...), summed on the device
        and read once; under data parallelism each rank holds its own range and the sums are
        all-reduced, so every sample counts exactly once. Not timed as training: the training
        clock is stopped meanwhile. `report`: a validation pass (callbacks hear of it, its time
        counts as evaluation time)."""
        if report:
            self.callbacks.call("on_validation_begin", self)
        start = self.clock.now()
        was_training = self.model.training
        self.model.eval()
        sums = torch.zeros(self.task.n_sums, dtype=torch.float64, device=self.device)
        counts = self.layout.records   # each replica's outputs are counted by one process
        for output, y in self.strategy.evaluate(islice(loader, max_batches), self._eval_forward, self._pad_input):
            if counts:
                sums += checked_sums(self.task.eval_sums(output, y), self.task)
            self.end_execution()
        self.model.train(was_training)
        if reduce and self.strategy.world_size > 1:
            self.strategy.all_reduce_sum_(sums)
        logs = {f"val_{k}": v for k, v in self.task.eval_metrics(sums.tolist()).items()}
        elapsed = self.clock.now() - start
        if max_batches is None and report:
            self.eval_time_s += elapsed
            logs["eval_time_s"] = elapsed
        if report:
            self.callbacks.call("on_validation_end", self, logs)
        return logs

    def _eval_forward(self, x: Inputs):
        with self.policy.autocast(self.device):
            return self.task.forward(self.eval_forward, x)

    def evaluate(self, dataset, split: str = "test") -> dict:
        """The task's metrics (`loss`, `accuracy`, ...) of the current model on a split of `dataset`,
        or on the whole of a split as users hold it (a torch Dataset, a DataLoader, arrays)."""
        if not isinstance(dataset, Dataset):
            from scaletrain.data.user import as_dataset
            dataset = as_dataset(dataset, val=dataset, test=dataset, task=self.config.task, count_classes=False)
        self.adopt(dataset)
        logs = self.evaluate_loader(self.loader(dataset.split(split), train=False))
        return {k[4:]: v for k, v in logs.items() if k.startswith("val_")}

    # --------------------------------------------------------------- predict
    @torch.no_grad()
    def predict(self, x, batch_size: int | None = None) -> torch.Tensor:
        """The task's predictions (class probabilities; values for regression), float32 on the
        host, for raw samples shaped like the training data. NumPy float64 input is converted to
        float32 explicitly. Under data parallelism each replica predicts its own contiguous range
        of `x` (the ranges evaluation uses) and every process returns the whole result, equal to
        one device's."""
        if self.normalizer is None:
            raise ConfigError("predict() needs the training statistics: call fit() or evaluate() first")
        if not isinstance(x, (torch.Tensor, np.ndarray, list)):
            return self._predict_split(x)
        x = torch.as_tensor(np.asarray(x)) if not isinstance(x, torch.Tensor) else x
        if self.normalizer.mean is None and not x.is_floating_point():   # token ids: indices, not features
            x = x.long()
        else:
            x = as_features(np.asarray(x) if not isinstance(x, torch.Tensor) else x, "predict input")
        batch_size = batch_size or self.config.data.val_batch_size or self.config.batch_size
        normalizer = self.normalizer.to(self.device)
        start, end = self.layout.evaluation_range(len(x))
        self.model.eval()
        chunks = ((normalizer(chunk.to(self.device)), None) for chunk in x[start:end].split(batch_size))
        pad = normalizer(x[:1].to(self.device)) if len(x) else None   # forwards a share without samples still runs
        return self._predictions(chunks, pad, start, len(x))

    def _predict_split(self, data) -> torch.Tensor:
        """Predictions for a split (ours, a torch Dataset, a DataLoader), read in order as evaluation
        reads it: each replica its own range, assembled in every process."""
        from scaletrain.data.user import as_split
        split = as_split(data, "predict input")
        start, end = self.layout.evaluation_range(len(split))
        self.model.eval()
        # A sample to pad with: a replica whose share has no samples still runs the forwards.
        pad = self.normalizer.to(self.device)(map_inputs(lambda t: t.to(self.device), split.head(1).x))
        return self._predictions(self.loader(split, train=False, predict=True), pad, start, len(split))

    def _predictions(self, batches, pad: Inputs, start: int, samples: int) -> torch.Tensor:
        """This replica's predictions over its range (`start` onwards), then every replica's in
        every process: each process that records puts its range into zeros and one sum all-reduce
        adds them up (exact: every element is one value plus zeros). The per-sample shape comes
        from the processes that have one."""
        out = [self.task.predictions(output) for output, _ in self.strategy.evaluate(batches, self._eval_forward, pad)]
        mine = torch.cat(out) if out and self.layout.records else None
        if self.strategy.world_size == 1:
            return mine.cpu() if mine is not None else torch.empty(0)
        dims = agreed_shape(mine.shape[1:] if mine is not None else None, self.strategy.all_reduce_max_, self.device)
        whole = torch.zeros(samples, *dims, dtype=torch.float32, device=self.device)
        if mine is not None:
            whole[start:start + len(mine)] = mine.float()
        return self.strategy.all_reduce_sum_(whole).cpu()
