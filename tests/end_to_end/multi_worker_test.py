"""CTLModel and GAN under MultiWorkerMirroredStrategy: 2 worker processes on
127.0.0.1, started by the launcher (`python -m keras_ctl_launch`, which
starts without TensorFlow), equal to one device; the launcher's own
behaviours, and its route through the package, `python -m keras_ctl.launch`."""

import json
import os
import signal
import time

import cases
import children
import keras
import numpy as np
import pytest

NAMES = [
    "uneven",
    "uneven_spe4",
    "empty_replica",
    "multi_output",
    "gan",
    "dataset_data_policy",
    "predict",
    "global_clipnorm",
    "accumulation",
    "in_batch_negatives",
    *cases.GUIDE_CASES,
]


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("workers")
    command = [children.PYTHON, "multi_worker_child.py", out, *NAMES]
    result = children.run(children.launched(2, command, timeout=400), timeout=450)
    assert result.returncode == 0, children.output(result)
    assert "[worker 0] " in result.stdout or result.stdout == ""
    return [json.loads((out / f"worker_{i}.json").read_text()) for i in range(2)]


def reference(name):
    if name == "gan":
        return cases.run_gan()
    if name in ("dataset_data_policy", "uneven_spe4"):
        return cases.run("uneven", model_class=keras.Model)
    if name == "predict":
        keras.utils.set_random_seed(0)
        model, fit_kwargs, _ = cases.build("uneven", keras.Model)
        return {"predictions": keras.ops.convert_to_numpy(model(fit_kwargs["x"][:37]))}
    return cases.run(name, model_class=keras.Model)


@pytest.mark.parametrize("name", NAMES)
def test_two_workers_match_one_device(name, worker_results):
    expected = reference(name)
    for worker in worker_results:
        got = worker[name]
        if name == "predict":
            np.testing.assert_allclose(
                got["predictions"], expected["predictions"], atol=1e-5
            )
            continue
        for g, e in zip(got["weights"], expected["weights"], strict=True):
            np.testing.assert_allclose(g, e, atol=1e-5, rtol=0)
        for key in expected["history"]:
            np.testing.assert_allclose(
                got["history"][key], expected["history"][key], atol=1e-5
            )
        if "evaluate" in got:  # not recorded for the dataset case
            for key, value in expected["evaluate"].items():
                assert got["evaluate"][key] == pytest.approx(value, abs=1e-5)


def test_launcher_stops_the_job_when_a_worker_is_killed():
    script = (
        "import json, os, signal, time\n"
        "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
        "devices = os.environ['KERAS_CTL_DEVICES_PER_WORKER']\n"
        "print('started', index, devices, flush=True)\n"
        "if index == 1:\n"
        "    time.sleep(1)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(600)\n"
    )
    start = time.monotonic()
    result = children.run(
        [
            *children.LAUNCHER,
            "--workers",
            2,
            "--grace",
            2,
            "--",
            children.PYTHON,
            "-c",
            script,
        ],
        timeout=120,
    )
    elapsed = time.monotonic() - start
    assert result.returncode == 128 + 9  # the killed worker's SIGKILL
    assert elapsed < 60
    assert "[worker 0] started 0 1" in result.stdout
    assert "[worker 1] started 1 1" in result.stdout


def test_workers_end_with_a_launcher_killed_by_sigkill(tmp_path):
    """A preempted machine's launcher gets SIGKILL and cannot stop its
    workers: they end with it, and never write beside a restarted job."""
    script = (
        "import json, os, pathlib, time\n"
        "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
        f"pathlib.Path({str(tmp_path)!r}, f'worker{{index}}').write_text("
        "str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    command = [*children.LAUNCHER, "--workers", 2, "--"]
    launcher = children.start([*command, children.PYTHON, "-c", script])
    workers = []
    try:
        deadline = time.monotonic() + 60
        pid_files = [tmp_path / "worker0", tmp_path / "worker1"]
        while not all(f.exists() and f.read_text() for f in pid_files):
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.05)
        workers = [int(f.read_text()) for f in pid_files]
        os.kill(launcher.pid, signal.SIGKILL)  # the launcher only
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_running(pid) for pid in workers)
    finally:
        children.stop(launcher)
        for pid in workers:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def _running(pid):
    """Whether process `pid` runs (not ended, nor a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_launcher_passes_tf_config_and_succeeds():
    """Through the package's module, as the documentation starts it (the
    other tests start `keras_ctl_launch`, the same launcher without the
    package's import of TensorFlow)."""
    script = (
        "import json, os\n"
        "config = json.loads(os.environ['TF_CONFIG'])\n"
        "print(len(config['cluster']['worker']), config['task'], flush=True)\n"
    )
    result = children.run(
        [
            children.PYTHON,
            "-m",
            "keras_ctl.launch",
            "--workers",
            3,
            "--",
            children.PYTHON,
            "-c",
            script,
        ],
        timeout=60,
    )
    assert result.returncode == 0
    for index in range(3):
        line = f"[worker {index}] 3 {{'type': 'worker', 'index': {index}}}"
        assert line in result.stdout


def test_launcher_rejects_zero_workers():
    result = children.run(
        [*children.LAUNCHER, "--workers", 0, "--", "true"],
        timeout=60,
    )
    assert result.returncode == 2
    assert "Received: --workers 0" in result.stderr
