"""Optimizers inside a replica step: summed gradients applied as they are,
the EMA after the replicas' step, gradient accumulation's counters, and
the gradients a step would apply, captured instead (`applies_captured`)."""

import contextlib
import threading
from collections.abc import Iterator
from typing import Any
from typing import NamedTuple

import keras
import tensorflow as tf

from keras_ctl._keras import names
from keras_ctl._keras.behaviours import registered
from keras_ctl._keras.state import in_step
from keras_ctl._replicas import current_reading
from keras_ctl._replicas import num_replicas
from keras_ctl._replicas import sum_across_replicas

_SUMMED_MARK = "_keras_ctl_gradients_summed"


_EMA_DEFERRED = "_keras_ctl_ema_deferred"


@contextlib.contextmanager
def gradients_already_summed(optimizer: keras.optimizers.Optimizer) -> Iterator[None]:
    """Within it, `optimizer` applies gradients as given, without summing them
    across replicas first.

    Keras sums each replica's gradients inside `optimizer.apply`, after
    clipping them (`TFOptimizer._all_reduce_sum_gradients`, called from
    `_backend_update_step`), and has no public switch to skip it (Keras 3
    dropped `skip_gradients_aggregation`). The exact step sums them itself,
    so that clipping and the loss-scale check see the sum, and so that the
    global count rides along in the same collective. The mark is counted per
    optimizer (a `LossScaleOptimizer`'s or `MultiOptimizer`'s inner
    optimizers included), not per thread: Keras applies a loss-scaled update
    from threads of its own.

    Keras also updates the EMA of the model's variables inside `apply`, and
    every `ema_overwrite_frequency` steps overwrites them with it, in a
    `tf.cond` around a cross-replica update: that fails inside a replica
    step's control flow (a `merge_call`), and one-copy variables
    (`CentralStorageStrategy`) refuse an assignment in replica context.
    Within it `apply` leaves the EMA out (`use_ema` reads `False` while any
    replica applies); `EmaAfterStep` does it after the replicas' step.
    """
    family = _optimizer_family(optimizer)
    for member in family:
        applying = getattr(member, _SUMMED_MARK, 0)
        if not applying and getattr(member, "use_ema", False):
            setattr(member, _EMA_DEFERRED, True)
            member.use_ema = False
        setattr(member, _SUMMED_MARK, applying + 1)
    # This thread's own record: replica threads share the optimizer, and
    # one replica may enter its next `apply` while another is still inside
    # this one (a GAN's discriminator steps).
    outer: frozenset[int] = getattr(in_step, "summed", frozenset())
    in_step.summed = outer | {id(member) for member in family}
    try:
        yield
    finally:
        in_step.summed = outer
        for member in family:
            applying = getattr(member, _SUMMED_MARK) - 1
            setattr(member, _SUMMED_MARK, applying)
            if not applying:
                # The user's optimizer keeps no mark of keras_ctl's.
                delattr(member, _SUMMED_MARK)
                if getattr(member, _EMA_DEFERRED, False):
                    member.use_ema = True


class EmaAfterStep:
    """The EMA updates that `apply` left out (see `gradients_already_summed`),
    in cross-replica context after the replicas' step.

    Create it before the step (it reads each optimizer's `iterations`), call
    `update()` after. The arithmetic is Keras's (`BaseOptimizer.
    _update_model_variables_moving_average`, which reads `iterations` before
    `apply` counts the step: the first step copies the variables), and the
    overwrite Keras's own (`TFOptimizer.
    _overwrite_model_variables_with_average_value`, when `iterations` is a
    multiple of `ema_overwrite_frequency`). Checked on Keras 3.12.0 and
    3.15.1. A step that did not apply (a loss scale's overflow) changes
    nothing.
    """

    def __init__(self, optimizers: list[Any]) -> None:
        self.members = [
            member
            for optimizer in optimizers
            for member in _optimizer_family(optimizer)
            if getattr(member, "use_ema", False)
        ]
        self.before = [tf.identity(member.iterations) for member in self.members]

    def update(self) -> None:
        for member, before in zip(self.members, self.before):
            if vars(member).pop(_EMA_DEFERRED, False):
                applied = tf.not_equal(member.iterations, before)
                tf.cond(applied, lambda m=member, b=before: _ema(m, b), _nothing)


