"""Keras `Loss` objects inside a replica step: each call's local sum and
denominator, taken from Keras's own reduction, made global (the behaviours
of the seam's loss rows, `keras_ctl._keras.table`)."""

import contextlib
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any
from typing import NamedTuple

import tensorflow as tf
from keras import ops
from keras import tree

from keras_ctl._keras import in_effect
from keras_ctl._keras import losses as keras_losses
from keras_ctl._keras.behaviours import registered
from keras_ctl._keras.state import in_step
from keras_ctl._replicas import global_shares
from keras_ctl._replicas import num_replicas
from keras_ctl._replicas import scoped
from keras_ctl._replicas import valued_as_global


class LossParts(NamedTuple):
    """One `Loss` call on this replica's examples, as Keras reduces it.

    Attributes:
        total: The weighted sum Keras's reduction divides (differentiable).
        count: Its denominator on this replica, or `None` when Keras does
            not divide (`reduction="sum"`).
        per_example: The denominator's share of one example when it is a
            fixed number (no mask, not a weight sum), else `None`.
    """

    total: tf.Tensor
    # Shadows `tuple.count`, which nothing calls on these.
    count: tf.Tensor | None  # type: ignore[assignment]
    per_example: int | None


_MEAN_REDUCTIONS = ("mean", "sum_over_batch_size", "mean_with_sample_weight")


# How a loss returning one value for the batch is read on a replica: as
# that value for each of the replica's examples (a mean over them), or as
# the replica's share of the global batch's loss, summed across replicas
# as it is (a sum over examples, or the tutorial's `sum / GLOBAL_BATCH`).
ONE_VALUE_READINGS = ("mean", "share")


def loss_parts(
    loss: Callable[..., Any],
    y_true: Any,
    y_pred: Any,
    sample_weight: Any = None,
    one_value: str = "mean",
) -> LossParts | None:
    """Calls `loss(y_true, y_pred, sample_weight)` and returns its
    `LossParts` on this replica, or `None` when it returns nothing.

    Keras's `Loss.__call__` casts, calls, combines masks with the sample
    weights and divides (`losses.loss.reduce_weighted_values`); the exact
    step needs the sum and the denominator apart, to divide by the global
    denominator. Both come from Keras's own reduction, called with
    `reduction="sum"`: the sum on the loss values, the denominator on ones
    shaped like them (with the sample weights only where Keras divides by
    their sum). Masks, `ignore_class`, sample weights and dtypes therefore
    mean what they mean in Keras. A loss that returns one value for the
    batch is read as `one_value` says (`ONE_VALUE_READINGS`; the engine
    measures which equals one device). So is the value of a loss whose own
    `__call__` skips Keras's reduction (a mean over its elements when it
    returns one value per example): one device trains on that value as the
    batch's loss.
    """
    with in_effect():  # the exact reduction, `exact_reduction`
        examples = tf.shape(tree.flatten(y_pred)[0])[0]
        previous = getattr(in_step, "capture", None)
        in_step.capture = {"examples": examples, "one_value": one_value}
        try:
            value = loss(y_true, y_pred, sample_weight)
            parts = in_step.capture.get("parts")
        finally:
            in_step.capture = previous
        if parts is None and value is not None:
            parts = _parts_of(
                _as_returned,
                value,
                sample_weight,
                None,
                "sum_over_batch_size",
                None,
                examples,
                one_value,
            )
        return parts


def _as_returned(values, sample_weight, mask, reduction, dtype):
    """The sum of a loss's values as it returned them (its own `__call__`
    weighed them, or not)."""
    return tf.reduce_sum(values)


def real_examples_of_batch():
    """The number of real examples of the batch whose loss this replica
    step computes (`examples_of_batch`), or `None` when unknown."""
    return getattr(in_step, "examples", None)


@contextlib.contextmanager
def examples_of_batch(examples):
    """Within it, a loss that returns one value for the batch is taken as
    that value for each of the batch's `examples` (see `loss_parts`)."""
    with scoped(in_step, "examples", examples):
        yield


