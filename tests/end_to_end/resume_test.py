"""A fit() killed with SIGKILL and restarted ends like an uninterrupted run."""

import json
import os
import signal
import time

import children
import numpy as np
import pytest

from keras_ctl.callbacks import SAVED_ON_NOTICE

TIMEOUT_S = 300


def child_command(config, workers=None, restarts=0):
    """One training process, or a job of `workers` started by the launcher."""
    command = [children.PYTHON, "resume_child.py", json.dumps(config)]
    if workers:
        launcher = [*children.LAUNCHER, "--workers", workers]
        options = ["--grace", 5, "--restarts", restarts, "--"]
        command = launcher + options + command
    return command


def run_child(config, workers=None, restarts=0):
    """Runs one training process (or a job of `workers`); returns its exit code."""
    result = children.run(child_command(config, workers, restarts), timeout=TIMEOUT_S)
    return result.returncode, children.output(result)


def final_weights(path):
    with open(path) as f:
        return [np.array(w) for w in json.load(f)["weights"]]


_REFERENCES = {}


def child_config(folder, **config):
    """A `resume_child.py` config: keras_ctl's callback, a backup each epoch,
    no kill, its files in `folder`; `config` overrides."""
    return {
        "callback": "keras_ctl",
        "save_freq": "epoch",
        "kill": None,
        "marker": str(folder / "signalled"),
        "backup_dir": str(folder / "backup"),
        "output": str(folder / "resumed"),
        **config,
    }


def uninterrupted(
    tmp_path_factory,
    model,
    strategy,
    workers,
    accumulation=None,
    shuffle=None,
    random_draws=None,
):
    """The uninterrupted run of (model, strategy, accumulation, shuffle,
    random_draws), shared by the cases: the backup callback does not
    change training."""
    key = (model, strategy, json.dumps(accumulation), shuffle, random_draws)
    if key not in _REFERENCES:
        folder = tmp_path_factory.mktemp(f"reference_{model}_{strategy}")
        config = child_config(
            folder,
            model=model,
            strategy=strategy,
            accumulation=accumulation,
            shuffle=shuffle,
            random_draws=random_draws,
        )
        code, log = run_child(config, workers)
        assert code == 0, log
        _REFERENCES[key] = config["output"]
    return _REFERENCES[key]


def interrupted_and_uninterrupted(
    tmp_path, tmp_path_factory, workers=None, then=None, **config
):
    """Runs `config` killed, then again to its end: on the same topology, or
    on `then` (`{"strategy": ..., "workers": ...}`), when the reference is
    the uninterrupted run on one device. Returns both outputs' paths."""
    reference_on = (config["strategy"], workers) if then is None else ("default", None)
    reference = uninterrupted(
        tmp_path_factory,
        config["model"],
        reference_on[0],
        reference_on[1],
        config.get("accumulation"),
        config.get("shuffle"),
        config.get("random_draws"),
    )
    resumed = child_config(tmp_path, **config)
    code, log = run_child(resumed, workers)
    assert code != 0, "the first run should have been killed:\n" + log
    assert os.path.exists(resumed["marker"])
    assert os.listdir(resumed["backup_dir"]), "no backup was written before the kill"
    if then is not None:
        resumed["strategy"], workers = then["strategy"], then.get("workers")
    code, log = run_child(resumed, workers)
    assert code == 0, log
    return reference, resumed["output"], workers


def assert_same_logs(resumed, reference, index=0):
    """The resumed run's epochs log what the uninterrupted run's log, and
    its batches what the same batches logged there (the last ones of the
    resumed epoch); on the chief (worker `index` 0: the others write no
    file), a `CSVLogger` appending across the restart wrote the
    uninterrupted run's rows."""
    resumed, reference = f"{resumed}.{index}", f"{reference}.0"
    if index == 0:
        rows = [
            np.genfromtxt(f"{path}.csv", delimiter=",", skip_header=1)  # NA: nan
            for path in (resumed, reference)
        ]
        assert rows[0].shape == rows[1].shape
        np.testing.assert_allclose(rows[0], rows[1], rtol=1e-6, atol=1e-7)
    with open(resumed) as f:
        got = json.load(f)["logs"]
    with open(reference) as f:
        want = json.load(f)["logs"]
    assert got["epochs"], "the resumed run logged no epoch"
    for epoch, logs in got["epochs"].items():
        assert logs == pytest.approx(want["epochs"][epoch], rel=1e-6, abs=1e-7)
        batches = got["batches"][epoch]
        tail = want["batches"][epoch][-len(batches) :]
        assert len(batches) == len(tail)
        for position, (g, w) in enumerate(zip(batches, tail)):
            assert g == pytest.approx(w, rel=1e-6, abs=1e-7), (epoch, position)


