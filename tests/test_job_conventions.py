"""Where users already launch: Slurm's job step variables, TF_CONFIG (tests/test_parameter_server.py
runs seed 002's cluster through it), cloud job folders (SageMaker, Vertex AI), and the thread
flags. Real processes wherever a launch is claimed; no Slurm daemons here: the tasks get the
variables `srun` sets (see the closing note of issue 27)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from scaletrain.config import TrainConfig
from scaletrain.distributed.cluster import (
    cluster_from_env,
    cluster_problem,
    expand_hostlist,
    expand_tasks_per_node,
    slurm_step,
)
from scaletrain.errors import ConfigError, Terminated
from scaletrain.lifecycle import stops
from scaletrain.lifecycle.job_folders import apply_job_folders, job_folders
from tests.processes import DIGITS_MLP, cli_env, free_port, outputs_of, run, run_here, start, wait_for

QUICK = [*DIGITS_MLP, "--epochs", "1", "--batch-size", "64"]



def _step(rank: int, tasks: int = 2, nodes: str = "localhost", per_node: str = "2", **extra) -> dict:
    """What srun sets for one task of a step (the variables this reads, and a few it does not)."""
    return {"SLURM_JOB_ID": "4242", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0",
            "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_STEP_NODELIST": nodes, "SLURM_STEP_TASKS_PER_NODE": per_node,
            "SLURM_NTASKS": str(tasks), "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "localhost", **extra}


def test_slurm_host_lists_and_task_counts_expand_as_scontrol_does():
    assert expand_hostlist("gpu[01-03,07],login") == ["gpu01", "gpu02", "gpu03", "gpu07", "login"]
    assert expand_hostlist("n[8-10]") == ["n8", "n9", "n10"]
    assert expand_hostlist("rack[1-2]-n[1-2]") == ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(ValueError, match="not ascending numbers"):
        expand_hostlist("n[a-b]")


_STEP = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
_TF_BAD = {
    "two chiefs": {"cluster": {"chief": ["a:1", "b:2"], "worker": ["c:3"]}, "task": {"type": "chief", "index": 0}},
    "one address twice": {"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}},
}


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("environ, named", [
    ({**_STEP, "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID='abc' is not a whole number"),
    ({**_STEP, "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_LOCALID": "7"}, "SLURM_LOCALID 7"),
    ({**_STEP, "SLURM_STEP_NODELIST": "node[01-"}, "'node[01-' leaves a bracket open"),
    ({**_STEP, "SLURM_STEP_NODELIST": "n[0-999999999]"}, "more hosts than the step has tasks"),
    ({"LOCAL_WORLD_SIZE": "abc"}, "LOCAL_WORLD_SIZE='abc'"),
    ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK 3"),
    ({"TF_CONFIG": json.dumps(_TF_BAD["two chiefs"])}, "TF_CONFIG lists 2 chief tasks"),
    ({"TF_CONFIG": json.dumps(_TF_BAD["one address twice"])}, "TF_CONFIG lists address 'a:1' twice"),
    ({"SM_MODEL_DIR": "/etc/hostname"}, "SM_MODEL_DIR /etc/hostname is a file"),
    ({"AIP_MODEL_DIR": "/proc/nope/model"}, "AIP_MODEL_DIR /proc/nope/model cannot be written (creating /proc/nope"),
], ids=["slurm-job-id", "slurm-localid", "unclosed-bracket", "huge-range", "local-world-size", "rank-past-world",
        "tf-two-chiefs", "tf-address-twice", "model-dir-a-file", "model-dir-unwritable"])
def test_every_launch_variable_is_read_strictly_before_anything_trains(tmp_path, environ, named):
    """Each convention's variables as Slurm, torchrun, TensorFlow and the cloud services define
    them: anything else is one line naming the variable, exit 2, before a run folder exists (a
    model folder found unwritable only after training is the defect this replaces)."""
    proc = run(["train", *QUICK, "--run-dir", tmp_path / "run"], tmp_path, timeout=60, **environ)
    assert proc.returncode == 2, proc.stderr
    assert named in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "run").exists()


def _idle(pid: int, window_s: float = 1.0) -> bool:
    """Whether process `pid` (and its children) used under 5 % of a core over `window_s`."""
    import psutil

    def cpu() -> float:
        me = psutil.Process(pid)
        return sum(sum(p.cpu_times()[:2]) for p in [me, *me.children(recursive=True)])
    try:
        before = cpu()
        time.sleep(window_s)
        return cpu() - before < 0.05 * window_s
    except psutil.Error:
        return False


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("index, sig, code", [(1, signal.SIGTERM, 143), (0, signal.SIGINT, 130)],
                         ids=["worker-waits-for-chief-sigterm", "chief-waits-for-worker-sigint"])
def test_a_rendezvous_without_its_peer_is_stopped_by_a_signal_and_times_out_naming_it(tmp_path, index, sig, code):
    """TF_CONFIG names two tasks and only one is started: waiting for the other, it ends within
    seconds of SIGTERM or Ctrl-C (torch's own rendezvous blocked in C++ and ignored both for
    minutes), and after --rendezvous-timeout-s says which task never came. Real processes."""
    ports = [free_port(), free_port()]
    spec = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})
    args = ["train", *QUICK, "--strategy", "ddp", "--run-dir", str(tmp_path / "run")]
    log = tmp_path / "log"
    proc = start(args, tmp_path, log, TF_CONFIG=spec)
    try:
        # Past start-up and waiting for the peer: its CPU time has stopped growing (a fixed sleep
        # can land inside a loaded runner's imports, where Python, not scaletrain, meets the signal).
        wait_for(lambda: _idle(proc.pid) or proc.poll() is not None, 120, "the process to wait for its peer")
        assert proc.poll() is None, log.read_text()
        proc.send_signal(sig)
        # It ends now, not after the rendezvous timeout (minutes): the wait's guard is far shorter.
        assert proc.wait(timeout=60) == code, log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = log.read_text().strip().splitlines()
    assert lines == [f"scaletrain: {'terminated' if sig == signal.SIGTERM else 'interrupted'}"], lines
    timed = run([*args, "--rendezvous-timeout-s", "2"], tmp_path, timeout=60, TF_CONFIG=spec)
    assert timed.returncode == 2 and "Traceback" not in timed.stderr, timed.stderr
    missing = 1 - index
    assert f"rank(s) {missing} (TF_CONFIG's task at 127.0.0.1:{ports[missing]})" in timed.stderr \
        if index == 0 else f"rank 0 (TF_CONFIG's task at 127.0.0.1:{ports[0]})" in timed.stderr, timed.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.usefixtures("processes")
def test_a_signal_ends_a_rank_stuck_in_a_collective_with_a_hung_peer(tmp_path):
    """Rank 1 hangs in its fifth forward (alive, sockets open); rank 0 waits inside DDP's
    all-reduce, in C++, where Python's handler cannot run: SIGTERM still ends it within seconds
    (lifecycle/stops.py), in one line, its run recorded as interrupted. Without the stop watch it
    stayed up until the collective timed out (measured: alive 10 s after SIGTERM)."""
    ports = [free_port(), free_port()]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    hanging = tmp_path / "hanging"
    args = ["train", "--model", "faulty_models:hanging_mlp", "--model-option", f"marker={hanging}", "--data", "digits",
            "--epochs", "5", "--no-progress", "--no-record", "--strategy", "ddp", "--run-dir", str(tmp_path / "run")]
    procs = [start(args, tmp_path, tmp_path / f"log{i}",
                   TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}))
             for i in (0, 1)]
    try:
        # Rank 1 is in its fifth forward, hanging: rank 0 is in (or about to reach) the step's
        # all-reduce. Waited for by its sign, not a clock: under CI's load the two ranks took over
        # a minute to start (a fixed 60 s once signalled a run that had not yet begun).
        wait_for(lambda: hanging.exists() or procs[0].poll() is not None, 300, "rank 1 to hang")
        time.sleep(2)
        assert procs[0].poll() is None, (tmp_path / "log0").read_text()
        procs[0].send_signal(signal.SIGTERM)
        # It ends now, not when the collective times out (--step-timeout-s, 120 s): the guard is 60 s.
        assert procs[0].wait(timeout=60) == 143, (tmp_path / "log0").read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    log = (tmp_path / "log0").read_text()
    assert log.strip().splitlines()[-1] == "scaletrain: terminated" and "Traceback" not in log, log
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "interrupted"


# The main thread stuck in C++ past STUCK_S (glibc's system() waits for its child through EINTR),
# then back in Python while the watcher is still writing the last words (the collective ended as
# its peer exited): its way out must wait for them.
_LATE_MAIN_THREAD = """
import os, signal, sys, threading, time
from pathlib import Path
from scaletrain.errors import Terminated
from scaletrain.lifecycle.stops import STUCK_S, StopWatch, on_stop_signal
signal.signal(signal.SIGTERM, on_stop_signal)
def last_words():
    time.sleep(1.5)                        # a slow disk: back in Python before they are written
    Path(sys.argv[1]).write_text("interrupted")