def _parts_of(
    original, values, sample_weight, mask, reduction, dtype, examples, one_value
):
    """`LossParts` of Keras's reduction of `values` (see `loss_parts`)."""
    values = ops.convert_to_tensor(values, dtype=dtype)
    if values.shape.rank == 0:
        if one_value == "share" and sample_weight is None:
            # Summed across replicas as it is, with no division: as a
            # `reduction="sum"` loss's sum.
            return LossParts(values, None, None)
        if reduction == "sum":
            raise ValueError(
                "The loss returned one value for the whole batch, with "
                "reduction='sum': a sum over examples cannot be recovered "
                "from it. Return one value per example, or use a mean "
                'reduction such as "sum_over_batch_size".'
            )
        if sample_weight is not None and num_replicas() > 1:
            raise ValueError(
                "The loss returned one value for the whole batch, weighted by "
                "sample or class weights: under several replicas that value "
                "is each replica's own, and no per-example weighting of it "
                "adds up to one device's. Return one value per example from "
                "the loss's `call()` (Keras then weighs each example), or "
                "train without `sample_weight`/`class_weight`."
            )
        values = tf.fill([examples], values)
    # Keras returns values of static shape (0,) unreduced (an empty batch
    # run eagerly): their sum is 0, a scalar like every replica's.
    total = tf.reduce_sum(original(values, sample_weight, mask, "sum", dtype))
    if reduction == "sum":
        return LossParts(total, None, None)
    weights = sample_weight if reduction == "mean_with_sample_weight" else None
    count = tf.reduce_sum(original(tf.ones_like(values), weights, mask, "sum", dtype))
    per_example = None
    if mask is None and weights is None:
        per_example = values.shape[1:].num_elements()
    return LossParts(total, count, per_example)


@contextlib.contextmanager
def rows_of_global_batch() -> Iterator[None]:
    """Within it (this thread), the rows a loss reduces are the global
    batch's, gathered on every replica
    (`CTLModel.compile(compute_loss_over="global_batch")`): it reduces them
    as one device does, with no collective."""
    with scoped(in_step, "global_rows", True):
        yield


def _inside_a_layer_call():
    """Whether a layer's `call()` runs.

    A loss a layer computes in its forward pass (keras.io's endpoint layer
    passing a `Loss` to `add_loss`) is this replica's batch's, as on one
    device: the step weighs layer losses by the replica's part of the
    global batch (`forward.with_layer_losses`), and a collective there
    would let the replica threads, which share the layers, interleave
    inside the forward pass."""
    return keras_losses.inside_a_layer_call()


def _as_one_device(original, values, sample_weight, mask, reduction, dtype):
    """Keras's reduction of `values` on one device: its sum over its count,
    without its division by the replica count."""
    if ops.convert_to_tensor(values).shape.rank == 0:
        return original(values, sample_weight, mask, reduction, dtype)
    parts = _parts_of(
        original, values, sample_weight, mask, reduction, dtype, None, "mean"
    )
    if parts.count is None:
        return parts.total
    return tf.math.divide_no_nan(parts.total, parts.count)


@registered
def exact_reduction(original):
    """Keras's loss reduction, exact across replicas inside our steps.

    `Loss.__call__` ends with `losses.loss.reduce_weighted_values`, which
    divides this replica's weighted sum by this replica's count and then by
    the replica count (`scale_loss_for_distribution`): a mean of
    per-replica means, which drifts when replicas hold different numbers of
    examples (or masked entries), and a step written the keras.io way
    (`loss = self.loss_fn(y, y_pred)`, `tracker.update_state(loss)`) logs
    1/R of it. Replaced, in two cases:

    - inside `loss_parts`, it records the sum and count of the outermost
      call (a loss that calls other losses reduces those locally, as Keras
      does on one replica);
    - in a replica step under several replicas, it all-reduces the sum and
      count together (one collective) and returns the global batch's loss,
      differentiable as this replica's share (the sum over the global
      count): the replicas' gradients sum to one device's.

    Elsewhere, and for `reduction=None`, it is Keras's. Checked on Keras
    3.12.0 and 3.15.1.
    """

    def reduce_weighted_values(
        values,
        sample_weight=None,
        mask=None,
        reduction="sum_over_batch_size",
        dtype=None,
    ):
        reduction = keras_losses.standardize_reduction(reduction)
        capture = getattr(in_step, "capture", None)
        exact = (
            getattr(in_step, "active", False)
            and num_replicas() > 1
            and tf.distribute.get_replica_context() is not None
        )
        if reduction not in (*_MEAN_REDUCTIONS, "sum") or not (
            capture is not None or exact
        ):
            return original(values, sample_weight, mask, reduction, dtype)
        if capture is None and (
            getattr(in_step, "global_rows", False) or _inside_a_layer_call()
        ):
            return _as_one_device(
                original, values, sample_weight, mask, reduction, dtype
            )
        examples = (capture or {}).get("examples", real_examples_of_batch())
        if examples is None and ops.convert_to_tensor(values).shape.rank == 0:
            # One value for a batch of unknown size: Keras's mean over
            # replicas (it divides by their count), valued as that mean.
            return valued_as_global(
                original(values, sample_weight, mask, reduction, dtype)
            )
        one_value = (capture or {}).get("one_value", "mean")
        parts = _parts_of(
            original, values, sample_weight, mask, reduction, dtype, examples, one_value
        )
        if capture is not None:
            # The outermost call reduces last: its parts are kept. A
            # loss called inside it reduces as Keras does, locally.
            capture["parts"] = parts
            return original(values, sample_weight, mask, reduction, dtype)
        # A replica padded with a placeholder example (see
        # `count_only_real_examples`) adds nothing, count included.
        (share,), _ = global_shares(
            [parts.total],
            [parts.count],
            examples=getattr(in_step, "real_examples", None),
            valued_as_global=True,
        )
        return share

    return reduce_weighted_values


