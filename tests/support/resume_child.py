"""A training run that may SIGKILL or SIGTERM itself, for the resume tests.

Usage: python resume_child.py CONFIG_JSON

CONFIG_JSON keys: model ("ctl" or "gan"), strategy ("default", "mirrored2"
or "multiworker"), backup_dir, output (JSON written at the end: weights, the
number of batches this run trained, the logs of each epoch and of each
batch this run trained; and beside it, OUTPUT.<index>.csv, the rows of a
`CSVLogger` appending across restarts), callback ("keras_ctl" or "keras"),
save_freq ("epoch" or an int), kill (null, or [epoch, batch] with batch -1
meaning "right after the epoch's backup"), marker (a file: the kill happens
only if it does not exist yet; it holds the time of the kill). Optional:
signal (SIGTERM instead of SIGKILL at `kill`), signal_worker (the one
worker that kills itself), signal_in_save (n: the n-th backup write gets
two SIGTERMs as it starts, once), progress (a file worker 0 writes at
`kill` instead of killing: the test then signals the job from outside),
accumulation ({"steps": k, "mode": ...}: gradient accumulation), shuffle
("arrays": Keras's `shuffle=True`; "dataset": a `tf.data` pipeline with
`shuffle(256)` and no seed of its own; default: no shuffling),
random_draws (the GAN's `compile(random_draws=...)`), epochs
(default 3), started (a file written when this process's first batch ends:
a parent may then kill the run at any moment of its training), floatx
(e.g. "float64", before any model is built).
"""

import json
import os
import signal
import sys
import time

config = json.loads(sys.argv[1])
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from keras_ctl import strategies  # noqa: E402

if config["strategy"] == "multiworker":
    strategy = strategies.multi_worker_strategy()
elif config["strategy"] == "mirrored2":
    strategy = strategies.local_mirrored_strategy(2)
else:
    strategy = None

import cases  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_ctl  # noqa: E402

strategy = strategy or tf.distribute.get_strategy()
EPOCHS = config.get("epochs", 3)
if config.get("floatx"):
    keras.config.set_floatx(config["floatx"])


class KillOnce(keras.callbacks.Callback):
    """SIGKILLs this process at (epoch, batch), once (a marker file remembers)."""

    def __init__(self, epoch, batch, marker):
        super().__init__()
        self.at, self.marker, self.epoch = (epoch, batch), marker, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def _maybe_kill(self, batch):
        if (self.epoch, batch) != self.at or os.path.exists(self.marker):
            return
        index = strategies.task_index()
        if config.get("progress"):
            if index == 0 and not os.path.exists(config["progress"]):
                open(config["progress"], "w").close()
            return
        if config.get("signal_worker", index) != index:
            return
        kill(self.marker, signal.SIGTERM if config.get("signal") else signal.SIGKILL)

    def on_train_batch_end(self, batch, logs=None):
        self._maybe_kill(batch)

    def on_epoch_end(self, epoch, logs=None):
        self._maybe_kill(-1)


def kill(marker, sig, times=1):
    with open(marker, "w") as f:
        f.write(str(time.time()))
    for _ in range(times):
        os.kill(os.getpid(), sig)


class Started(keras.callbacks.Callback):
    """Writes `config["started"]` when this process's first batch ends."""

    def on_train_batch_end(self, batch, logs=None):
        if not os.path.exists(config["started"]):
            open(config["started"], "w").close()


class EpochLogs(keras.callbacks.Callback):
    """Each epoch's logs, and the logs of each batch this run trained."""

    logs = {"epochs": {}, "batches": {}}

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.logs["batches"].setdefault(str(self.epoch), []).append(_floats(logs))

    def on_epoch_end(self, epoch, logs=None):
        self.logs["epochs"][str(epoch)] = _floats(logs)


def _floats(logs):
    return {name: float(value) for name, value in logs.items()}


class CountBatches(keras.callbacks.Callback):
    batches = 0

    def on_train_batch_end(self, batch, logs=None):
        CountBatches.batches += 1


def signal_in_save(model, nth, marker):
    """Makes the `nth` weights write start with two SIGTERMs (once)."""
    save_weights, calls = model.save_weights, []

    def saving(*args, **kwargs):
        calls.append(None)
        if len(calls) == nth and not os.path.exists(marker):
            kill(marker, signal.SIGTERM, times=2)
        return save_weights(*args, **kwargs)

    model.save_weights = saving


keras.utils.set_random_seed(0)
with strategy.scope():
    if config["model"] == "gan":
        model = cases.build_gan(label_noise=0.05)  # random mode: the stream matters
        model.compile(
            d_optimizer=keras.optimizers.Adam(3e-3),
            g_optimizer=keras.optimizers.Adam(4e-3),
            random_draws=config.get("random_draws") or "per_replica",
        )
        data = {"x": cases.gan_data()[0]}
    else:
        model, fit_kwargs, _ = cases.build("uneven", keras_ctl.CTLModel)
        accumulation = config.get("accumulation") or {}
        model.compile(
            optimizer=keras.optimizers.Adam(
                1e-3, gradient_accumulation_steps=accumulation.get("steps")
            ),
            loss=model.loss,
            metrics=["accuracy"],
            gradient_accumulation=accumulation.get("mode", "micro_batches"),
        )
        data = {"x": fit_kwargs["x"][:300], "y": fit_kwargs["y"][:300]}

save_freq = config["save_freq"]
backup_class = (
    keras_ctl.callbacks.BackupAndRestore
    if config["callback"] == "keras_ctl"
    else keras.callbacks.BackupAndRestore
)
index = json.loads(os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"][
    "index"
]
callbacks = [
    CountBatches(),
    backup_class(config["backup_dir"], save_freq=save_freq),
    EpochLogs(),
    # One file across the restarts: a resumed run appends its epochs' rows.
    keras.callbacks.CSVLogger(f"{config['output']}.{index}.csv", append=True),
]
if config["kill"]:
    killer = KillOnce(*config["kill"], config["marker"])
    if config.get("signal"):
        callbacks.insert(0, killer)  # the backup callback sees it at this batch
    else:
        callbacks.append(killer)  # batch -1: after the epoch's backup
if config.get("started"):
    callbacks.append(Started())
if config.get("signal_in_save"):
    signal_in_save(model, config["signal_in_save"], config["marker"])
shuffle = config.get("shuffle")
if shuffle == "dataset":
    pairs = tf.data.Dataset.from_tensor_slices((data["x"], data["y"]))
    data = {"x": pairs.shuffle(256).batch(32)}
model.fit(
    **data,
    **({} if shuffle == "dataset" else {"batch_size": 32}),
    epochs=EPOCHS,
    shuffle=shuffle == "arrays",
    verbose=0,
    callbacks=callbacks,
)

with open(f"{config['output']}.{index}", "w") as f:
    json.dump(
        {
            "weights": [w.tolist() for w in model.get_weights()],
            "batches": CountBatches.batches,
            "logs": EpochLogs.logs,
        },
        f,
    )
