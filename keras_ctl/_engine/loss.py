"""The loss given to `compile()`, reduced exactly over the global batch.

Keras reduces each output's loss on each replica (`sum / local count`) and
then scales by `1 / replicas`: a mean of per-replica means, which drifts when
replicas hold different numbers of examples. Here every output's loss is
summed on the replica and divided by the *global* count (or weight sum),
following Keras's own reduction semantics for each `Loss.reduction`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple
from typing import cast

import keras
import tensorflow as tf
from keras import tree

from keras_ctl import _checks
from keras_ctl import _keras
from keras_ctl import _replaced
from keras_ctl._replicas import global_shares
from keras_ctl._replicas import known_global_count
from keras_ctl._replicas import only_if_real


class LossShares(NamedTuple):
    """This replica's share of the compiled loss and of each output's loss.

    Attributes:
        total: share of `sum(loss_weight * output_loss)`, the value to
            differentiate (regularization not included), or `None` where a
            step did without the global count.
        per_output: list of the share of each unweighted output loss, one
            per output with a loss, in the compiled loss's order.
        global_batch_size: number of examples in the global batch, or
            `None` where a step did without it.
        local_batch_size: number of examples on this replica.
    """

    total: tf.Tensor | None
    per_output: list[tf.Tensor]
    global_batch_size: tf.Tensor | None
    local_batch_size: tf.Tensor


class LossTerms(NamedTuple):
    """The compiled loss on this replica, each output's loss called once.

    Which path a step takes (the count folded into the gradients, XLA per
    replica, or the counts all-reduced first) is decided from these, so no
    loss is computed twice.

    Attributes:
        parts: One `_replaced.losses.LossParts` per output with a loss, in `dtype`.
        loss_weights: Each of those outputs' `loss_weights` entry, or `None`.
        dtype: The compiled loss's dtype (Keras casts each loss to it).
    """

    parts: list[_replaced.losses.LossParts]
    loss_weights: list[float | None]
    dtype: tf.DType | str

    @property
    def fixed_counts(self) -> bool:
        """Every loss divides by a fixed count per example, or by nothing
        (`"sum"`): given the global batch size, no count needs a collective.
        Masks and sample-weight sums make counts that do."""
        return all(p.count is None or p.per_example is not None for p in self.parts)

    @property
    def foldable(self) -> bool:
        """Every loss divides by a fixed count per example, so `loss x batch
        size` is a sum of per-replica parts (`loss_times_examples`)."""
        return all(
            p.count is not None and p.per_example is not None for p in self.parts
        )


def compiled_loss_shares(
    terms: LossTerms,
    batch_size: tf.Tensor,
    global_batch_size: tf.Tensor | None = None,
) -> LossShares:
    """Returns the `LossShares` of the compiled loss on this replica.

    Args:
        terms: The compiled loss's `LossTerms` on this replica.
        batch_size: Number of real examples on this replica (int32 scalar);
            a replica padded with a placeholder example passes 0.
        global_batch_size: The all-reduced batch size when the caller already
            has it (a step compiled with XLA cannot run collectives); needs
            `terms.fixed_counts`. Defaults to `None`: denominators are
            all-reduced here, in one collective.
    """
    local_batch = tf.cast(batch_size, terms.dtype)
    sums = [part.total for part in terms.parts]
    if global_batch_size is None:
        counts = [part.count for part in terms.parts] + [local_batch]
        shares, global_counts = global_shares(sums, counts)
        global_batch = global_counts[-1]
    else:
        shares = _fixed_count_shares(terms, global_batch_size)
        global_batch = global_batch_size
    return LossShares(
        total=_weighted_total(shares, terms.loss_weights),
        per_output=shares,
        global_batch_size=global_batch,
        local_batch_size=local_batch,
    )


def loss_times_examples(terms: LossTerms) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """This replica's part of `batch loss x batch size`, with no collective
    (needs `terms.foldable`).

    One device adds each batch's loss to its `loss` tracker weighted by the
    batch size, and the mean over the global batch is the sum of these parts
    over the global count. For a loss divided by a fixed count per example,
    the global count in that division cancels with the weight, so each
    replica computes its part alone: each loss sum over its elements per
    example. Its gradient, summed across replicas and divided by the global
    count, is the gradient of one device's loss.

    Returns:
        `(total, per_output)`: the weighted total and one unweighted part
        per output with a loss.
    """
    # Shares of a global batch of 1: each sum over its elements per example.
    shares = _fixed_count_shares(terms, 1.0)
    return _weighted_total(shares, terms.loss_weights), shares


def _fixed_count_shares(
    terms: LossTerms, global_batch_size: tf.Tensor | float
) -> list[tf.Tensor]:
    """Each term's sum over `per_example x global_batch_size`, no collective
    (needs `terms.fixed_counts`)."""
    counted = [part for part in terms.parts if part.count is not None]
    # Not `None`: `terms.fixed_counts`.
    global_counts = [
        cast(int, part.per_example) * global_batch_size for part in counted
    ]
    shares, _ = global_shares(
        [part.total for part in terms.parts],
        [part.count for part in terms.parts],
        global_counts=global_counts,
    )
    return shares


def _weighted_total(
    shares: Sequence[tf.Tensor], loss_weights: Sequence[float | None]
) -> tf.Tensor:
    weighted = [
        share if weight is None else share * weight
        for share, weight in zip(shares, loss_weights)
    ]
    return weighted[0] if len(weighted) == 1 else tf.add_n(weighted)


def output_losses(
    compile_loss: Any, y: Any, y_pred: Any, sample_weight: Any
) -> list[tuple[Any, Any, Any, Any, float | None, str]]:
    """`[(loss_fn, y, y_pred, sample_weight, loss_weight, name)]`, one per
    output of `compile_loss` with a loss, each with its output's part of
    the nests `y`, `y_pred` and `sample_weight`."""
    y, y_pred = _align_structures(compile_loss, y, y_pred)
    found = []
    for path, loss_fn, loss_weight, name in _keras.compile_loss_terms(compile_loss):
        weight = sample_weight
        if sample_weight is not None and tree.is_nested(sample_weight):
            weight = _resolve(path, sample_weight)
        found.append(
            (
                loss_fn,
                _resolve(path, y),
                _resolve(path, y_pred),
                weight,
                loss_weight,
                name,
            )
        )
    return found


def loss_terms(
    compile_loss: Any,
    y: Any,
    y_pred: Any,
    sample_weight: Any,
    batch_size: tf.Tensor,
    readings: dict[int | str, str] | None = None,
) -> LossTerms:
    """The `LossTerms` of `compile_loss` (`_keras.compile_loss`) on this
    replica's labels `y`, outputs `y_pred` and `sample_weight` (any nests
    matching the outputs), with `batch_size` real examples. `readings`:
    how a loss (by its id) that returns one value for the batch is read
    (`_replaced.losses.ONE_VALUE_READINGS`), as measured on the first batch
    (`loss_mean.read_compiled_losses`); a mean where none is given."""
    dtype = compile_loss.dtype
    readings = readings or {}

    # A replica padded with a placeholder example contributes nothing, not
    # even a NaN (a fully masked placeholder divides 0 by 0).
    def local(value: tf.Tensor | None) -> tf.Tensor | None:
        return (
            None if value is None else only_if_real(tf.cast(value, dtype), batch_size)
        )

    terms: list[_replaced.losses.LossParts] = []
    loss_weights: list[float | None] = []
    outputs = output_losses(compile_loss, y, y_pred, sample_weight)
    for loss_fn, y_true, pred, weight, loss_weight, name in outputs:
        one_value = readings.get(id(loss_fn), "mean")
        term = _loss_term(loss_fn, y_true, pred, weight, name, one_value)
        if term is None:
            raise ValueError(
                f"The loss of output `{name}` returned nothing to train on. "
                f"Received: loss={loss_fn!r}, which returned None. Return the "
                "loss's value from its `__call__` or `call`."
            )
        total, count = local(term.total), local(term.count)
        terms.append(term._replace(total=total, count=count))
        loss_weights.append(loss_weight)
    return LossTerms(terms, loss_weights, dtype)


def count_only_shares(batch_size: tf.Tensor, dtype: tf.DType | str) -> LossShares:
    """Returns `LossShares` with only the batch sizes (no compiled loss)."""
    local = tf.cast(batch_size, dtype)
    known = known_global_count(batch_size)
    if known is None:
        _, (global_batch,) = global_shares([], [local])
    else:
        global_batch = tf.constant(known, dtype)
    return LossShares(tf.zeros((), dtype), [], global_batch, local)


def _loss_term(
    loss_fn: keras.losses.Loss,
    y_true: Any,
    y_pred: Any,
    sample_weight: Any,
    name: str,
    one_value: str,
) -> _replaced.losses.LossParts | None:
    """The `_replaced.losses.LossParts` of one output: its local weighted sum and
    denominator, from Keras's own reduction (a value for the batch read as
    `one_value` says)."""
    _checks.numeric_labels(y_true)
    if loss_fn.reduction in (None, "none"):
        # Unreduced values add into the total, as Keras's `compute_loss`
        # sums them.
        loss_fn = copy.copy(loss_fn)
        loss_fn.reduction = "sum"
    try:
        return _replaced.losses.loss_parts(
            loss_fn, y_true, y_pred, sample_weight, one_value
        )
    except (ValueError, tf.errors.InvalidArgumentError) as error:
        # Keep the loss's own message (the shapes may well fit); add where.
        raise ValueError(
            f"{error}\n\nRaised by loss={loss_fn!r} of output `{name}`, called "
            f"with y of shape {_shapes(y_true)} and predictions of shape "
            f"{_shapes(y_pred)}. Check that `y` has the shape this loss expects."
        ) from error


def _shapes(nest: Any) -> Any:
    return tree.map_structure(lambda t: tuple(t.shape), nest)


def _resolve(path: Sequence[Any], nest: Any) -> Any:
    for key in path:
        nest = nest[key]
    return nest


def _align_structures(compile_loss: Any, y_true: Any, y_pred: Any) -> tuple[Any, Any]:
    """Packs `y_true` like `y_pred` and builds `compile_loss` on first use.

    Follows `CompileLoss.call` (Keras 3.15) for the common layouts: one
    output, lists/tuples, and dicts keyed by output name.
    """
    if tree.is_nested(y_true) or tree.is_nested(y_pred):
        try:
            tree.assert_same_structure(y_pred, y_true)
        except (ValueError, TypeError):
            y_true = _pack_like(compile_loss, y_true, y_pred)
    return _keras.pack_like_compile_loss(compile_loss, y_true, y_pred)


def _pack_like(compile_loss: Any, y_true: Any, y_pred: Any) -> Any:
    names = compile_loss.output_names or []
    if isinstance(y_pred, (list, tuple)) and isinstance(y_true, dict):
        if set(names) == set(y_true.keys()):
            y_true = [y_true[name] for name in names]
    elif not tree.is_nested(y_true):
        y_true = [y_true]
    try:
        return tree.pack_sequence_as(y_pred, tree.flatten(y_true))
    except (ValueError, TypeError) as error:
        partial = _labels_for_outputs_with_a_loss(compile_loss, y_true)
        if partial is not None:
            return partial
        raise ValueError(
            "The labels `y` do not match the model's outputs. Expected one "
            f"label per output ({len(tree.flatten(y_pred))} outputs). "
            f"Received: y with {len(tree.flatten(y_true))} entries "
            f"({tree.map_structure(lambda _: '*', y_true)}). Pass `y` as a "
            "list in output order or a dict keyed by output name."
        ) from error


def _labels_for_outputs_with_a_loss(compile_loss: Any, y_true: Any) -> Any:
    """Keras's rule for a loss given for some outputs only (`loss=["mse",
    None, None]`): the labels go, in order, to the outputs with a loss
    (`CompileLoss.call`, Keras 3.15). `None` when the counts differ."""
    user_loss = _keras.user_loss(compile_loss)
    flat_loss = tree.flatten(user_loss)
    with_loss = [i for i, loss in enumerate(flat_loss) if loss is not None]
    flat_y = tree.flatten(y_true)
    if len(flat_y) != len(with_loss) or len(with_loss) == len(flat_loss):
        return None
    filled: list[Any] = [None] * len(flat_loss)
    for value, index in zip(flat_y, with_loss):
        filled[index] = value
    return tree.pack_sequence_as(user_loss, filled)


def regularization_total(
    losses: Sequence[tf.Tensor], dtype: tf.DType | str | None = None
) -> tf.Tensor:
    """The sum of `losses` as a scalar of `dtype` (zero when empty).

    Defaults to `floatx()`, the dtype Keras's `compute_loss` sums them in.
    """
    dtype = dtype or keras.config.floatx()
    if not losses:
        return tf.zeros((), dtype)
    return tf.add_n([tf.cast(tf.reduce_sum(loss), dtype) for loss in losses])
