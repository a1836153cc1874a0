"""The seam's contract with Keras: every internal it reads or replaces
exists in the installed Keras (`.ci/compat` runs this at both ends of the
supported range), and every patch is listed once."""

import importlib

import keras
import numpy as np
import tensorflow as tf
from keras.src.backend.tensorflow.trainer import TFEpochIterator

from keras_ctl import _keras


def owner(path):
    """The module or class that `path` names."""
    module, _, name = path.rpartition(".")
    try:
        return importlib.import_module(path)
    except ImportError:
        return getattr(importlib.import_module(module), name)


def instances():
    """One live object of each class whose internals are set per instance."""
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    x, y = np.zeros((4, 3), "float32"), np.zeros((4, 2), "float32")
    model.fit(x, y, epochs=1, verbose=0)
    return {
        "Trainer": model,
        "TensorFlowTrainer": model,
        "CompileLoss": model._compile_loss,
        "BaseOptimizer": model.optimizer,
        "TFOptimizer": model.optimizer,
        "Variable": model.weights[0],
        "TFEpochIterator": TFEpochIterator(
            x=x, y=y, batch_size=2, distribute_strategy=tf.distribute.get_strategy()
        ),
        "Layer": model.layers[1],
    }


def test_every_keras_internal_the_seam_uses_exists():
    live = instances()
    missing = []
    for path, attribute in _keras.KERAS_INTERNALS:
        found = owner(path)
        instance = live.get(path.rpartition(".")[2])
        if not (hasattr(found, attribute) or hasattr(instance, attribute)):
            missing.append(f"{path}.{attribute}")
    assert missing == [], f"Keras {keras.__version__} lacks {missing}"


def test_each_patch_is_listed_once_with_what_it_replaces():
    installers = [install for install, _, _ in _keras.PATCHES]
    assert len(set(installers)) == len(installers) == 10
    for install, replaced, when in _keras.PATCHES:
        assert install.__doc__ and replaced and when