# Same-topology moves of every pipeline and of gradient accumulation are
# the generated moves (`topology_moves_test.py`); these kill for real.
CASES = {
    # name: (config, workers)
    "ctl_epoch_stock_keras": (
        {"model": "ctl", "strategy": "default", "callback": "keras", "kill": [1, -1]},
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
    "ctl_shuffled_pipeline_at_epoch_end": (
        {"model": "ctl", "strategy": "default", "kill": [0, -1], "shuffle": "dataset"},
        None,
    ),
    "ctl_shuffled_pipeline_two_workers": (
        {
            "model": "ctl",
            "strategy": "multiworker",
            "save_freq": 3,
            "kill": [1, 4],
            "shuffle": "dataset",
        },
        2,
    ),
}


# A backup resumed on another topology, killed for real: the run ends as
# the uninterrupted run on one device ends, and logs what it logs (moves
# between replica counts are the generated ones, `topology_moves_test.py`).
MOVES = {
    # name: (config, workers before, topology after)
    "ctl_1_replica_to_2_workers": (
        {"model": "ctl", "strategy": "default", "save_freq": 3, "kill": [1, 4]},
        None,
        {"strategy": "multiworker", "workers": 2},
    ),
    "ctl_2_workers_to_1_shuffled_pipeline": (
        {
            "model": "ctl",
            "strategy": "multiworker",
            "save_freq": 3,
            "kill": [1, 4],
            "shuffle": "dataset",
        },
        2,
        {"strategy": "default"},
    ),
    "ctl_2_workers_to_2_replicas_of_1_worker": (
        {"model": "ctl", "strategy": "multiworker", "save_freq": 3, "kill": [0, 7]},
        2,
        {"strategy": "mirrored2"},
    ),
    # Its latents and label noise drawn as one device (per replica, a GAN
    # resumed from 1 replica on 2 ends 3e-3 off).
    "gan_drawing_as_one_device_1_replica_to_2": (
        {
            "model": "gan",
            "strategy": "default",
            "save_freq": 2,
            "kill": [0, 2],
            "random_draws": "as_one_device",
        },
        None,
        {"strategy": "mirrored2"},
    ),
}


@pytest.mark.parametrize("name", list(MOVES))
def test_a_backup_resumes_on_another_topology(name, tmp_path, tmp_path_factory):
    config, workers, then = MOVES[name]
    reference, resumed, workers = interrupted_and_uninterrupted(
        tmp_path, tmp_path_factory, workers, then, **config
    )
    for index in range(workers or 1):
        got = final_weights(f"{resumed}.{index}")
        for g, w in zip(got, final_weights(f"{reference}.0"), strict=True):
            np.testing.assert_allclose(g, w, atol=1e-6, rtol=0)
        assert_same_logs(resumed, reference, index)


@pytest.mark.parametrize("name", list(CASES))
def test_resume_after_sigkill_matches_uninterrupted_run(
    name, tmp_path, tmp_path_factory
):
    config, workers = CASES[name]
    reference, resumed, workers = interrupted_and_uninterrupted(
        tmp_path, tmp_path_factory, workers, **config
    )
    for index in range(workers or 1):
        got = final_weights(f"{resumed}.{index}")
        want = final_weights(f"{reference}.0")
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=1e-6, rtol=0)
        assert_same_logs(resumed, reference, index)


# SIGTERM: save on notice, exit 42, resume with the batches that were left.
# ctl: 300 examples, batch 32: 10 batches an epoch; gan: 101, 4 an epoch.
SIGTERM_CASES = {
    # name: (config, batches trained before the signal's backup)
    "ctl_2_replicas": (
        {"model": "ctl", "strategy": "mirrored2", "kill": [1, 4], "signal": True},
        15,
    ),
    "gan_2_replicas": (
        {"model": "gan", "strategy": "mirrored2", "kill": [1, 2], "signal": True},
        7,
    ),
    # Two SIGTERMs as the third backup (save_freq=2) starts writing: that
    # backup completes, then the process ends without writing another.
    "ctl_two_signals_while_saving": (
        {"model": "ctl", "strategy": "mirrored2", "save_freq": 2, "signal_in_save": 3},
        6,
    ),
}
TOTAL_BATCHES = {"ctl": 30, "gan": 12}
GRACE_PERIOD_S = 30


