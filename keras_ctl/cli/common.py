"""What the commands share: the strategy, the data, and the run's files."""

import csv
import json
import sys

import keras

from keras_ctl import datasets
from keras_ctl import strategies
from keras_ctl.demos import plots


def make_strategy(name, replicas):
    """The strategy `--strategy name --replicas replicas` asks for.

    Call it first: a mirrored strategy on CPU splits the CPU into logical
    devices, which only works before TensorFlow initializes its devices.
    """
    import tensorflow as tf

    if name == "auto":
        name = "mirrored" if replicas > 1 else "default"
    if name == "multiworker":
        return strategies.multi_worker_strategy()
    if name == "mirrored":
        return strategies.local_mirrored_strategy(replicas)
    if name == "onedevice":
        gpus = tf.config.list_physical_devices("GPU")
        return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
    return tf.distribute.get_strategy()


def load_data(name):
    """Loads `--dataset name`; exits with a clear message when offline."""
    try:
        return datasets.load(name)
    except RuntimeError as error:
        print(f"keras-ctl: error: {error}", file=sys.stderr)
        raise SystemExit(2) from error


def write_json(path, value):
    path.write_text(json.dumps(value, indent=2))


class HistoryFiles(keras.callbacks.Callback):
    """Writes `history.json` and `history.csv` into a folder after each epoch.

    The files hold every epoch of the run: a resumed run (`--resume`) reads
    the epochs written before it was killed and goes on numbering from
    there, overwriting any epoch it trains again. `learning_curves()` draws
    them.

    Args:
        folder: A `pathlib.Path` for the files.
        prefix: Put before every logged name (one prefix per `fit()` when a
            command trains several models into one history). Defaults to "".
    """

    def __init__(self, folder, prefix=""):
        super().__init__()
        self.folder = folder
        self.prefix = prefix
        path = folder / "history.json"
        self.history = json.loads(path.read_text()) if path.exists() else {}

    def on_epoch_end(self, epoch, logs=None):
        for name, value in (logs or {}).items():
            values = self.history.setdefault(self.prefix + name, [])
            del values[epoch:]
            values.append(float(value))
        self._write()

    def _write(self):
        write_json(self.folder / "history.json", self.history)
        epochs = max((len(values) for values in self.history.values()), default=0)
        with open(self.folder / "history.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["epoch", *self.history])
            for epoch in range(epochs):
                row = [
                    values[epoch] if epoch < len(values) else ""
                    for values in self.history.values()
                ]
                writer.writerow([epoch + 1, *row])

    def learning_curves(self, title=""):
        plots.learning_curves(self.history, self.folder / "learning_curves.png", title)


def validation_split(x, y, fraction=0.1):
    """`(x, y)` for training and the last `fraction` of them for validation,
    so that the test split stays unseen until the final evaluation."""
    count = max(1, int(len(x) * fraction))
    return (x[:-count], y[:-count]), (x[-count:], y[-count:])
