"""keras_ctl: exact custom training loops for Keras under any tf.distribute strategy."""

try:
    import tensorflow as _tf  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the install
    raise ImportError(
        "keras_ctl needs TensorFlow >= 2.16, which is not installed. Install "
        "it with `pip install 'keras-ctl[cpu]'` (CPU) or "
        "`pip install 'keras-ctl[gpu]'` (CUDA), or bring your own "
        "`tensorflow` package."
    ) from error

import keras as _keras

if _keras.backend.backend() != "tensorflow":  # pragma: no cover
    raise ImportError(
        "keras_ctl runs on the TensorFlow backend of Keras. Received: "
        f"KERAS_BACKEND={_keras.backend.backend()!r}. Set "
        "`KERAS_BACKEND=tensorflow` before importing Keras."
    )

from keras_ctl import callbacks
from keras_ctl import datasets
from keras_ctl import strategies
from keras_ctl.ctl_model import CTLModel
from keras_ctl.gan import GAN
from keras_ctl.optimization import minimize
from keras_ctl.reduction import ExampleMean
from keras_ctl.reduction import ReplicaSum
from keras_ctl.reduction import Synchronized
from keras_ctl.reduction import all_reduce_sum
from keras_ctl.reduction import global_mean
from keras_ctl.reduction import scaled_regularization_loss

__version__ = "0.1.0"


def __getattr__(name):
    # keras-tuner is optional: import the hook only when it is asked for.
    if name == "CTLHyperModel":
        from keras_ctl.tuning import CTLHyperModel

        return CTLHyperModel
    if name == "tuning":
        import importlib

        return importlib.import_module("keras_ctl.tuning")
    raise AttributeError(f"module 'keras_ctl' has no attribute {name!r}")


__all__ = [
    "CTLHyperModel",
    "CTLModel",
    "ExampleMean",
    "GAN",
    "ReplicaSum",
    "Synchronized",
    "all_reduce_sum",
    "callbacks",
    "datasets",
    "global_mean",
    "minimize",
    "scaled_regularization_loss",
    "strategies",
]
