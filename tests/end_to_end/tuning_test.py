"""keras-tuner with CTLModel and GAN: tuners, per-replica batch sizes,
step hyperparameters, many trials in one process, distributed search."""

import math
import os

import cases
import children
import devices
import keras
import keras_tuner
import numpy as np
import pytest
from tuning_cases import Classifier
from tuning_cases import RegularizedStep
from tuning_cases import classifier_data

import keras_ctl


class GANHyperModel(keras_ctl.CTLHyperModel):
    def build(self, hp):
        gan = cases.build_gan(
            d_steps=hp.Int("d_steps", 1, 2),
            label_noise=hp.Float("label_noise", 0.0, 0.1),
        )
        gan.compile(
            d_optimizer=keras.optimizers.Adam(
                hp.Float("d_lr", 1e-4, 1e-2, sampling="log")
            ),
            g_optimizer=keras.optimizers.Adam(
                hp.Float("g_lr", 1e-4, 1e-2, sampling="log")
            ),
        )
        return gan


class Recorder(keras.callbacks.Callback):
    """Records each trial's steps per epoch, hyperparameters and RSS."""

    def __init__(self):
        super().__init__()
        self.steps, self.hyperparameters, self.rss_mb = [], [], []

    def __deepcopy__(self, memo):
        return self  # keras-tuner copies callbacks per trial; keep one record

    def on_train_begin(self, logs=None):
        self.steps.append(self.params["steps"])
        self.hyperparameters.append(dict(getattr(self.model, "hyperparameters", {})))

    def on_train_end(self, logs=None):
        with open("/proc/self/status") as f:
            rss_kb = next(
                int(line.split()[1]) for line in f if line.startswith("VmRSS")
            )
        self.rss_mb.append(rss_kb / 1024)


def scores(tuner):
    return [t.score for t in tuner.oracle.trials.values() if t.score is not None]


# RandomSearch runs 5 trials: in one process, their memory stays bounded.
TUNERS = {
    "random": lambda **kw: keras_tuner.RandomSearch(max_trials=5, **kw),
    "bayesian": lambda **kw: keras_tuner.BayesianOptimization(max_trials=2, **kw),
    "hyperband": lambda **kw: keras_tuner.Hyperband(max_epochs=2, factor=2, **kw),
    "grid": lambda **kw: keras_tuner.GridSearch(max_trials=3, **kw),
}


@pytest.mark.parametrize("name", list(TUNERS))
def test_tuners_search_a_ctlmodel_under_mirrored(name, tmp_path):
    (x, y), (x_val, y_val) = classifier_data()
    recorder = Recorder()
    tuner = TUNERS[name](
        hypermodel=Classifier(),
        objective="val_accuracy",
        distribution_strategy=devices.get("mirrored"),
        directory=str(tmp_path),
        project_name=name,
        seed=1,
    )
    tuner.search(
        x,
        y,
        epochs=2,
        batch_size=16,
        validation_data=(x_val, y_val),
        verbose=0,
        callbacks=[recorder],
    )
    found = scores(tuner)
    # Hyperband with max_epochs=2, factor=2 runs its own bracket of trials.
    expected_trials = {"grid": 3, "random": 5}.get(name, 2)
    if name == "hyperband":
        expected_trials = len(tuner.oracle.trials)
    assert len(found) == len(tuner.oracle.trials) == expected_trials >= 2
    assert len(recorder.rss_mb) == expected_trials  # no collective errors
    if name == "random":  # many trials in one process stay bounded
        growth = recorder.rss_mb[-1] - recorder.rss_mb[0]
        print(
            f"RSS after trial 1: {recorder.rss_mb[0]:.0f} MB, after 5: "
            f"{recorder.rss_mb[-1]:.0f} MB"
        )
        assert growth < 150
    if name == "grid":  # the first three grid points, in order
        assert [t.hyperparameters.values for t in tuner.oracle.trials.values()] == [
            {"units": 4, "lr": 1e-3},
            {"units": 4, "lr": 1e-2},
            {"units": 8, "lr": 1e-3},
        ]
    assert all(0.0 <= s <= 1.0 for s in found)
    best_trial = tuner.oracle.get_best_trials(1)[0]
    assert best_trial.score == max(found)  # "max" inferred for accuracy
    best = tuner.get_best_models(1)[0]
    assert isinstance(best, keras_ctl.CTLModel)
    evaluation = best.evaluate(x_val, y_val, verbose=0, return_dict=True)
    assert evaluation["accuracy"] == pytest.approx(best_trial.score, abs=1e-5)