watch = StopWatch.arm(last_words)
threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
try:
    os.system(f"sleep {STUCK_S + 0.8}")
except Terminated:
    pass
finally:
    watch.disarm()
"""


@pytest.mark.usefixtures("processes")
def test_the_stop_watchs_last_words_are_written_whole_when_the_main_thread_comes_back(tmp_path):
    """A killed launcher's rank read "running" after its job ended (a third test worker's load): its
    watcher was writing "interrupted" when the main thread, back from the collective, left the
    process, and the daemon thread died with it. The way out now waits for those words."""
    script, status = tmp_path / "late.py", tmp_path / "status"
    script.write_text(_LATE_MAIN_THREAD)
    done = subprocess.run([sys.executable, str(script), str(status)], capture_output=True, text=True, timeout=60,
                          env=cli_env())
    assert status.read_text() == "interrupted", done.stderr
    assert done.returncode == 143 and done.stderr.strip() == "scaletrain: terminated", done.stderr



@pytest.fixture
def stop_handlers():
    """This process's SIGTERM raising Terminated, as in a CLI command; afterwards the test's
    handler and the process's record of stops as they were."""
    previous, received = signal.signal(signal.SIGTERM, stops.on_stop_signal), len(stops.RECEIVED)
    yield
    signal.signal(signal.SIGTERM, previous)
    del stops.RECEIVED[received:]


