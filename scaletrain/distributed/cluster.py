"""SCALETRAIN_CLUSTER: a TF_CONFIG-shaped cluster spec for users coming from TensorFlow.

    {"cluster": {"chief": ["host0:port"], "worker": ["host1:port", "host2:port"]},
     "task": {"type": "worker", "index": 0}}

Tasks are ordered chief first, then workers, as MultiWorkerMirroredStrategy orders them; a task's
position in that order is its rank, the first address is the rendezvous (c10d store) address.
An `evaluator` task (TensorFlow's name) is not part of the training job: it holds no rank and
joins no collective; `scaletrain train` run as the evaluator becomes the sidecar evaluator of the
run in --run-dir (evaluation/sidecar.py). `ps` tasks are parameter servers (--strategy ps): they
take the last ranks, which is where that strategy puts its servers; any other task type is an
error rather than a silently ignored task.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from scaletrain.errors import ConfigError

ENV_VAR = "SCALETRAIN_CLUSTER"
ROLES = ("chief", "worker", "ps")      # the training job's tasks, in rank order (servers last)
SIDE_ROLES = ("evaluator",)            # tasks beside the job: no rank, no collectives


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    addresses: tuple[str, ...]   # every training task's host:port, in rank order
    rank: int                    # -1 for a task beside the job (the evaluator)
    role: str = "worker"
    servers: int = 0             # the cluster's ps tasks

    @property
    def is_evaluator(self) -> bool:
        return self.role == "evaluator"

    @property
    def world_size(self) -> int:
        return len(self.addresses)

    @property
    def master_addr(self) -> str:
        return self.addresses[0].rsplit(":", 1)[0]

    @property
    def master_port(self) -> int:
        return int(self.addresses[0].rsplit(":", 1)[1])

    def torch_env(self) -> dict[str, str]:
        """The environment variables torch.distributed's env:// initialisation reads."""
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}


def _fail(problem: str) -> ConfigError:
    return ConfigError(f"{ENV_VAR} {problem}; expected e.g. "
                       '{"cluster": {"worker": ["host0:12345", "host1:12345"]}, "task": {"type": "worker", "index": 0}}')


def parse_cluster_spec(text: str) -> ClusterSpec:
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    if not isinstance(spec, dict):
        raise _fail("must be a JSON object")
    for key in ("cluster", "task"):
        if not isinstance(spec.get(key), dict):
            raise _fail(f"has no '{key}' object")
    cluster, task = spec["cluster"], spec["task"]
    unsupported = sorted(set(cluster) - set(ROLES) - set(SIDE_ROLES))
    if unsupported:
        raise _fail(f"names task type(s) {unsupported} that scaletrain does not use (chief, worker, ps, evaluator)")
    addresses: list[str] = []
    offsets: dict[str, int] = {}
    for role in SIDE_ROLES:
        if role in cluster and (not isinstance(cluster[role], list)
                                or not all(isinstance(h, str) for h in cluster[role])):
            raise _fail(f"cluster.{role} must be a list of \"host:port\" strings")
    for role in ROLES:
        hosts = cluster.get(role, [])
        if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
            raise _fail(f"cluster.{role} must be a list of \"host:port\" strings")
        offsets[role] = len(addresses)
        addresses.extend(hosts)
    if not addresses:
        raise _fail("lists no tasks in cluster.worker")
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise _fail(f"has address '{address}' that is not host:port")
    for key in ("type", "index"):
        if key not in task:
            raise _fail(f"has no task.{key}")
    role, index = task["type"], task["index"]
    if role not in cluster:
        raise _fail(f"has task.type '{role}' that is not a task type of its cluster ({', '.join(cluster)})")
    if not isinstance(index, int) or isinstance(index, bool):
        raise _fail(f"has task.index {index!r} that is not an integer")
    if not 0 <= index < len(cluster[role]):
        raise _fail(f"has task.index {index} out of range: cluster.{role} has {len(cluster[role])} task(s)")
    servers = len(cluster.get("ps", []))
    if servers and len(addresses) == servers:
        raise _fail("lists only ps tasks; parameter servers need at least one chief or worker")
    if role in SIDE_ROLES:
        return ClusterSpec(addresses=tuple(addresses), rank=-1, role=role, servers=servers)
    return ClusterSpec(addresses=tuple(addresses), rank=offsets[role] + index, role=role, servers=servers)


def cluster_problem(spec: ClusterSpec | None, servers: int, nproc: int) -> str | None:
    """A cluster's ps tasks and the layout's servers (`Layout.servers` of the configuration) must
    agree (one line, with the fix)."""
    if spec is None or spec.is_evaluator or spec.servers == servers and not (servers and nproc != 1):
        return None
    if not servers:
        return (f"{ENV_VAR} lists {spec.servers} ps task(s); train with parameter servers (--strategy ps --num-ps "
                f"{spec.servers}), or drop the ps tasks")
    return (f"{ENV_VAR} lists {spec.servers} ps task(s): run every task with --strategy ps --num-ps "
            f"{spec.servers} --nproc 1 (the configuration lays out {servers} server(s) on --nproc {nproc})")


def cluster_from_env(environ=os.environ) -> ClusterSpec | None:
    text = environ.get(ENV_VAR)
    return parse_cluster_spec(text) if text else None