@registered
def logged_as_reduced(original):
    """Keras logs a loss it reduced as it is, inside our steps.

    Keras's reduction divides by the replica count, and before a loss goes
    to a tracker (`CompileLoss`'s per-output `Mean`s, the `loss` tracker of
    Keras's `train_step`) Keras multiplies it back
    (`losses.loss.unscale_loss_for_distribution`). Inside a replica step of
    keras_ctl the reduction gives the global batch's value already
    (`exact_reduction`): it is logged as it is. Replaces
    Keras's `losses.loss.unscale_loss_for_distribution` (checked on
    Keras 3.12.0 and 3.15.1).
    """

    def unscale_loss_for_distribution(value):
        if getattr(in_step, "active", False):
            return value
        return original(value)

    return unscale_loss_for_distribution


@registered
def crossentropy_over_no_class(original):
    """Keras's sparse categorical crossentropy of an empty batch whose class
    count is its batch size (scores of shape `(0, 0)`) gives the empty
    batch's per-example losses, inside our steps.

    An in-batch contrastive loss (keras.io's SimCLR, NNCLR: each example's
    positive among the batch's examples) has as many classes as examples,
    and TensorFlow's kernel refuses zero classes ("Must have at least one
    class") even for zero examples: a replica without examples failed. One
    device never computes it on an empty batch. Replaces the TensorFlow
    backend's `nn.sparse_categorical_crossentropy` (checked on Keras 3.15.1).
    """

    def sparse_categorical_crossentropy(target, output, *args, **kwargs):
        output = tf.convert_to_tensor(output)
        return _unless_no_class(
            output, output.dtype, lambda: original(target, output, *args, **kwargs)
        )

    return sparse_categorical_crossentropy


@registered
def argmax_over_no_class(original):
    """Keras's `argmax` over the last axis of empty scores (see
    `crossentropy_over_no_class`: an in-batch accuracy) gives the empty
    batch's indices, inside our steps ("Reduction axis -1 is empty").
    Replaces the TensorFlow backend's `numpy.argmax` (checked on Keras
    3.15.1)."""

    def argmax(x, axis=None, keepdims=False):
        x = tf.convert_to_tensor(x)
        if keepdims or axis not in (-1, x.shape.rank - 1):
            return original(x, axis, keepdims)
        return _unless_no_class(x, tf.int32, lambda: original(x, axis, keepdims))

    return argmax


def _unless_no_class(scores, dtype, compute):
    """`compute()`, or zeros of `scores`'s shape but its last axis (an
    empty batch's per-example result) when `scores` is empty, in a step."""
    if not getattr(in_step, "active", False) or scores.shape[-1] not in (None, 0):
        return compute()
    return tf.cond(
        tf.equal(tf.size(scores), 0),
        lambda: tf.zeros(tf.shape(scores)[:-1], dtype),
        compute,
    )
