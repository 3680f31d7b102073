"""Where this process sits in a job that a cluster manager started, read from the variables the
manager sets (the first found wins):

- SCALETRAIN_CLUSTER, or TF_CONFIG as TensorFlow users already write it (seed 002), the same shape:

    {"cluster": {"chief": ["host0:port"], "worker": ["host1:port", "host2:port"]},
     "task": {"type": "worker", "index": 0}}

  Tasks are ordered chief first, then workers, as MultiWorkerMirroredStrategy orders them; a
  task's position in that order is its rank, the first address is the rendezvous (c10d store)
  address. An `evaluator` task (TensorFlow's name) is not part of the training job: it holds no
  rank and joins no collective; `scaletrain train` run as the evaluator becomes the sidecar
  evaluator of the run in --run-dir (evaluation/sidecar.py). `ps` tasks are parameter servers
  (--strategy ps): they take the last ranks, which is where that strategy puts its servers; any
  other task type is an error rather than a silently ignored task.
- Slurm's job step (`srun`): SLURM_PROCID is the rank among SLURM_STEP_NUM_TASKS tasks, laid over
  SLURM_STEP_NODELIST by SLURM_STEP_TASKS_PER_NODE; the step's first node is the rendezvous, on
  MASTER_PORT or a port derived from SLURM_JOB_ID. Each task is one process, or, under --nproc,
  one host's launcher (one task per node). A batch script's own shell (no `srun`) has no step
  variables and is no job.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from scaletrain.errors import ConfigError

ENV_VAR = "SCALETRAIN_CLUSTER"
TF_CONFIG = "TF_CONFIG"
SPEC_VARS = (ENV_VAR, TF_CONFIG)     # read in this order
ROLES = ("chief", "worker", "ps")      # the training job's tasks, in rank order (servers last)
SIDE_ROLES = ("evaluator",)            # tasks beside the job: no rank, no collectives


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    addresses: tuple[str, ...]   # every training task's host:port, in rank order
    rank: int                    # -1 for a task beside the job (the evaluator)
    role: str = "worker"
    servers: int = 0             # the cluster's ps tasks
    source: str = ENV_VAR        # the variable(s) it was read from, for messages
    local_rank: int = 0          # this task's place among the tasks of its host
    local_world_size: int = 1

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
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(self.local_rank),
                "LOCAL_WORLD_SIZE": str(self.local_world_size), "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": str(self.master_port)}


def parse_cluster_spec(text: str, source: str = ENV_VAR) -> ClusterSpec:   # noqa: C901 - one check per TF_CONFIG field; flat
    def _fail(problem: str) -> ConfigError:
        return ConfigError(f"{source} {problem}; expected e.g. '{{\"cluster\": {{\"worker\": [\"host0:12345\", "
                           f"\"host1:12345\"]}}, \"task\": {{\"type\": \"worker\", \"index\": 0}}}}'")

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
    for role in ("chief", *SIDE_ROLES):     # TensorFlow's rule: at most one of each
        if len(cluster.get(role, [])) > 1:
            raise _fail(f"lists {len(cluster[role])} {role} tasks; a cluster has at most one {role}")
    seen: set[str] = set()
    for address in addresses + [h for role in SIDE_ROLES for h in cluster.get(role, [])]:
        if address in seen:
            raise _fail(f"lists address '{address}' twice; each task listens on its own host:port")
        seen.add(address)
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
        return ClusterSpec(addresses=tuple(addresses), rank=-1, role=role, servers=servers, source=source)
    return ClusterSpec(addresses=tuple(addresses), rank=offsets[role] + index, role=role, servers=servers,
                       source=source)


def cluster_problem(spec: ClusterSpec | None, servers: int, nproc: int) -> str | None:
    """A cluster's ps tasks and the layout's servers (`Layout.servers` of the configuration) must
    agree (one line, with the fix)."""
    if spec is not None and nproc > 1 and spec.local_world_size > 1:
        return (f"{spec.source} runs {spec.local_world_size} tasks on this node, and --nproc {nproc} would start "
                f"{nproc} processes for each: with --nproc, run one task per node (srun --ntasks-per-node 1), "
                "or drop --nproc to run one process per task")
    if spec is None or spec.is_evaluator or spec.servers == servers and not (servers and nproc != 1):
        return None
    if not servers:
        return (f"{spec.source} lists {spec.servers} ps task(s); train with parameter servers (--strategy ps --num-ps "
                f"{spec.servers}), or drop the ps tasks")
    return (f"{spec.source} lists {spec.servers} ps task(s): run every task with --strategy ps --num-ps "
            f"{spec.servers} --nproc 1 (the configuration lays out {servers} server(s) on --nproc {nproc})")


def cluster_from_env(environ=os.environ) -> ClusterSpec | None:
    for name in SPEC_VARS:
        if environ.get(name):
            return parse_cluster_spec(environ[name], name)
    return slurm_step(environ)


SLURM_STEP_VARS = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")


def slurm_step(environ=os.environ) -> ClusterSpec | None:
    """This task of an `srun` job step with more than one task, as a cluster of its tasks (rank
    order: node by node, as Slurm's block distribution numbers them); None outside one."""
    if "SLURM_STEP_NUM_TASKS" not in environ:
        return None
    missing = [name for name in SLURM_STEP_VARS if not environ.get(name)]
    source = "Slurm's job step (" + ", ".join(SLURM_STEP_VARS) + ")"
    if missing:
        raise ConfigError(f"{source}: {', '.join(missing)} not set; start each task with srun")
    def number(name: str, default: str | None = None) -> int:
        text = environ.get(name, default)
        if not text.isdigit():
            raise ConfigError(f"{name}={text!r} is not a whole number (Slurm sets it to one); unset it, or start "
                              "each task with srun")
        return int(text)

    tasks, rank, local_rank = number("SLURM_STEP_NUM_TASKS"), number("SLURM_PROCID"), number("SLURM_LOCALID", "0")
    job_id = number("SLURM_JOB_ID", "0")
    try:
        per_node = expand_tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"])
        # No more host names than the step has tasks: a malformed or hostile range such as
        # node[0-999999999] stops at that count, not after a billion names.
        nodes = expand_hostlist(environ["SLURM_STEP_NODELIST"], limit=max(tasks, 1))
    except ValueError as exc:
        raise ConfigError(f"{source} cannot be read: {exc}") from None
    if tasks <= 1:
        return None
    if len(per_node) != len(nodes) or sum(per_node) != tasks or not 0 <= rank < tasks:
        raise ConfigError(f"{source} disagree: {tasks} task(s), rank {rank}, nodes {nodes}, tasks per node {per_node}")
    node_of_rank = [i for i, count in enumerate(per_node) for _ in range(count)]
    if local_rank >= per_node[node_of_rank[rank]]:
        raise ConfigError(f"SLURM_LOCALID {local_rank} is not below the {per_node[node_of_rank[rank]]} task(s) of "
                          f"rank {rank}'s node ({source})")
    port = environ.get("MASTER_PORT") or str(15000 + job_id % 20000)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"MASTER_PORT {port!r} is not a port number (1-65535)")
    addresses = tuple(f"{node}:{port}" for node, count in zip(nodes, per_node, strict=True) for _ in range(count))
    return ClusterSpec(addresses=addresses, rank=rank, source=source, local_rank=local_rank,
                       local_world_size=per_node[node_of_rank[rank]])


HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.\-]*[A-Za-z0-9])?")   # RFC 1123 labels, dotted


def expand_hostlist(text: str, limit: int = 65536) -> list[str]:
    """Slurm's compact host list, e.g. "gpu[01-03,07],login" -> gpu01 gpu02 gpu03 gpu07 login
    (zero padding kept; what `scontrol show hostnames` prints), read strictly: brackets closed,
    ranges ascending numbers, names of letters, digits, dots and hyphens, at most `limit` names
    (the work is bounded by the text and the limit, never by the numbers in a range)."""
    hosts: list[str] = []
    depth, start = 0, 0
    items = []
    for i, char in enumerate(text + ","):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"host list {text!r} nests brackets")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"host list {text!r} closes a bracket it did not open")
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"host list {text!r} leaves a bracket open")
    for item in items:
        if not item:
            raise ValueError(f"host list {text!r} has an empty name")
        hosts.extend(_expand_host(item, text, limit - len(hosts)))
    return hosts


def _expand_host(item: str, text: str, room: int) -> list[str]:
    match = re.match(r"([^\[]*)\[([^\]]*)\](.*)$", item)
    if not match:
        if not HOST_NAME.fullmatch(item):
            raise ValueError(f"host list {text!r} names {item!r}, not a host name")
        if room < 1:
            raise ValueError(f"host list {text!r} names more hosts than the step has tasks")
        return [item]
    prefix, ranges, rest = match.groups()
    out: list[str] = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()) or (high and int(high) < int(low)):
            raise ValueError(f"host range [{ranges}] is not ascending numbers (e.g. [01-04,07])")
        for number in range(int(low), int(high or low) + 1):
            if len(out) >= room:
                raise ValueError(f"host list {text!r} names more hosts than the step has tasks")
            out.extend(_expand_host(prefix + str(number).zfill(len(low)) + rest, text, room - len(out)))
    return out


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's tasks per node, e.g. "2(x3),1" -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise ValueError(f"tasks per node {text!r} is not N or N(xM) items")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts
