"""Run a training script as N workers of a local multi-worker cluster.

    python -m keras_ctl.launch --workers 2 [--devices-per-worker K] -- \\
        python train.py --epochs 3

(or `keras-ctl launch ...`). This module stands beside the `keras_ctl`
package, as `keras_ctl_cli` does, so that the launcher starts without
Keras and TensorFlow: `--help` and bad flags answer at once, and only the
workers import them. `python -m keras_ctl.launch` runs it too, after the
package's import.

Picks free ports on 127.0.0.1, gives each worker its `TF_CONFIG`, streams
every worker's output with a `[worker i]` prefix, and when one worker fails
or is killed, stops the others and exits non-zero within `--grace` seconds:
a collective never waits forever for a dead peer.

SIGTERM and SIGINT sent to the launcher go to every worker: with
`keras_ctl.callbacks.BackupAndRestore` they save and exit with code 42
(`SAVED_ON_NOTICE`), and so does the launcher. With `--restarts K`, a job
whose workers saved on notice (one of them was preempted) starts again, up
to K times, and resumes from the backup; a launcher that got the signal
itself does not restart.

The script builds `tf.distribute.MultiWorkerMirroredStrategy()` (or
`keras_ctl.strategies.multi_worker_strategy()`), which reads `TF_CONFIG`. On
real machines, run the same script once per machine with `TF_CONFIG`
describing the cluster (a Kubernetes operator writes it), or as the tasks
of `srun` under Slurm, which `multi_worker_strategy()` reads without it;
this launcher is only the local stand-in.

With `--ps M`, the cluster is a parameter-server one:

    python -m keras_ctl.launch --workers 2 --ps 1 -- python train.py

starts M parameter servers and N workers (each a `tf.distribute.Server`,
`python -m keras_ctl.launch --serve`), then runs the command once, as the
chief (the coordinator), which builds `tf.distribute.ParameterServerStrategy`
(or `keras_ctl.strategies.parameter_server_strategy()`) from its
`TF_CONFIG`. The job's exit code is the chief's; the servers are stopped
when it ends. A worker server that dies is started again on its port (the
coordinator gives its steps to the other workers meanwhile, and uses it
again once it is back); the chief gets the servers' process ids in
`KERAS_CTL_SERVER_PIDS` (JSON: `{"ps": [...], "worker": [...]}`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO

DEVICES_ENV = "KERAS_CTL_DEVICES_PER_WORKER"
SERVER_PIDS_ENV = "KERAS_CTL_SERVER_PIDS"
SAVED_ON_NOTICE = 42  # keras_ctl.callbacks.SAVED_ON_NOTICE, without TensorFlow


class DefaultsShown(argparse.ArgumentDefaultsHelpFormatter):
    """Every flag's help ends with its default, unless it names it itself."""

    def _get_help_string(self, action):
        if action.required or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def free_ports(count: int) -> list[int]:
    """Returns `count` distinct free TCP ports on 127.0.0.1."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_config(addresses: Sequence[str], index: int) -> str:
    """The `TF_CONFIG` of worker `index` in a cluster of `addresses`."""
    return json.dumps(
        {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
    )


def launch(
    command: Sequence[str],
    workers: int,
    devices_per_worker: int = 1,
    grace: float = 10.0,
    timeout: float | None = None,
    out: IO[str] | None = None,
    restarts: int = 0,
) -> int:
    """Runs `command` as `workers` local workers; returns the exit code.

    Args:
        command: The command line of one worker (a list of strings).
        workers: Number of worker processes, >= 1.
        devices_per_worker: GPUs of this machine each worker gets (through
            `CUDA_VISIBLE_DEVICES`, unless it is set already), also passed in
            `KERAS_CTL_DEVICES_PER_WORKER`. On a CPU-only machine each worker
            has one replica: `MultiWorkerMirroredStrategy` uses one CPU
            device per worker. Defaults to `1`.
        grace: Seconds between SIGTERM and SIGKILL when stopping the
            others after a failure. Defaults to `10.0`.
        timeout: Optional wall-clock limit for each run of the job, in seconds.
        out: Stream for the prefixed output. Defaults to `sys.stdout`.
        restarts: How many times to start the job again after its workers
            saved on notice (exit code 42). Defaults to `0`.

    Returns:
        0 when every worker succeeded; otherwise the first failing worker's
        exit code (128 + signal number for a killed worker; 42 for workers
        that saved on notice), or 124 on timeout.
    """
    noticed = []

    def forward(signum, frame):
        del frame
        noticed.append(signum)
        for process in running:
            _signal_group(process, signum)

    running = []
    previous = {
        sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        while True:
            code = _run_once(
                command, workers, devices_per_worker, grace, timeout, out, running
            )
            if code != SAVED_ON_NOTICE or noticed or restarts <= 0:
                return code
            restarts -= 1
            (out or sys.stdout).write("[launch] workers saved on notice; restarting\n")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_once(command, workers, devices_per_worker, grace, timeout, out, running):
    out = out or sys.stdout
    addresses = [f"127.0.0.1:{port}" for port in free_ports(workers)]
    running.clear()
    lock = threading.Lock()
    for index in range(workers):
        env = dict(
            os.environ,
            TF_CONFIG=tf_config(addresses, index),
            **{DEVICES_ENV: str(devices_per_worker)},
        )
        if "CUDA_VISIBLE_DEVICES" not in os.environ:
            # Worker i gets GPUs [i*K, (i+1)*K); CPU-only machines ignore it.
            first = index * devices_per_worker
            gpus = range(first, first + devices_per_worker)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in gpus)
        running.append(_start(command, env, f"[worker {index}] ", out, lock))
    deadline = None if timeout is None else time.monotonic() + timeout
    code = _wait(running, deadline)
    if code != 0:
        _stop(running, grace)
    for process in running:
        process.wait()
    return code


def launch_parameter_servers(
    command: Sequence[str],
    workers: int,
    ps: int,
    grace: float = 10.0,
    timeout: float | None = None,
    out: IO[str] | None = None,
) -> int:
    """Runs `command` as the chief of a local parameter-server cluster of
    `ps` parameter servers and `workers` workers; returns the chief's exit
    code (124 on timeout)."""
    out = out or sys.stdout
    lock = threading.Lock()
    ports = free_ports(1 + ps + workers)
    addresses = [f"127.0.0.1:{port}" for port in ports]
    cluster = {
        "chief": addresses[:1],
        "ps": addresses[1 : 1 + ps],
        "worker": addresses[1 + ps :],
    }
    servers = {}  # (job, index) -> process

    def start_server(job, index):
        config = {"cluster": cluster, "task": {"type": job, "index": index}}
        process = _start(
            [sys.executable, "-m", "keras_ctl_launch", "--serve"],
            dict(os.environ, TF_CONFIG=json.dumps(config)),
            f"[{job} {index}] ",
            out,
            lock,
        )
        servers[(job, index)] = process

    for job in ("ps", "worker"):
        for index in range(len(cluster[job])):
            start_server(job, index)
    pids = {
        job: [servers[(job, i)].pid for i in range(len(cluster[job]))]
        for job in ("ps", "worker")
    }
    chief_config = {"cluster": cluster, "task": {"type": "chief", "index": 0}}
    env = dict(os.environ, TF_CONFIG=json.dumps(chief_config))
    env[SERVER_PIDS_ENV] = json.dumps(pids)
    chief = _start(command, env, "[chief] ", out, lock)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while chief.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                _stop([chief], grace)
                return 124
            for (job, index), process in list(servers.items()):
                if job == "worker" and process.poll() is not None:
                    out.write(f"[launch] worker {index} ended; starting it again\n")
                    start_server(job, index)
            time.sleep(0.2)
        code = chief.returncode
        return 128 - code if code < 0 else code
    finally:
        _stop([chief, *servers.values()], grace)
        for process in [chief, *servers.values()]:
            process.wait()


def _ends_with_the_launcher():
    """In a worker, before it starts (Linux): SIGKILL when the launcher
    dies. A launcher killed with SIGKILL (a preempted machine, an OOM
    killer) cannot stop its workers, which are in groups of their own; left
    running, they would keep training and writing the backup beside the
    restarted job's workers."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _start(command, env, prefix, out, lock):
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,  # its own group, to stop its children too
        preexec_fn=_ends_with_the_launcher,
    )
    threading.Thread(
        target=_stream, args=(process, prefix, out, lock), daemon=True
    ).start()
    return process


