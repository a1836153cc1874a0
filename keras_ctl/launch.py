"""Run a training script as N workers of a local multi-worker cluster.

    python -m keras_ctl.launch --workers 2 [--devices-per-worker K] -- \\
        python train.py --epochs 3

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
real machines, run the same script once per machine with `TF_CONFIG` (or a
cluster resolver such as `SlurmClusterResolver`) describing the cluster;
this launcher is only the local stand-in.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

DEVICES_ENV = "KERAS_CTL_DEVICES_PER_WORKER"
SAVED_ON_NOTICE = 42  # keras_ctl.callbacks.SAVED_ON_NOTICE, without TensorFlow


def free_ports(count):
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


def tf_config(addresses, index):
    """The `TF_CONFIG` of worker `index` in a cluster of `addresses`."""
    return json.dumps(
        {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
    )


def launch(
    command,
    workers,
    devices_per_worker=1,
    grace=10.0,
    timeout=None,
    out=None,
    restarts=0,
):
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
        process = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,  # its own group, to stop its children too
        )
        running.append(process)
        threading.Thread(
            target=_stream, args=(process, f"[worker {index}] ", out, lock), daemon=True
        ).start()
    deadline = None if timeout is None else time.monotonic() + timeout
    code = _wait(running, deadline)
    if code != 0:
        _stop(running, grace)
    for process in running:
        process.wait()
    return code


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


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="keras-ctl launch",
        description="Run a script as N local workers (TF_CONFIG on 127.0.0.1).",
    )
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--devices-per-worker", type=int, default=1)
    parser.add_argument("--grace", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument(
        "--restarts",
        type=int,
        default=0,
        help="start the job again after its workers saved on notice, up to N times",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
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