@pytest.mark.parametrize("name", list(SIGTERM_CASES))
def test_sigterm_saves_and_the_restart_trains_only_what_was_left(
    name, tmp_path, tmp_path_factory
):
    config, done = SIGTERM_CASES[name]
    config = child_config(tmp_path, **config)
    code, log = run_child(config)
    ended = time.time()
    assert code == SAVED_ON_NOTICE, log
    with open(config["marker"]) as f:
        assert ended - float(f.read()) < GRACE_PERIOD_S
    with open(os.path.join(config["backup_dir"], "training_metadata.json")) as f:
        position = json.load(f)
    per_epoch = TOTAL_BATCHES[config["model"]] // 3
    assert position["epoch"] * per_epoch + position["batches_done"] == done

    code, log = run_child(config)
    assert code == 0, log
    with open(f"{config['output']}.0") as f:
        resumed = json.load(f)
    assert resumed["batches"] == TOTAL_BATCHES[config["model"]] - done
    reference = uninterrupted(
        tmp_path_factory, config["model"], config["strategy"], None
    )
    for got, want in zip(
        final_weights(f"{config['output']}.0"),
        final_weights(f"{reference}.0"),
        strict=True,
    ):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


def notice_config(tmp_path, **config):
    """Two workers of the CTLModel case, SIGTERM in epoch 2, batch 5."""
    return child_config(
        tmp_path,
        model="ctl",
        strategy="multiworker",
        kill=[1, 4],
        signal=True,
        **config,
    )


def assert_resumed_like_uninterrupted(config, tmp_path_factory, left, workers=2):
    reference = uninterrupted(tmp_path_factory, "ctl", "multiworker", workers)
    for index in range(workers):
        with open(f"{config['output']}.{index}") as f:
            assert json.load(f)["batches"] == left
        got = final_weights(f"{config['output']}.{index}")
        for g, w in zip(got, final_weights(f"{reference}.0"), strict=True):
            np.testing.assert_allclose(g, w, atol=1e-6, rtol=0)


def test_a_notice_to_one_worker_stops_both_at_the_same_step(tmp_path, tmp_path_factory):
    """Worker 1 alone gets SIGTERM after batch 5 of epoch 2; the notice rides
    the next step's all-reduce, both workers stop after batch 6 (16 of 30
    trained), the chief's backup holds it, and `--restarts 1` resumes the
    14 batches that were left."""
    config = notice_config(tmp_path, signal_worker=1)
    result = children.run(child_command(config, 2, restarts=1), timeout=TIMEOUT_S)
    assert result.returncode == 0, children.output(result)
    assert "workers saved on notice; restarting" in result.stdout
    assert os.path.exists(config["marker"])
    assert_resumed_like_uninterrupted(config, tmp_path_factory, left=14)


def test_sigterm_to_the_launcher_reaches_every_worker(tmp_path, tmp_path_factory):
    """SIGTERM sent to `keras-ctl launch` mid-epoch: every worker saves at the
    same step and the job ends with 42 within the grace period."""
    progress = tmp_path / "progress"
    config = notice_config(tmp_path, progress=str(progress))
    job = children.start(child_command(config, workers=2))
    try:
        deadline = time.time() + TIMEOUT_S
        while not progress.exists() and job.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert progress.exists(), "the job never reached epoch 2"
        signalled = time.time()
        job.send_signal(signal.SIGTERM)  # the launcher only, not its group
        result = children.finish(job, TIMEOUT_S)
    finally:
        children.stop(job)
    assert time.time() - signalled < GRACE_PERIOD_S
    assert result.returncode == SAVED_ON_NOTICE, children.output(result)
    with open(os.path.join(config["backup_dir"], "training_metadata.json")) as f:
        position = json.load(f)
    done = position["epoch"] * 10 + position["batches_done"]
    assert 15 <= done < 30  # after the progress mark, before the end
    code, log = run_child(config, workers=2)
    assert code == 0, log
    assert_resumed_like_uninterrupted(config, tmp_path_factory, left=30 - done)