def serve() -> None:
    """A parameter server or worker of the cluster in `TF_CONFIG`, until
    stopped."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    server.join()


def _signal_group(process, sig):
    if process.poll() is None:
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass


def _stream(process, prefix, out, lock):
    for line in process.stdout:
        with lock:
            out.write(prefix + line)
            out.flush()


def _wait(processes, deadline):
    while True:
        codes = [process.poll() for process in processes]
        failed = [code for code in codes if code not in (None, 0)]
        if failed:
            code = failed[0]
            return 128 - code if code < 0 else code
        if all(code == 0 for code in codes):
            return 0
        if deadline is not None and time.monotonic() > deadline:
            return 124
        time.sleep(0.1)


def _stop(processes, grace):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for process in processes:
            _signal_group(process, sig)
        end = time.monotonic() + grace
        while time.monotonic() < end and any(p.poll() is None for p in processes):
            time.sleep(0.1)


def build_parser() -> argparse.ArgumentParser:
    """The launcher's flags."""
    parser = argparse.ArgumentParser(
        prog="keras-ctl launch",
        description="Run a script as N local workers (TF_CONFIG on 127.0.0.1).",
        formatter_class=DefaultsShown,
    )
    parser.add_argument(
        "--workers", type=int, required=True, help="worker processes to start"
    )
    parser.add_argument(
        "--ps",
        type=int,
        default=0,
        help="parameter servers: run the command as the chief of a "
        "parameter-server cluster of this many servers and --workers workers",
    )
    parser.add_argument(
        "--devices-per-worker",
        type=int,
        default=1,
        help="logical CPU devices (replicas) of each worker",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="seconds the other workers get to stop after one fails",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds before the whole job is stopped (default: no limit)",
    )
    parser.add_argument(
        "--restarts",
        type=int,
        default=0,
        help="start the job again after its workers saved on notice, up to N times",
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="-- then the command each worker runs"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--serve"]:
        serve()
        return 0
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("Expected a command after `--`. Received: no command.")
    if args.workers < 1 or args.devices_per_worker < 1:
        parser.error(
            "--workers and --devices-per-worker must be >= 1. Received: "
            f"--workers {args.workers} --devices-per-worker {args.devices_per_worker}"
        )
    if args.restarts < 0:
        parser.error(f"--restarts must be >= 0. Received: --restarts {args.restarts}")
    if args.ps < 0:
        parser.error(f"--ps must be >= 0. Received: --ps {args.ps}")
    if args.ps:
        return launch_parameter_servers(
            command, args.workers, args.ps, grace=args.grace, timeout=args.timeout
        )
    return launch(
        command,
        args.workers,
        devices_per_worker=args.devices_per_worker,
        grace=args.grace,
        timeout=args.timeout,
        restarts=args.restarts,
    )


if __name__ == "__main__":
    sys.exit(main())
