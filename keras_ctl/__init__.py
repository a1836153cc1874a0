"""keras_ctl: exact custom training loops for Keras under any tf.distribute strategy.

The public surface, re-exported here:

- `CTLModel`, `GAN`: models whose `fit()` is exact under any strategy.
- building blocks for custom steps (`keras_ctl.blocks`): `global_mean`,
  `scaled_regularization_loss`, `minimize`, `all_reduce_sum`,
  `num_replicas`, `written_in_shares`, and for losses over the global
  batch `all_gather` and `row_offset`;
- typed step outputs (`keras_ctl.outputs`): `ReplicaSum`, `ExampleMean`,
  `Synchronized`;
- modules: `callbacks` (`BackupAndRestore`), `strategies`, `datasets`,
  `testing` (the parity kit, `assert_replica_invariant`), `launch`, and
  `tuning` (`CTLHyperModel`; needs keras-tuner, imported
  when first used).
"""

__version__ = "0.1.0"

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from keras_ctl import _compat

_compat.check_versions()

try:
    import tensorflow as _tf  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the install
    raise ImportError(
        "keras_ctl needs TensorFlow, which is not installed. Install it with "
        "`pip install 'keras-ctl[cpu]'` (CPU) or `pip install 'keras-ctl[gpu]'` "
        "(CUDA), or bring your own `tensorflow` package."
    ) from error

import keras as _keras_module  # noqa: E402

if _keras_module.backend.backend() != "tensorflow":  # pragma: no cover
    raise ImportError(
        "keras_ctl runs on the TensorFlow backend of Keras. Received: "
        f"KERAS_BACKEND={_keras_module.backend.backend()!r}. Set "
        "`KERAS_BACKEND=tensorflow` before importing Keras."
    )

from keras_ctl import callbacks  # noqa: E402
from keras_ctl import datasets  # noqa: E402
from keras_ctl import strategies  # noqa: E402
from keras_ctl import testing  # noqa: E402
from keras_ctl.blocks import all_gather  # noqa: E402
from keras_ctl.blocks import all_reduce_sum  # noqa: E402
from keras_ctl.blocks import global_mean  # noqa: E402
from keras_ctl.blocks import minimize  # noqa: E402
from keras_ctl.blocks import num_replicas  # noqa: E402
from keras_ctl.blocks import row_offset  # noqa: E402
from keras_ctl.blocks import scaled_regularization_loss  # noqa: E402
from keras_ctl.blocks import written_in_shares  # noqa: E402
from keras_ctl.gan import GAN  # noqa: E402
from keras_ctl.model import CTLModel  # noqa: E402
from keras_ctl.outputs import ExampleMean  # noqa: E402
from keras_ctl.outputs import ReplicaSum  # noqa: E402
from keras_ctl.outputs import Synchronized  # noqa: E402

if _TYPE_CHECKING:
    # What `__getattr__` gives, typed for type checkers.
    from keras_ctl import tuning as tuning
    from keras_ctl.tuning import CTLHyperModel as CTLHyperModel


def __getattr__(name: str) -> _Any:
    # keras-tuner is optional: import the hook only when it is asked for.
    if name == "CTLHyperModel":
        from keras_ctl.tuning import CTLHyperModel

        return CTLHyperModel
    if name == "tuning":
        import importlib

        return importlib.import_module("keras_ctl.tuning")
    raise AttributeError(f"module 'keras_ctl' has no attribute {name!r}")


# `CTLHyperModel` and `tuning` are public too, but left out of `__all__`:
# `from keras_ctl import *` must work without keras-tuner installed.
__all__ = [
    "CTLModel",
    "ExampleMean",
    "GAN",
    "ReplicaSum",
    "Synchronized",
    "all_gather",
    "all_reduce_sum",
    "callbacks",
    "datasets",
    "global_mean",
    "minimize",
    "num_replicas",
    "row_offset",
    "scaled_regularization_loss",
    "strategies",
    "testing",
    "written_in_shares",
]
