"""A fit() killed with SIGKILL and restarted ends like an uninterrupted run."""

import json
import os

import children
import numpy as np
import pytest

pytestmark = pytest.mark.slow
TIMEOUT_S = 300


def run_child(config, workers=None):
    """Runs one training process (or a job of `workers`); returns its exit code."""
    command = [children.PYTHON, "resume_child.py", json.dumps(config)]
    if workers:
        command = [
            children.PYTHON,
            "-m",
            "keras_ctl.launch",
            "--workers",
            str(workers),
            "--grace",
            "5",
            "--",
        ] + command
    result = children.run(command, timeout=TIMEOUT_S)
    return result.returncode, children.output(result)


def final_weights(path):
    with open(path) as f:
        return [np.array(w) for w in json.load(f)["weights"]]


_REFERENCES = {}


def uninterrupted(tmp_path_factory, model, strategy, workers):
    """The uninterrupted run of (model, strategy), shared by the cases: the
    backup callback does not change training."""
    if (model, strategy) not in _REFERENCES:
        folder = tmp_path_factory.mktemp(f"reference_{model}_{strategy}")
        config = {
            "model": model,
            "strategy": strategy,
            "callback": "keras_ctl",
            "save_freq": "epoch",
            "kill": None,
            "marker": str(folder / "unused"),
            "backup_dir": str(folder / "backup"),
            "output": str(folder / "weights"),
        }
        code, log = run_child(config, workers)
        assert code == 0, log
        _REFERENCES[(model, strategy)] = config["output"]
    return _REFERENCES[(model, strategy)]


def interrupted_and_uninterrupted(tmp_path, tmp_path_factory, workers=None, **config):
    base = {
        "backup_dir": None,
        "callback": "keras_ctl",
        "save_freq": "epoch",
        "kill": None,
        "marker": str(tmp_path / "killed"),
        **config,
    }
    reference = {
        "output": uninterrupted(
            tmp_path_factory, config["model"], config["strategy"], workers
        )
    }
    resumed = dict(
        base, backup_dir=str(tmp_path / "backup"), output=str(tmp_path / "resumed")
    )
    code, log = run_child(resumed, workers)
    assert code != 0, "the first run should have been killed:\n" + log
    assert os.path.exists(resumed["marker"])
    assert os.listdir(resumed["backup_dir"]), "no backup was written before the kill"
    code, log = run_child(resumed, workers)
    assert code == 0, log
    return reference["output"], resumed["output"]


CASES = {
    # name: (config, workers)
    "ctl_epoch_stock_keras": (
        {"model": "ctl", "strategy": "default", "callback": "keras", "kill": [1, -1]},
        None,
    ),
    "ctl_mid_epoch_2_replicas": (
        {"model": "ctl", "strategy": "mirrored2", "save_freq": 3, "kill": [1, 4]},
        None,
    ),
    "gan_epoch_stock_keras": (
        {"model": "gan", "strategy": "default", "callback": "keras", "kill": [1, -1]},
        None,
    ),
    "gan_mid_epoch": (
        {"model": "gan", "strategy": "default", "save_freq": 2, "kill": [0, 2]},
        None,
    ),
    "gan_mid_epoch_2_replicas": (
        {"model": "gan", "strategy": "mirrored2", "save_freq": 2, "kill": [0, 2]},
        None,
    ),
    "ctl_two_workers_relaunched": (
        {"model": "ctl", "strategy": "multiworker", "kill": [1, -1]},
        2,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_resume_after_sigkill_matches_uninterrupted_run(
    name, tmp_path, tmp_path_factory
):
    config, workers = CASES[name]
    reference, resumed = interrupted_and_uninterrupted(
        tmp_path, tmp_path_factory, workers, **config
    )
    for index in range(workers or 1):
        got = final_weights(f"{resumed}.{index}")
        want = final_weights(f"{reference}.0")
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=1e-6, rtol=0)