def test_gan_objective_g_loss_is_minimised(tmp_path):
    x, latents = cases.gan_data(64)
    tuner = keras_tuner.RandomSearch(
        GANHyperModel(batch_sizes_per_replica=8),
        objective=keras_ctl.tuning.objective("g_loss"),
        max_trials=3,
        distribution_strategy=devices.get("mirrored"),
        directory=str(tmp_path),
        seed=2,
    )
    tuner.search(x, epochs=1, verbose=0)
    found = scores(tuner)
    assert len(found) == 3 and all(np.isfinite(found))
    assert tuner.oracle.objective.direction == "min"
    assert tuner.oracle.get_best_trials(1)[0].score == min(found)
    best = tuner.get_best_models(1)[0]
    assert isinstance(best, keras_ctl.GAN)
    assert best.generator(latents[:4, 0]).shape == (4, 8, 8, 1)


def test_batch_size_is_per_replica_and_step_sees_hyperparameters(tmp_path):
    (x, y), _ = classifier_data()
    recorder = Recorder()
    tuner = keras_tuner.RandomSearch(
        Classifier(RegularizedStep, batch_sizes_per_replica=[8, 16]),
        objective=keras_ctl.tuning.objective("accuracy"),
        max_trials=3,
        distribution_strategy=devices.get("mirrored"),
        directory=str(tmp_path),
        seed=3,
    )
    tuner.search(x, y, epochs=1, verbose=0, callbacks=[recorder])
    trials = sorted(tuner.oracle.trials.values(), key=lambda t: int(t.trial_id))
    assert len(trials) == len(recorder.steps) == len(recorder.hyperparameters) == 3
    for trial, steps, seen in zip(trials, recorder.steps, recorder.hyperparameters):
        per_replica = trial.hyperparameters.get("batch_size_per_replica")
        assert steps == math.ceil(96 / (2 * per_replica))  # 2 replicas
        assert seen == trial.hyperparameters.values
        assert 0.0 <= seen["reg"] <= 0.01


def test_ctlhypermodel_rejects_bad_batch_sizes():
    with pytest.raises(ValueError, match=r"Received: batch_sizes_per_replica=\[0\]"):
        keras_ctl.CTLHyperModel(batch_sizes_per_replica=[0])


def test_import_without_keras_tuner_names_the_extra():
    code = (
        "import sys\n"
        "sys.modules['keras_tuner'] = None  # as if it were not installed\n"
        "import keras_ctl\n"
        "from keras_ctl import *  # noqa\n"
        "print('star import:', sorted(n for n in dir() if n[0].isupper()))\n"
        "try:\n"
        "    keras_ctl.CTLHyperModel\n"
        "except ImportError as error:\n"
        "    print('ERROR:', error)\n"
    )
    result = children.run([children.PYTHON, "-c", code], timeout=120)
    assert "keras-ctl[tune]" in result.stdout, children.output(result)
    assert (
        "star import: ['CTLModel', 'ExampleMean', 'GAN', 'ReplicaSum', "
        "'Synchronized']" in result.stdout
    )


def test_distributed_search_with_an_oracle_and_two_workers(tmp_path):
    from keras_ctl.launch import free_ports

    port = free_ports(1)[0]
    base = dict(
        os.environ,
        KERASTUNER_ORACLE_IP="127.0.0.1",
        KERASTUNER_ORACLE_PORT=str(port),
    )
    processes = {
        tuner_id: children.start(
            [children.PYTHON, "tune_child.py", tmp_path],
            env=dict(base, KERASTUNER_TUNER_ID=tuner_id),
        )
        for tuner_id in ("chief", "tuner0", "tuner1")
    }
    results = {}
    try:
        for tuner_id in ("tuner0", "tuner1", "chief"):
            results[tuner_id] = children.finish(processes[tuner_id], 240)
    finally:
        for process in processes.values():
            children.stop(process)
    for tuner_id, result in results.items():
        assert result.returncode == 0, f"{tuner_id}:\n{children.output(result)}"
    outputs = {tuner_id: result.stdout for tuner_id, result in results.items()}
    trials = [
        line
        for tuner_id in ("tuner0", "tuner1")
        for line in outputs[tuner_id].splitlines()
        if line.startswith("TRIALS RUN:")
    ]
    counts = [int(line.split(":")[1]) for line in trials]
    assert len(counts) == 2 and sum(counts) == 4 and min(counts) >= 1
