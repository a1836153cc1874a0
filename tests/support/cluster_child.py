"""One process of a cluster test job: a Slurm task (`srun`) or a pod of a
TFJob (`TF_CONFIG` as the operator writes it).

Usage: python cluster_child.py CONFIG_JSON

CONFIG_JSON keys: out (a folder), models (among "ctl" and "gan"),
strategy ("multiworker": `keras_ctl.strategies.multi_worker_strategy()`;
"parameter_server": `parameter_server_strategy()`, on the chief),
backup (optional: a folder for `keras_ctl.callbacks.BackupAndRestore`),
wait_at (optional: [epoch, batch] points of "ctl" where the processes
wait for SIGTERM, one a run: `WaitForSignal`), save (optional: the chief
saves "ctl" as `out/ctl.keras`). Under `TF_CONFIG` of task type `evaluator`, the process
waits for that file, evaluates the model and writes `out/evaluator_0.json`.

Everything trains in float64, batch 8 on 33 examples: the last batch has
one example, so under 2 replicas one of them is empty. Each process writes
`out/<task type>_<index>.json`: per model, the weights, the epochs' logs
(kept across restarts in `out/logs_<model>_<name>.json`) and the batches
this run trained; the chief adds `reference`: the same models trained by
`keras.Model` (the GAN alone) on one device, after the distributed run.
"""

import json
import os
import pathlib
import signal
import sys
import time

config = json.loads(sys.argv[1])
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
TASK = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})

from keras_ctl import strategies  # noqa: E402

if TASK.get("type") == "evaluator":  # outside the training cluster
    strategy = None
elif config["strategy"] == "parameter_server":
    strategy = strategies.parameter_server_strategy()
else:
    strategy = strategies.multi_worker_strategy()

import cases  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_ctl  # noqa: E402

keras.config.set_floatx("float64")
OUT = pathlib.Path(config["out"])
EXAMPLES, BATCH, EPOCHS = 33, 8, 3
resolver = getattr(strategy, "cluster_resolver", None)
if strategy is None:
    NAME = "evaluator_0"
elif resolver is not None and resolver.task_type is not None:
    NAME = f"{resolver.task_type}_{resolver.task_id}"
else:
    NAME = "chief_0"  # the coordinator of parameter servers


def ctl_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, 4))
    return x, (x[:, 0] + x[:, 1] > 0).astype("int32")


def ctl_model(model_class):
    init = keras.initializers.GlorotUniform
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(3, activation="tanh", kernel_initializer=init(1))
    outputs = keras.layers.Dense(2, kernel_initializer=init(2))(hidden(inputs))
    model = model_class(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def gan_model():
    gan = cases.build_gan()
    gan.compile(
        d_optimizer=keras.optimizers.Adam(3e-3), g_optimizer=keras.optimizers.Adam(4e-3)
    )
    return gan


def train(name, on, callbacks=()):
    """Fits model `name` under strategy `on`; returns weights and logs."""
    keras.utils.set_random_seed(0)
    with on.scope():
        model = ctl_model(keras_ctl.CTLModel) if name == "ctl" else gan_model()
    counted = BatchesAndLogs(OUT / f"logs_{name}_{NAME}.json")
    x, y = ctl_data() if name == "ctl" else cases.gan_data(EXAMPLES)
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=EPOCHS if name == "ctl" else 2,
        shuffle=False,
        verbose=0,
        callbacks=[*callbacks, counted],
    )
    TRAINED[name] = model
    return {
        "weights": [w.tolist() for w in model.get_weights()],
        "logs": counted.epochs,
        "batches": counted.batches,
    }


TRAINED = {}


