"""Generated topology moves: a run stopped at a drawn moment and resumed
from its backup on another replica count ends as the uninterrupted run on
one device ends, and logs what it logs.

A move is drawn, not chosen (`draw`): the replica counts before and after,
the model family, the data pipeline, the backup frequency and the moment
the run stops. The run stops the way a killed process leaves its backup
(an exception after the batch's backup, so `on_train_end` never runs); one
process runs every move of its replica count (one device set per process),
`topology_moves_child.py`.
"""

import json
import os
import random

import keras
import numpy as np
import tensorflow as tf

import keras_ctl

FAMILIES = ("mlp", "mlp_accumulating", "mlp_two_outputs")
PIPELINES = ("arrays", "shuffled_arrays", "seeded_dataset", "dataset_own_seed")
EXAMPLES, BATCH, EPOCHS = 90, 16, 3  # 6 batches an epoch, the last of 10
BATCHES = -(-EXAMPLES // BATCH)


def draw(seed, count, replica_counts):
    """`count` moves drawn from `seed`: dicts of `name`, `before`, `after`
    (replica counts), `family`, `pipeline`, `save_freq` and `stop`
    (`[epoch, batch]`, batch -1 for the epoch's end with epoch backups)."""
    rng = random.Random(seed)
    moves = []
    for index in range(count):
        save_freq = rng.choice(["epoch", 1, 2, 3, 4])
        # Any moment but the end of training (nothing would be left).
        epoch = rng.randrange(EPOCHS - 1 if save_freq == "epoch" else EPOCHS)
        last = BATCHES - 1 if epoch == EPOCHS - 1 else BATCHES
        stop = [epoch, -1 if save_freq == "epoch" else rng.randrange(last)]
        moves.append(
            {
                "name": f"move{seed}_{index}",
                "before": rng.choice(replica_counts),
                "after": rng.choice(replica_counts),
                "family": rng.choice(FAMILIES),
                "pipeline": rng.choice(PIPELINES),
                "save_freq": save_freq,
                "stop": stop,
            }
        )
    return moves


class Stopped(Exception):
    """Ends a run the way a kill would, after the batch's backup."""


class StopAt(keras.callbacks.Callback):
    def __init__(self, epoch, batch):
        super().__init__()
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise Stopped

    def on_epoch_end(self, epoch, logs=None):
        if (epoch, -1) == self.at:
            raise Stopped


class Logs(keras.callbacks.Callback):
    """Each epoch's logs, and those of each batch this run trained."""

    def __init__(self):
        super().__init__()
        self.logs = {"epochs": {}, "batches": {}}

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        batches = self.logs["batches"].setdefault(str(self.epoch), [])
        batches.append(_floats(logs))

    def on_epoch_end(self, epoch, logs=None):
        self.logs["epochs"][str(epoch)] = _floats(logs)


def _floats(logs):
    return {name: float(np.asarray(value)) for name, value in logs.items()}


def data():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(EXAMPLES, 5))
    y = (x[:, 0] + x[:, 1] > 0).astype("int64") + (x[:, 2] > 1).astype("int64")
    return x, y


def build(family, strategy):
    """A model of `family`, compiled, under `strategy` (float64 when
    `keras.config.floatx()` is)."""
    keras.utils.set_random_seed(0)
    with strategy.scope():
        inputs = keras.Input((5,))
        hidden = keras.layers.Dense(
            8,
            activation="relu",
            kernel_regularizer=keras.regularizers.L2(1e-3),
        )(inputs)
        outputs = keras.layers.Dense(3, name="classes")(hidden)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        metrics = ["accuracy"]
        if family == "mlp_two_outputs":
            score = keras.layers.Dense(1, name="score")(hidden)
            outputs = {"classes": outputs, "score": score}
            loss = {"classes": loss, "score": "mse"}
            metrics = {"classes": ["accuracy"], "score": ["mae"]}
        model = keras_ctl.CTLModel(inputs, outputs)
        accumulating = family == "mlp_accumulating"
        model.compile(
            optimizer=keras.optimizers.Adam(
                1e-2, gradient_accumulation_steps=3 if accumulating else None
            ),
            loss=loss,
            metrics=metrics,
            **({"gradient_accumulation": "examples"} if accumulating else {}),
        )
    return model


