"""A real Slurm cluster on this machine, for the tests: `munged`,
`slurmctld` and `slurmd` (the system's packages `munge` and `slurm-wlm`,
run as root), one node of 2 CPUs named `localhost` (127.0.0.1), two
partitions (a job in `urgent` preempts the jobs of `main`, the default:
Slurm sends their `--signal` warning at once, gives them `GRACE_TIME` s,
and requeues them), a configuration written into a temporary folder, and ports the
tests picked: the daemons', and the range Slurm reserves for each step
(`MpiParams=ports`, given to the tasks as `SLURM_STEP_RESV_PORTS`).

`running(folder)` starts the daemons, waits until the node is idle, and
at the end stops them by their process ids, with every process a job left
(found by the cluster's `SLURM_CONF` in its environment).
"""

import contextlib
import dataclasses
import getpass
import os
import pathlib
import random
import shutil
import signal
import socket
import subprocess
import time

import children

from keras_ctl.launch import free_ports

DAEMONS = ("munged", "slurmctld", "slurmd")
STEP_PORTS = 40  # reserved ports for the steps, a few per step

CONFIGURATION = """\
ClusterName=keras-ctl-tests
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
AuthInfo=socket={folder}/munge.socket
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MpiParams=ports={first_step_port}-{last_step_port}
JobRequeue=1
ReturnToService=2
SchedulerParameters=sched_min_interval=0
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
PartitionName=main Nodes=localhost Default=YES MaxTime=INFINITE State=UP \
PriorityTier=1 PreemptMode=REQUEUE GraceTime={grace_time}
PartitionName=urgent Nodes=localhost MaxTime=INFINITE State=UP PriorityTier=2 \
PreemptMode=OFF
"""
# Seconds a preempted job of `main` has between its signal and SIGKILL.
GRACE_TIME = 30


@dataclasses.dataclass
class Cluster:
    """A running cluster: `env` has its `SLURM_CONF`; `folder` its files."""

    folder: pathlib.Path
    env: dict
    step_ports: range

    def run(self, command, *, timeout=60, cwd=None):
        """Runs a Slurm command (or `srun ...`) against this cluster."""
        return children.run(
            command, timeout=timeout, env=self.env, cwd=cwd or self.folder
        )

    def submit(self, script, *options, cwd):
        """`sbatch` of `script`; returns the job id."""
        result = self.run(["sbatch", "--parsable", *options, script], cwd=cwd)
        assert result.returncode == 0, children.output(result)
        return result.stdout.strip().split(";")[0]

    def job(self, job_id):
        """`scontrol show job` as a dict (JobState, Restarts, ExitCode, ...)."""
        result = self.run(["scontrol", "show", "job", "--oneliner", job_id])
        assert result.returncode == 0, children.output(result)
        fields = {}
        for item in result.stdout.split():
            key, _, value = item.partition("=")
            fields.setdefault(key, value)
        return fields

    def wait_for(self, job_id, states, timeout, restarts=0):
        """Waits until the job is in one of `states`, requeued `restarts`
        times or more; returns its fields."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if fields["JobState"] in states and int(fields["Restarts"]) >= restarts:
                return fields
            assert time.monotonic() < deadline, (
                f"job {job_id} still {fields['JobState']} after {timeout} s, "
                f"not {states}:\n{self.logs()}"
            )
            time.sleep(0.2)

    def logs(self):
        """The end of the daemons' logs, for assertion messages."""
        return "\n".join(
            (self.folder / f"{name}.log").read_text()[-1500:]
            for name in ("slurmctld", "slurmd")
            if (self.folder / f"{name}.log").exists()
        )


def missing_commands():
    """The Slurm and munge programs this machine lacks."""
    needed = (*DAEMONS, "srun", "sbatch", "scontrol", "scancel", "sinfo")
    return [name for name in needed if shutil.which(name) is None]