def _ema(optimizer, iterations_before):
    variables = names.attribute(optimizer, "_trainable_variables")
    averages = names.attribute(optimizer, "_model_variables_moving_average")
    for variable, average in zip(variables, averages):
        if average is None:
            continue
        momentum = tf.cast(tf.not_equal(iterations_before, 0), variable.dtype)
        momentum = momentum * optimizer.ema_momentum
        average.assign(momentum * average + (1 - momentum) * variable)
    frequency = optimizer.ema_overwrite_frequency
    if frequency:

        def overwrite():
            overwrite_with_average = names.attribute(
                optimizer, "_overwrite_model_variables_with_average_value"
            )
            overwrite_with_average(variables)
            return tf.constant(True)

        due = tf.equal(optimizer.iterations % frequency, 0)
        tf.cond(due, overwrite, _nothing)
    return tf.constant(True)


def _nothing():
    return tf.constant(False)


def _optimizer_family(optimizer):
    family = [optimizer]
    inner = getattr(optimizer, "inner_optimizer", None)  # LossScaleOptimizer
    if inner is not None:
        family += _optimizer_family(inner)
    if type(optimizer).__name__ == "MultiOptimizer":  # Keras >= 3.15
        for member in optimizer.optimizers:
            family += _optimizer_family(member)
    return family


@registered
def summed_gradients_switch(original):
    """An optimizer marked by `gradients_already_summed` skips Keras's own
    sum across replicas (replaces `TFOptimizer._all_reduce_sum_gradients`)."""

    def all_reduce_sum_gradients(self, grads_and_vars):
        if getattr(self, _SUMMED_MARK, 0):
            return list(grads_and_vars)
        return original(self, grads_and_vars)

    return all_reduce_sum_gradients


def micro_batch_iterations(optimizer: keras.optimizers.Optimizer) -> keras.Variable:
    """The steps an optimizer with `gradient_accumulation_steps` has seen
    (`BaseOptimizer._iterations`; its public `iterations` counts updates)."""
    return names.attribute(optimizer, "_iterations")


def keras_accumulators(optimizer: keras.optimizers.Optimizer) -> list[keras.Variable]:
    """Keras's accumulator of each variable (`BaseOptimizer.
    _accumulated_gradients`, created by `build()` when the optimizer has
    `gradient_accumulation_steps`)."""
    return names.attribute(optimizer, "_accumulated_gradients")


def count_micro_batch(optimizer: keras.optimizers.Optimizer) -> None:
    """Counts a step that only accumulated, as Keras's `apply` does."""
    names.attribute(optimizer, "_iterations").assign_add(1)


@contextlib.contextmanager
def one_update_of_accumulated_steps(
    optimizer: keras.optimizers.Optimizer,
) -> Iterator[None]:
    """Within it (cross-replica context, around the replicas' step),
    `optimizer.apply` makes the update Keras's `apply` makes on every
    `gradient_accumulation_steps`-th step, with the gradients given (the
    accumulated mean), without Keras's `tf.cond` (`BaseOptimizer.
    _backend_apply_gradients`, replaced on this instance by its branch
    without accumulation: clipping, weight decay, `_backend_update_step`).
    `iterations` still counts updates and `_iterations` steps, as Keras's
    Adam and learning-rate schedules read them. Checked on Keras 3.12.0
    and 3.15.1.
    """

    clip = names.attribute(optimizer, "_clip_gradients")
    decay = names.attribute(optimizer, "_apply_weight_decay")
    update = names.attribute(optimizer, "_backend_update_step")

    def apply_once(grads, trainable_variables):
        grads = clip(grads)
        decay(trainable_variables)
        update(grads, trainable_variables, optimizer.learning_rate)

    names.set_attribute(optimizer, "_backend_apply_gradients", apply_once)
    try:
        yield
    finally:
        del optimizer._backend_apply_gradients


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
    Checked on Keras 3.12.0 and 3.15.1.
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
        if not sums:
            return original(self, grads, trainable_variables)
        with gradients_already_summed(self):
            return original(self, grads, trainable_variables)

    return apply


class Applied(NamedTuple):
    """The gradients one `apply` was given (`applies_captured`)."""

    gradients: list[tf.Tensor | None]
    # Whether a step of one's own read as one device's code applied them
    # (`_replicas.current_reading`), its replica's weighed and summed.
    read_as_one_device: bool


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
    applied = Applied(
        [None if g is None else tf.convert_to_tensor(g) for g in grads],
        reading is not None and reading.kind == "step" and not reading.in_shares,
    )
    with _capture_lock:
        noted.setdefault(threading.get_ident(), []).append(applied)
    return True