def fit(move, strategy, callbacks):
    """Fits a new model of `move`'s family on its pipeline; returns it."""
    model = build(move["family"], strategy)
    x, y = data()
    if move["family"] == "mlp_two_outputs":
        y = {"classes": y, "score": x[:, :1] * 0.5}
    kwargs = {"x": x, "y": y, "batch_size": BATCH}
    pipeline = move["pipeline"]
    if pipeline in ("seeded_dataset", "dataset_own_seed"):
        seed = 3 if pipeline == "dataset_own_seed" else None
        pairs = tf.data.Dataset.from_tensor_slices((x, y))
        kwargs = {"x": pairs.shuffle(EXAMPLES, seed=seed).batch(BATCH)}
    model.fit(
        **kwargs,
        epochs=EPOCHS,
        shuffle=pipeline == "shuffled_arrays",
        verbose=0,
        callbacks=callbacks,
    )
    return model


def backup(move, folder):
    return keras_ctl.callbacks.BackupAndRestore(
        os.path.join(folder, move["name"]),
        save_freq=move["save_freq"],
        save_on_signals=(),
    )


def run_before(move, strategy, folder):
    """Trains `move` until its stop; leaves its backup in `folder`."""
    try:
        fit(move, strategy, [backup(move, folder), StopAt(*move["stop"])])
    except Stopped:
        return
    raise AssertionError(f"{move['name']} never reached its stop {move['stop']}")


def run_after(move, strategy, folder):
    """Resumes `move` from its backup to the end: `{"weights", "logs"}`."""
    logs = Logs()
    model = fit(move, strategy, [backup(move, folder), logs])
    return {"weights": [w.tolist() for w in model.get_weights()], "logs": logs.logs}


def run_reference(move, strategy):
    """The uninterrupted run of `move`'s family and pipeline."""
    logs = Logs()
    model = fit(move, strategy, [logs])
    return {"weights": [w.tolist() for w in model.get_weights()], "logs": logs.logs}


def batches_left(move):
    """Batches a resumed run of `move` trains: those after its last backup."""
    epoch, batch = move["stop"]
    if move["save_freq"] == "epoch":
        return (EPOCHS - epoch - 1) * BATCHES
    done = epoch * BATCHES + batch + 1
    return EPOCHS * BATCHES - done // move["save_freq"] * move["save_freq"]


def batches_trained(run):
    return sum(len(batches) for batches in run["logs"]["batches"].values())


def reference_key(move):
    return f"{move['family']}/{move['pipeline']}"


def largest_differences(resumed, reference):
    """(largest weight difference, largest relative log difference) of a
    resumed run against the uninterrupted run: the resumed run's epochs
    against the same epochs, and its batches against the last batches of
    its first epoch there."""
    weights = max(
        float(np.max(np.abs(np.asarray(g) - np.asarray(w))))
        for g, w in zip(resumed["weights"], reference["weights"], strict=True)
    )
    logs = 0.0
    got, want = resumed["logs"], reference["logs"]
    if not got["epochs"]:
        return weights, float("inf")
    for epoch, epoch_logs in got["epochs"].items():
        batches = got["batches"][epoch]
        tail = want["batches"][epoch][-len(batches) :]
        pairs = [(epoch_logs, want["epochs"][epoch]), *zip(batches, tail, strict=True)]
        for g, w in pairs:
            if set(g) != set(w):
                return weights, float("inf")
            for name in g:
                logs = max(logs, abs(g[name] - w[name]) / max(abs(w[name]), 1e-12))
    return weights, logs


def save(path, value):
    with open(path, "w") as f:
        json.dump(value, f)