@contextlib.contextmanager
def running(folder, timeout=60):
    """A `Cluster` whose daemons run until the end of the block."""
    folder = pathlib.Path(folder)
    assert not missing_commands(), (
        f"The Slurm tests run a real cluster; missing {missing_commands()}: "
        "`apt-get install slurm-wlm munge` (.ci/run does)."
    )
    for name in ("state", "spool"):
        (folder / name).mkdir()
    (folder / "munge.key").write_bytes(os.urandom(1024))
    (folder / "munge.key").chmod(0o400)
    ctld_port, slurmd_port = free_ports(2)
    step_ports = _free_port_range(STEP_PORTS)
    (folder / "slurm.conf").write_text(
        CONFIGURATION.format(
            folder=folder,
            user=getpass.getuser(),
            ctld_port=ctld_port,
            slurmd_port=slurmd_port,
            first_step_port=step_ports[0],
            last_step_port=step_ports[-1],
            grace_time=GRACE_TIME,
        )
    )
    # This interpreter first on PATH: `python` in a job script is the tests'.
    path = os.path.dirname(children.PYTHON) + os.pathsep + os.environ["PATH"]
    env = dict(os.environ, SLURM_CONF=str(folder / "slurm.conf"), PATH=path)
    daemons = []
    cluster = Cluster(folder, env, step_ports)
    try:
        daemons.append(_start(_munged(folder), env, folder))
        _wait(lambda: (folder / "munge.socket").exists(), timeout, "munged", cluster)
        daemons.append(_start(["slurmctld", "-D", "-i"], env, folder))
        daemons.append(_start(["slurmd", "-D", "-N", "localhost"], env, folder))
        _wait(lambda: _node_state(cluster) == "idle", timeout, "an idle node", cluster)
        yield cluster
    finally:
        _stop(cluster, daemons)


def _munged(folder):
    return [
        "munged",
        "--foreground",
        "--force",  # as root, with the key in a temporary folder
        f"--socket={folder}/munge.socket",
        f"--key-file={folder}/munge.key",
        f"--pid-file={folder}/munged.pid",
        f"--log-file={folder}/munged.log",
        f"--seed-file={folder}/munged.seed",
    ]


def _start(command, env, folder):
    """Starts a daemon in the foreground (its process id is the daemon's)."""
    with open(folder / f"{command[0]}.out", "w") as log:
        return subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _node_state(cluster):
    result = cluster.run(["sinfo", "--noheader", "--format=%t"], timeout=20)
    states = set(result.stdout.split())  # a line for each partition
    return states.pop() if result.returncode == 0 and len(states) == 1 else None


def _wait(condition, timeout, what, cluster):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, (
            f"no {what} after {timeout} s\n{cluster.logs()}"
        )
        time.sleep(0.2)


def _stop(cluster, daemons):
    """Cancels the jobs left, stops the daemons by their process ids (the
    last first), then kills any process still holding the cluster's
    `SLURM_CONF` (a job step's `slurmstepd` or task)."""
    if len(daemons) == len(DAEMONS):
        cluster.run(["scancel", "--full", "--user", getpass.getuser()], timeout=30)
        deadline = time.monotonic() + 20
        while _cluster_processes(cluster, daemons) and time.monotonic() < deadline:
            time.sleep(0.2)
    for daemon in reversed(daemons):
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=15)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
    for pid in _cluster_processes(cluster, ()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _cluster_processes(cluster, ()) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _cluster_processes(cluster, ())
    assert not left, f"processes of the Slurm cluster left running: {left}"


def _cluster_processes(cluster, daemons):
    """Ids of the processes whose environment holds this cluster's
    `SLURM_CONF`, but for `daemons` and their children (`slurmscriptd`)."""
    marker = f"SLURM_CONF={cluster.env['SLURM_CONF']}".encode()
    own = {os.getpid(), *(daemon.pid for daemon in daemons)}
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in own:
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state, parent = (entry / "stat").read_text().split(")")[-1].split()[:2]
        except OSError:
            continue
        if marker in environ.split(b"\0") and state != "Z" and int(parent) not in own:
            found.append(int(entry.name))
    return found


def _free_port_range(count):
    """`count` consecutive ports, each free on 127.0.0.1 now."""
    for _ in range(100):
        first = random.randrange(20000, 30000)
        if all(_is_free(port) for port in range(first, first + count)):
            return range(first, first + count)
    raise AssertionError(f"no {count} consecutive free ports in 20000-30000")


def _is_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