def one_device(name):
    """What `keras.Model` (the GAN: itself) gives on one device."""
    keras.utils.set_random_seed(0)
    model = ctl_model(keras.Model) if name == "ctl" else gan_model()
    x, y = ctl_data() if name == "ctl" else cases.gan_data(EXAMPLES)
    epochs = EPOCHS if name == "ctl" else 2
    history = model.fit(
        x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0
    ).history
    logs = {
        str(epoch): {key: float(values[epoch]) for key, values in history.items()}
        for epoch in range(epochs)
    }
    evaluated = (
        model.evaluate(x, y, batch_size=BATCH, verbose=0) if name == "ctl" else None
    )
    return {
        "weights": [w.tolist() for w in model.get_weights()],
        "logs": logs,
        "evaluate": evaluated,
    }


class BatchesAndLogs(keras.callbacks.Callback):
    """The batches this run trained, and every epoch's logs, kept in `path`
    across restarts (a resumed run logs the epochs it ends)."""

    def __init__(self, path):
        super().__init__()
        self.path, self.batches = path, 0
        self.epochs = json.loads(path.read_text()) if path.exists() else {}

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def on_epoch_end(self, epoch, logs=None):
        self.epochs[str(epoch)] = {k: float(v) for k, v in logs.items()}
        self.path.write_text(json.dumps(self.epochs))


class WaitForSignal(keras.callbacks.Callback):
    """At each of `points` ((epoch, batch) pairs), once over the restarts,
    the chief writes `out/waiting_<i>` and every process waits until SIGTERM
    arrives (at most 120 s), noting when in `out/signalled_<i>_<name>`; the
    handler of `BackupAndRestore` (before this callback) still acts on it."""

    def __init__(self, points):
        super().__init__()
        self.points = [tuple(point) for point in points]
        self.epoch, self.arrived = 0, None

    def on_train_begin(self, logs=None):
        # This run's point: the first one no signal reached in earlier runs.
        self.point = sum(
            any(OUT.glob(f"signalled_{i}_*")) for i in range(len(self.points))
        )
        previous = signal.getsignal(signal.SIGTERM)

        def noted(signum, frame):
            if self.arrived is None:
                self.arrived = time.time()
                path = OUT / f"signalled_{self.point}_{NAME}"
                path.write_text(str(self.arrived))
            previous(signum, frame)

        signal.signal(signal.SIGTERM, noted)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (
            self.point == len(self.points)
            or (self.epoch, batch) != self.points[self.point]
        ):
            return
        if strategies.is_chief(strategy):
            (OUT / f"waiting_{self.point}").write_text(str(time.time()))
        deadline = time.monotonic() + 120
        while self.arrived is None and time.monotonic() < deadline:
            time.sleep(0.05)


def evaluate_saved_model():
    """The evaluator's work: the model the chief saved, evaluated."""
    path = OUT / "ctl.keras"
    deadline = time.monotonic() + 240
    while not path.exists():
        assert time.monotonic() < deadline, "the chief saved no model"
        time.sleep(0.2)
    model = keras.models.load_model(path)
    return {"evaluate": model.evaluate(*ctl_data(), batch_size=BATCH, verbose=0)}


if strategy is None:
    (OUT / f"{NAME}.json").write_text(json.dumps(evaluate_saved_model()))
    sys.exit(0)

results = {
    "cluster": resolver.cluster_spec().as_dict() if resolver else None,
    "resolver": type(resolver).__name__,
}
for name in config["models"]:
    callbacks = []
    if config.get("backup"):
        callbacks.append(keras_ctl.callbacks.BackupAndRestore(config["backup"]))
    if config.get("wait_at") and name == "ctl":
        callbacks.append(WaitForSignal(config["wait_at"]))
    results[name] = train(name, strategy, callbacks)
if strategies.is_chief(strategy):  # outside any scope: one device
    results["reference"] = {name: one_device(name) for name in config["models"]}
if config.get("save"):  # the chief's model, for an evaluator
    TRAINED["ctl"].save(OUT / "saving.keras")
    os.replace(OUT / "saving.keras", OUT / "ctl.keras")
(OUT / f"{NAME}.json").write_text(json.dumps(results))
