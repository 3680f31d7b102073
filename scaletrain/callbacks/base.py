"""Callbacks are duck-typed: the trainer calls only the hooks a callback defines.

Hooks, in loop order: on_train_begin(trainer), on_epoch_begin(trainer, epoch),
on_train_batch_begin(trainer, step), on_train_batch_end(trainer, step, logs) (once per execution
of `steps_per_execution` steps), on_validation_begin(trainer), on_validation_end(trainer, logs),
on_epoch_end(trainer, epoch, logs), on_train_end(trainer, logs). A callback stops training by
setting `trainer.stop_training = True`.
"""

from __future__ import annotations


class CallbackList:
    def __init__(self, callbacks):
        self.callbacks = list(callbacks)
        # Each hook's bound methods, found once: the per-step hooks are called every step, and a
        # run's dozen callbacks asked by name twice a step cost a tiny step 2-3 % (BENCHMARKS.md).
        self._hooks: dict[str, list] = {}

    def call(self, hook: str, *args) -> None:
        fns = self._hooks.get(hook)
        if fns is None:
            fns = self._hooks[hook] = [fn for cb in self.callbacks if (fn := getattr(cb, hook, None)) is not None]
        for fn in fns:
            fn(*args)

    def find(self, cls):
        return next((cb for cb in self.callbacks if isinstance(cb, cls)), None)

    def __iter__(self):
        return iter(self.callbacks)
