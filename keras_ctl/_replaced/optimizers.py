"""`optimizer.apply` called by a step of one's own: the gradients summed
across replicas before Keras clips them (the behaviour of the seam's
`apply` rows), or captured instead of applied (`applies_captured`)."""

import contextlib
import threading
from collections.abc import Iterator
from typing import Any
from typing import NamedTuple

import tensorflow as tf

from keras_ctl._keras.behaviours import registered
from keras_ctl._keras.optimizers import gradients_already_summed
from keras_ctl._keras.state import in_step
from keras_ctl._replaced.seed_generators import NeedsEagerStep
from keras_ctl._replicas import current_reading
from keras_ctl._replicas import num_replicas
from keras_ctl._replicas import sum_across_replicas


@registered
def summing_apply(original):
    """`optimizer.apply(grads)` called by a step of one's own sums the
    gradients across replicas first, then applies the sum as it is.

    Keras clips each replica's part of the gradient in `apply`, before its
    all-reduce (`BaseOptimizer.apply`, `LossScaleOptimizer.apply` and
    `MultiOptimizer.apply`, each its own method), and a loss scale decides
    on that part. Here the sum comes first (one collective, where Keras
    made it), so clipping, the loss scale's check and the EMA see one
    device's gradient, as in the default step. Within `applies_captured`,
    any `apply` notes the gradients (so summed) instead of applying them.
    An optimizer the engine has not built (a layer's own, which keras.io's
    Forward-Forward applies inside the step) builds its variables in an
    eager step (`NeedsEagerStep`): built as a replica step is traced, its
    first variables would be made and the rest refused, leaving it marked
    built without them. Checked on Keras 3.12.0 and 3.15.1.
    """

    def apply(self, grads, trainable_variables=None):
        sums = (
            getattr(in_step, "active", False)
            and id(self) not in getattr(in_step, "summed", ())
            and num_replicas() > 1
            and tf.distribute.get_replica_context() is not None
        )
        if sums:
            grads, _ = sum_across_replicas(list(grads))
        if _captured(grads):
            return None
        if sums and not self.built and tf.inside_function():
            raise NeedsEagerStep(
                "An optimizer a traced step applies builds its variables in "
                "an eager step."
            )
        if not sums:
            return original(self, grads, trainable_variables)
        with gradients_already_summed(self):
            return original(self, grads, trainable_variables)

    return apply


class Applied(NamedTuple):
    """The gradients one `apply` was given (`applies_captured`)."""

    gradients: list[tf.Tensor | None]
    # How the code that applied them was read (`_replicas.current_reading`):
    # `"one_device"`, a step of one's own read as one device's code (its
    # replica's weighed and summed); `"declared"`, one that declared itself
    # in shares as it ran; `"unread"`, code under no reading (a step
    # written in shares from its first line, keras_ctl's own steps).
    reading: str


_capture_lock = threading.Lock()
# {thread ident: [Applied, ...]} while applies are captured.
_capture: dict[int, list[Applied]] | None = None


@contextlib.contextmanager
def applies_captured() -> Iterator[dict[int, list[Applied]]]:
    """Within it, `apply` (and so `apply_gradients`) of every optimizer, on
    any thread (a strategy's replica threads), applies nothing: it notes
    the gradients it would apply, summed across replicas as a step sums
    them, in the dict it yields, under the calling thread's ident. Every
    optimizer: a step may apply ones the model does not list (a layer's
    own, keras.io's Forward-Forward). Not nested."""
    global _capture
    noted: dict[int, list[Applied]] = {}
    with _capture_lock:
        if _capture is not None:
            raise RuntimeError("Applies are captured already.")
        _capture = noted
    try:
        yield noted
    finally:
        with _capture_lock:
            _capture = None


def _captured(grads: Any) -> bool:
    noted = _capture
    if noted is None:
        return False
    reading = current_reading()
    if reading is None or reading.kind != "step":
        read = "unread"
    else:
        read = "declared" if reading.in_shares else "one_device"
    applied = Applied(
        [None if g is None else tf.convert_to_tensor(g) for g in grads], read
    )
    with _capture_lock:
        noted.setdefault(threading.get_ident(), []).append(applied)
    return True