def test_a_process_leaving_through_os_exit_ends_its_daemonic_children_first():
    """A launched worker leaves through os._exit (scaletrain/__main__.py), as the stop watch does,
    which skips Python's own ending of daemonic children (a DataLoader's workers): it ends them
    itself. Non-daemonic children are the caller's to join, as Python leaves them."""
    import multiprocessing

    from torch.utils.data import DataLoader
    fork = multiprocessing.get_context("fork")
    asleep = fork.Process(target=time.sleep, args=(3600,), daemon=True)   # a worker hung in a read
    kept = fork.Process(target=time.sleep, args=(3600,), daemon=False)
    asleep.start()
    kept.start()
    # A DataLoader's workers too, whose deaths its SIGCHLD handler reports as a failure (raised
    # inside the ending, it cost a launched rank a traceback over its own line).
    watched_before = signal.getsignal(signal.SIGCHLD)
    batches = iter(DataLoader(range(8), num_workers=2, persistent_workers=True))
    next(batches)
    workers = list(batches._workers)
    try:
        stops.end_daemonic_children()
        assert not asleep.is_alive() and asleep.exitcode == -signal.SIGKILL
        assert not any(worker.is_alive() for worker in workers)
        assert kept.is_alive()
    finally:
        signal.signal(signal.SIGCHLD, watched_before)
        for child in (asleep, kept, *workers):
            child.kill()
            child.join()
        del batches   # its shutdown unregisters its workers from torch's SIGCHLD check


@pytest.mark.usefixtures("stop_handlers")
def test_a_stop_inside_finishing_is_raised_as_the_block_ends():
    """A second stop while a run records its ending waits for the record; one from before the
    block, or from a block that fails, is the caller's; an inner block's stop is its outer's."""
    finishing = stops.finishing
    done = []
    with pytest.raises(Terminated):
        with finishing():
            os.kill(os.getpid(), signal.SIGTERM)   # its handler runs before the next line
            done.append("recorded")
    assert done == ["recorded"]
    with pytest.raises(KeyError):                  # the block's own failure goes on as it was
        with finishing():
            os.kill(os.getpid(), signal.SIGTERM)
            raise KeyError("the record failed")
    with pytest.raises(Terminated):
        with finishing():
            with finishing():
                os.kill(os.getpid(), signal.SIGTERM)
            done.append("outer")
    assert done == ["recorded", "outer"]
    with pytest.raises(Terminated):                # outside one, a stop is raised at once
        os.kill(os.getpid(), signal.SIGTERM)
        done.append("not reached")
    assert done == ["recorded", "outer"]
    # A block in another thread (a run in a user's thread) defers none of the main thread's stops.
    deferring = []

    def in_a_thread():
        with finishing():
            deferring.append(stops._deferred)
    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert deferring == [None]


