"""The one way the tests run a child process.

A child is a fresh interpreter (one device set per process: see
`devices.py`), started in its own process group, bounded in time, and
stopped with all its own children when it runs over or the test fails.
"""

import json
import os
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PYTHON = sys.executable
KERAS_CTL = os.path.join(os.path.dirname(sys.executable), "keras-ctl")
# The launcher as the module beside the package, which starts without
# TensorFlow and Keras, as `keras-ctl launch` does: `python -m
# keras_ctl.launch` imports the package first (4 to 5 s of CPU a job, for
# a process that only waits). `multi_worker_test.py` runs that route.
LAUNCHER = [PYTHON, "-m", "keras_ctl_launch"]


def launched(workers, command, *, timeout):
    """`command` as a job of `workers` processes on 127.0.0.1, started by
    the launcher (`LAUNCHER`), which stops them all after `timeout` s."""
    return [*LAUNCHER, "--workers", workers, "--timeout", timeout, "--", *command]


# Put first on a child's `PYTHONPATH`: its `sitecustomize` keeps Python's
# full garbage collections off the heap TensorFlow and Keras make as they
# import (`child_site/sitecustomize.py`).
CHILD_SITE = os.path.join(HERE, "child_site")


def quiet_env(env=None):
    """`env` (default: this process's) without TensorFlow's log lines, unless
    `env` sets their level itself, and with `CHILD_SITE` first on its
    `PYTHONPATH`."""
    if env is None:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    paths = [path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path]
    if CHILD_SITE not in paths:
        paths.insert(0, CHILD_SITE)
    return {"TF_CPP_MIN_LOG_LEVEL": "3", **env, "PYTHONPATH": os.pathsep.join(paths)}


def start(command, *, env=None, cwd=HERE):
    """Starts `command`; stdout and stderr are captured separately."""
    return subprocess.Popen(
        [str(part) for part in command],
        cwd=cwd,
        env=quiet_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(process, timeout):
    """Waits for `process`; returns a `subprocess.CompletedProcess`.

    Raises:
        AssertionError: after stopping the whole process group, when the
            child runs past `timeout` seconds.
    """
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(process)
        stdout, stderr = process.communicate()
        raise AssertionError(
            f"{process.args} ran past {timeout} s:\n{stdout[-2000:]}\n{stderr[-3000:]}"
        ) from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def stop(process):
    """Kills `process` and everything it started."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run(command, *, timeout, env=None, cwd=HERE):
    """Runs `command` to its end; returns a `subprocess.CompletedProcess`."""
    return finish(start(command, env=env, cwd=cwd), timeout)


def json_written(command, out, *, timeout):
    """Runs `command`, a child that writes JSON to `out`; returns what it
    wrote, or `{"error": the end of its stderr}` when it fails."""
    result = run(command, timeout=timeout)
    if result.returncode:
        return {"error": result.stderr[-3000:]}
    with open(out) as f:
        return json.load(f)


def output(result):
    """The end of a finished child's output, for assertion messages."""
    return result.stdout[-3000:] + result.stderr[-3000:]


def script_of(child, *arguments):
    """The text of a script that runs the child script `child` (of this
    folder) with `arguments`: the `train.py` a cluster's job runs."""
    path = os.path.join(HERE, child)
    return (
        "import runpy, sys\n"
        f"sys.path.insert(0, {HERE!r})\n"
        f"sys.argv = {[child, *map(str, arguments)]!r}\n"
        f"runpy.run_path({path!r}, run_name='__main__')\n"
    )
