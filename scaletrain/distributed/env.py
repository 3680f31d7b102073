"""Where this process sits in the job: rank, world size, restarts, as torchrun (or a cluster
spec) describes it through environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass

from scaletrain.distributed.cluster import cluster_from_env


@dataclass(frozen=True, slots=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    restart_count: int = 0
    run_id: str | None = None      # torchrun's rendezvous id: the same across restarts
    under_elastic: bool = False    # started by torchrun's elastic agent

    @property
    def is_chief(self) -> bool:
        return self.rank == 0



def dist_env(environ=None) -> DistEnv:
    """Reads torchrun's variables; a SCALETRAIN_CLUSTER spec fills them in when torchrun did not."""
    environ = os.environ if environ is None else environ
    if "RANK" not in environ:
        spec = cluster_from_env(environ)
        if spec is not None and not spec.is_evaluator:   # the evaluator is no rank of the job
            environ.update(spec.torch_env())
    return DistEnv(
        rank=int(environ.get("RANK", 0)),
        local_rank=int(environ.get("LOCAL_RANK", 0)),
        world_size=int(environ.get("WORLD_SIZE", 1)),
        restart_count=int(environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
        run_id=environ.get("TORCHELASTIC_RUN_ID"),
        under_elastic="TORCHELASTIC_RUN_ID" in environ,
    )