@pytest.mark.usefixtures("stop_handlers")
def test_a_second_sigterm_while_the_run_records_its_end_still_records_it(tmp_path, monkeypatch):
    """A killed launcher's workers get SIGTERM once per thread of it as they die: the second one,
    50 ms after the first, raised inside the chief's write of run.json and left the run "running"
    (test_trust's killed launcher, 3 whole-suite runs in 5). Here a step sends the first, the
    status write the second just before it writes, and the command's last line a third."""
    from scaletrain.cli.main import main
    from scaletrain.lifecycle.folder import RunFolder
    from scaletrain.lifecycle.plan import TakenFolder
    stepped, set_status = TakenFolder.on_train_batch_end, RunFolder.set_status

    def first_stop(self, trainer, step, logs):
        stepped(self, trainer, step, logs)
        os.kill(os.getpid(), signal.SIGTERM)

    def second_stop(self, status):
        os.kill(os.getpid(), signal.SIGTERM)
        set_status(self, status)
    monkeypatch.setattr(TakenFolder, "on_train_batch_end", first_stop)
    monkeypatch.setattr(RunFolder, "set_status", second_stop)
    monkeypatch.setattr("scaletrain.cli.main.hand_to_launcher", lambda line: os.kill(os.getpid(), signal.SIGTERM))
    monkeypatch.chdir(tmp_path)
    code = main(["train", *DIGITS_MLP, "--epochs", "1", "--no-record", "--run-dir", "run"])
    assert code == 143
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "interrupted"


def test_a_slurm_step_lays_its_tasks_node_by_node():
    spec = slurm_step(_step(3, tasks=4, nodes="n[1-2]", per_node="2(x2)", SLURM_LOCALID="1"))
    assert spec.addresses == ("n1:19242",) * 2 + ("n2:19242",) * 2
    assert (spec.rank, spec.local_rank, spec.local_world_size, spec.master_addr) == (3, 1, 2, "n1")
    assert spec.torch_env()["LOCAL_RANK"] == "1" and spec.torch_env()["MASTER_PORT"] == "19242"
    assert slurm_step(_step(0, MASTER_PORT="29999")).master_port == 29999
    assert slurm_step(_step(0, tasks=1, per_node="1")) is None          # `srun -n 1`: one process, no job
    assert slurm_step({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4", "SLURM_PROCID": "0"}) is None  # a batch script's shell
    with pytest.raises(ConfigError, match="disagree"):
        slurm_step(_step(0, tasks=3))
    # --nproc starts a launcher per task: with two tasks on one node they would share its devices.
    problem = cluster_problem(slurm_step(_step(0)), 0, 2)
    assert "one task per node" in problem


def test_scaletrain_cluster_comes_before_tf_config_and_tf_config_before_slurm():
    ours = json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}})
    theirs = json.dumps({"cluster": {"worker": ["c:2", "d:2", "e:2"]}, "task": {"type": "worker", "index": 2}})
    assert cluster_from_env({"SCALETRAIN_CLUSTER": ours, "TF_CONFIG": theirs, **_step(0)}).addresses == ("a:1", "b:1")
    spec = cluster_from_env({"TF_CONFIG": theirs, **_step(0)})
    assert (spec.rank, spec.source) == (2, "TF_CONFIG")
    assert cluster_from_env(_step(1)).rank == 1
    with pytest.raises(ConfigError, match="^TF_CONFIG has task.index 5 out of range"):
        cluster_from_env({"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 5}})})


@pytest.mark.usefixtures("processes")
def test_two_slurm_tasks_train_one_ddp_job(tmp_path):
    """Two tasks of one srun step on this host (srun -n 2), each started as srun starts it."""
    port = free_port()
    args = [sys.executable, "-m", "scaletrain", "train", *QUICK, "--strategy", "ddp", "--run-dir", str(tmp_path / "r")]
    tasks = [subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=cli_env(**_step(rank, MASTER_PORT=str(port))))
             for rank in range(2)]
    outputs = outputs_of(tasks, 240)
    assert [task.returncode for task in tasks] == [0, 0], outputs
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert (summary["strategy"], summary["world_size"]) == ("ddp", 2)


def test_job_folders_fill_what_the_config_leaves_unset(tmp_path):
    mount = tmp_path / "gcs"
    environ = {"AIP_MODEL_DIR": "gs://bucket/model", "AIP_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
               "SM_CHANNEL_TRAINING": str(tmp_path / "data"), "SM_CHANNEL_EXTRA": "/elsewhere"}
    with pytest.raises(ConfigError, match="AIP_MODEL_DIR is gs://bucket/model, a Cloud Storage address"):
        job_folders(environ, gcs_mount=str(mount))
    mount.mkdir()
    folders = job_folders(environ, gcs_mount=str(mount))
    assert folders.model_dir == f"{mount}/bucket/model" and folders.data_dir == str(tmp_path / "data")
    cfg = TrainConfig()
    cfg.checkpoint.dir = "mine"
    used = apply_job_folders(cfg, folders)
    assert cfg.checkpoint.dir == "mine" and cfg.data.data_dir == str(tmp_path / "data")
    assert set(used.describe()) == {"model_dir", "data_dir"}
    with pytest.raises(ConfigError, match="SM_MODEL_DIR is s3://b; scaletrain writes local folders"):
        job_folders({"SM_MODEL_DIR": "s3://b"})


@pytest.mark.usefixtures("processes")
def test_a_cloud_jobs_folders_receive_its_model_checkpoints_and_event_files(tmp_path):
    pytest.importorskip("tensorboard")
    dirs = {name: tmp_path / "job" / name for name in ("model", "checkpoints", "tensorboard")}
    # Two workers under the launcher: each applies the folders, only the chief writes events.
    done = run(["train", *QUICK, "--epochs", "2", "--checkpoint-every", "5", "--run-dir", "r", "--nproc", "2"], tmp_path,
               SM_MODEL_DIR=str(dirs["model"]), AIP_CHECKPOINT_DIR=str(dirs["checkpoints"]),
               AIP_TENSORBOARD_LOG_DIR=str(dirs["tensorboard"]))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in dirs["model"].iterdir()) == ["config.json", "model.pt", "summary.json"]
    assert (dirs["model"] / "model.pt").read_bytes() == (tmp_path / "r" / "model.pt").read_bytes()
    assert any(p.name.startswith("step-") for p in dirs["checkpoints"].iterdir())
    assert len([p for p in dirs["tensorboard"].iterdir() if p.name.startswith("events.out.tfevents")]) == 1
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["job_folders"] == {"model_dir": f"{dirs['model']} (SM_MODEL_DIR)",
                                      "checkpoint_dir": f"{dirs['checkpoints']} (AIP_CHECKPOINT_DIR)",
                                      "tensorboard_dir": f"{dirs['tensorboard']} (AIP_TENSORBOARD_LOG_DIR)"}
    assert "job model dir" in done.stdout


