"""Optimizers inside a replica step: summed gradients applied as they are,
the EMA after the replicas' step, gradient accumulation's counters."""

import contextlib
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

from keras_ctl._keras import names
from keras_ctl._keras.behaviours import registered
from keras_ctl._keras.state import in_step

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