@pytest.mark.usefixtures("processes")
def test_thread_flags_set_the_pools_and_are_recorded(tmp_path):
    done = run(["train", *QUICK, "--intra-op-threads", "1", "--inter-op-threads", "3", "--run-id", "threads"], tmp_path)
    assert done.returncode == 0, done.stderr
    shown = run_here(["runs", "show", "threads", "--json"], tmp_path)
    environment = json.loads(shown.stdout)["environment"]
    assert (environment["intra_op_threads"], environment["inter_op_threads"]) == (1, 3)
    bad = run(["train", *QUICK, "--inter-op-threads", "0"], tmp_path)
    assert bad.returncode == 2 and "inter_op_threads' must be >= 1 (got 0)" in bad.stderr


@pytest.mark.usefixtures("processes")
def test_a_configs_threads_win_over_the_multi_slots_own_share(tmp_path):
    """One slot holds both cores (--parallel 1): a config that names its threads keeps them."""
    base = 'epochs = 1\nprogress = false\nbatch_size = 64\n[model]\nname = "mlp"\n[data]\nname = "digits"\n'
    (tmp_path / "mine.toml").write_text("threads = 1\n" + base)
    (tmp_path / "slot.toml").write_text(base)
    done = run(["multi", "mine.toml", "slot.toml", "--parallel", "1", "--group", "g", "--store", "s.db"], tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    listing = json.loads(run_here(["runs", "list", "--store", "s.db", "--json"], tmp_path).stdout)
    threads = {}
    for entry in listing:
        shown = json.loads(run_here(["runs", "show", entry["run"], "--store", "s.db", "--json"], tmp_path).stdout)
        threads[shown["config"].get("threads")] = shown["environment"]["intra_op_threads"]
    share = len(os.sched_getaffinity(0))
    assert threads == {1: 1, None: share}


def test_under_nproc_each_slurm_task_is_one_hosts_launcher(monkeypatch):
    from scaletrain.distributed.launch import torchrun_arguments
    for name, value in _step(1, tasks=2, nodes="n[1-2]", per_node="1(x2)", SLURM_LOCALID="0").items():
        monkeypatch.setenv(name, value)
    args = torchrun_arguments(4, 0, ["--epochs", "1"])
    given = dict(zip(args[::2], args[1::2], strict=False))   # the flags before the worker's own arguments
    assert (given["--nnodes"], given["--node-rank"], given["--rdzv-endpoint"], given["--local-addr"]) == (
        "2", "1", "n1:19242", "n2")
    assert given["--nproc-per-node"] == "4" and "--standalone" not in args
