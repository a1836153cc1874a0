"""Building blocks for exact custom steps.

Inside a replica step (`strategy.run`), each block returns this replica's
*share* of a global quantity: the shares of all replicas sum to the value one
device computes on the whole global batch. `tf.distribute` sums gradients
across replicas, so the gradient of a share is this replica's exact share of
the global gradient. These blocks and `CTLModel`'s default steps divide
through the same function (`_replicas.global_shares`) and sum gradients
the same way before `optimizer.apply`; the default steps also fold the
global count into the gradients' all-reduce, one collective a step, which
`global_mean` (a collective of its own) does not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import TypeVar

import keras
import tensorflow as tf

from keras_ctl import _keras
from keras_ctl import _replicas
from keras_ctl._engine import gather
from keras_ctl._engine import update
from keras_ctl._engine.loss import regularization_total
from keras_ctl._own_code import IN_SHARES_MARK
from keras_ctl._own_code import declare_in_shares
from keras_ctl._own_code import replica_arithmetic
from keras_ctl._replicas import batch_fraction
from keras_ctl._replicas import global_shares
from keras_ctl._replicas import sum_across_replicas

# A step method (or `tf.function`), given back marked.
_Step = TypeVar("_Step", bound=Callable[..., Any])

__all__ = [
    "all_gather",
    "all_reduce_sum",
    "global_mean",
    "minimize",
    "num_replicas",
    "scaled_regularization_loss",
    "written_in_shares",
]


def global_mean(
    values: tf.Tensor,
    sample_weight: tf.Tensor | None = None,
    *,
    global_weight: tf.Tensor | None = None,
) -> tf.Tensor:
    """Returns this replica's share of the mean of `values` over the global batch.

    The mean of one device is `sum(values * w) / sum(w)` over the whole global
    batch. Each replica computes its local weighted sum and divides it by the
    *global* weight sum (all-reduced here), so the shares add up to that mean
    even when replicas hold different numbers of examples, or none. This is
    `tf.nn.compute_average_loss` without a fixed `global_batch_size`.

    Args:
        values: Per-example values, rank >= 1 with the batch first (for
            example a per-example loss of shape `(batch,)` or
            `(batch, height, width)`).
        sample_weight: Optional weights broadcastable to `values`.
            Defaults to `None` (every element weighs 1).
        global_weight: The weight sum over the global batch (summed over
            replicas, of the weights broadcast to `values`), when the caller
            already has it: it saves this call's collective, a round trip
            between workers. Defaults to `None` (all-reduced here).

    Returns:
        A scalar: this replica's share of the global mean. Inside a
        `compute_loss` of one's own, which keras_ctl reads as the loss of
        the replica's batch, it is valued as the global mean and keeps the
        share's gradient once the step weighs it.

    Raises:
        ValueError: if `values` is a scalar (already reduced).

    Example:

    ```python
    def mean_share(values):  # on each replica, with its part of the global batch
        return keras_ctl.global_mean(values)

    batches = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices([0.0, 1.0, 2.0, 3.0, 4.0]).batch(5))
    shares = strategy.run(mean_share, args=(next(iter(batches)),))
    print(strategy.experimental_local_results(shares))  # 0.6 + 1.4 = 2.0, the mean
    ```
    """
    values = _with_batch_axis(
        values,
        "with one entry per example (rank >= 1), so that the mean can be "
        "taken over the global batch",
        "Pass the unreduced per-example values (e.g. a loss with `reduction=None`).",
    )
    if sample_weight is None:
        weights = tf.ones_like(values)
    else:
        weights = tf.broadcast_to(
            tf.cast(sample_weight, values.dtype), tf.shape(values)
        )
    (share,), _ = global_shares(
        [tf.reduce_sum(values * weights)],
        [tf.reduce_sum(weights)],
        # A replica without examples holds a placeholder, which weighs nothing.
        examples=_keras.real_examples(),
        global_counts=None if global_weight is None else [global_weight],
        # Read as the replica's batch's loss, it is valued as one device's.
        valued_as_global=batch_fraction() is not None,
    )
    return share


all_reduce_sum = replica_arithmetic("keras_ctl.all_reduce_sum")(
    _replicas.all_reduce_sum
)
num_replicas = replica_arithmetic("keras_ctl.num_replicas")(_replicas.num_replicas)


def all_gather(values: tf.Tensor) -> tf.Tensor:
    """Returns the rows of every replica's `values`, in global-batch order.

    A loss that couples the examples of a batch (in-batch negatives, a
    contrastive similarity matrix, a count of positives that divides the
    loss) needs the whole global batch, not the replica's part. Gathered
    rows are the rows one device sees: replicas may hold different numbers
    of rows, and a replica without examples adds none (its placeholder row
    is left out). The gradient with respect to a replica's rows is one
    device's: `tf.distribute.ReplicaContext.all_gather`'s gradient, which
    sums what every replica's loss asks of them.

    A loss computed from gathered rows is the whole loss, the same on every
    replica: one device's code on the batch one device sees. Return it as
    it is from a `compute_loss` of one's own, or apply its gradients in a
    `train_step` of one's own read as one device's code (keras_ctl weighs
    what each replica's loss asks of every replica's rows by its part of
    the global batch). In a step declared `written_in_shares`, where
    gradients are summed as they are, each replica adds
    `loss / keras_ctl.num_replicas()` instead. Keras
    `Loss` objects with `reduction="sum"` (or `super().compute_loss` with
    them) train as on one device only under
    `compile(compute_loss_over="global_batch")`, which gathers for you. A
    table looked up for gathered rows (in-batch candidates) is looked up
    alike on every replica: its sparse gradient is summed position by
    position, one slice a lookup as on one device.

    Args:
        values: A tensor with the batch first (rank >= 1), the same shape
            on every replica past the first axis.

    Returns:
        The rows of all replicas concatenated, replica 0's first: on one
        replica (or outside a replica step), `values` itself.

    Raises:
        ValueError: if `values` is a scalar.

    Example:

    ```python
    class InBatchNegatives(keras_ctl.CTLModel):
        def compute_loss(self, x, y, y_pred, sample_weight, training=True):
            queries, candidates = keras_ctl.all_gather(y_pred), keras_ctl.all_gather(y)
            scores = keras.ops.matmul(queries, keras.ops.transpose(candidates))
            labels = keras.ops.eye(keras.ops.shape(scores)[0])
            return keras.ops.mean(keras.losses.categorical_crossentropy(
                labels, scores, from_logits=True))

    with strategy.scope():
        query_inputs = keras.Input((6,))
        model = InBatchNegatives(query_inputs, keras.layers.Dense(4)(query_inputs))
        model.compile(optimizer="sgd")
    history = model.fit(queries, candidates, batch_size=8, epochs=2)
    print(history.history["loss"])  # against the global batch's 8 candidates
    ```
    """
    values = _with_batch_axis(
        values,
        "with the batch first (rank >= 1), so that the rows of every replica "
        "can be gathered",
        "Gather the per-example values, or `keras_ctl.all_reduce_sum` a scalar.",
    )
    return gather.global_batch(values)


def row_offset(values: tf.Tensor) -> tf.Tensor:
    """Returns where this replica's rows of `values` start in
    `all_gather(values)`: the number of rows of the replicas before it.

    With queries kept on their replica and candidates gathered, query `i`
    of this replica is row `row_offset(queries) + i` of the global batch:
    its positive's column in the score matrix. Replicas may hold different
    numbers of rows; a replica without examples holds none.

    Args:
        values: A tensor with the batch first (rank >= 1): this replica's
            rows.

    Returns:
        A scalar `int32` tensor: 0 on one replica (or outside a replica
        step).

    Raises:
        ValueError: if `values` is a scalar.

    Example:

    ```python
    class LocalQueries(keras_ctl.CTLModel):
        def compute_loss(self, x, y, y_pred, sample_weight, training=True):
            candidates = keras_ctl.all_gather(y)
            scores = keras.ops.matmul(y_pred, keras.ops.transpose(candidates))
            positives = keras_ctl.row_offset(y_pred) + keras.ops.arange(
                keras.ops.shape(y_pred)[0])
            return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(
                positives, scores, from_logits=True))

    with strategy.scope():
        query_inputs = keras.Input((6,))
        model = LocalQueries(query_inputs, keras.layers.Dense(4)(query_inputs))
        model.compile(optimizer="sgd")
    history = model.fit(queries, candidates, batch_size=8, epochs=2)
    ```
    """
    values = _with_batch_axis(
        values,
        "with the batch first (rank >= 1): its rows are counted",
        "Pass the per-example values whose rows you gather.",
    )
    return gather.row_offset(values)


def _with_batch_axis(values: tf.Tensor, expected: str, remedy: str) -> tf.Tensor:
    """`values` as a tensor; a `ValueError` saying `expected` and `remedy`
    when it is a scalar (already reduced over the batch)."""
    values = tf.convert_to_tensor(values)
    if values.shape.rank == 0:
        raise ValueError(
            f"Expected `values` {expected}. Received: values with shape "
            f"{values.shape}. {remedy}"
        )
    return values


def scaled_regularization_loss(losses: Sequence[tf.Tensor]) -> tf.Tensor:
    """Returns this replica's share of the sum of `losses`.

    Regularization losses (weight regularizers, `add_loss`) are added once
    per global batch. Every replica computes them and gradients are summed
    across replicas, so each replica contributes `sum(losses) / replicas`.
    This is `tf.nn.scale_regularization_loss`.

    Args:
        losses: A list of scalar tensors, typically `model.losses` read right
            after the forward pass.

    Returns:
        A scalar in `floatx()` (zero when `losses` is empty). Inside a
        `compute_loss` of one's own, read as the loss of the replica's
        batch, it is the whole sum: the step weighs it.

    Example:

    ```python
    class Regularized(keras_ctl.CTLModel):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                reg = keras_ctl.scaled_regularization_loss(self.losses)  # read first
                per_example = keras.losses.sparse_categorical_crossentropy(
                    y, y_pred, from_logits=True)
                loss = keras_ctl.global_mean(per_example) + reg
            keras_ctl.minimize(loss, self.trainable_weights, self.optimizer, tape)
            return {"batch_loss": keras_ctl.ReplicaSum(loss)}

    with strategy.scope():
        dense = keras.layers.Dense(10, kernel_regularizer=keras.regularizers.L2(1e-3))
        model = Regularized(inputs, dense(keras.layers.Flatten()(inputs)))
        model.compile(optimizer="sgd")
    history = model.fit(x, y, batch_size=64, epochs=1)
    ```
    """
    if batch_fraction() is not None:
        return regularization_total(losses)
    # Gradients are summed across replicas: each replica counts as one of R.
    (share,), _ = global_shares(
        [regularization_total(losses)], [1.0], global_counts=[_replicas.num_replicas()]
    )
    return share


def minimize(
    loss: tf.Tensor,
    variables: Sequence[tf.Variable],
    optimizer: keras.optimizers.Optimizer,
    tape: tf.GradientTape,
) -> list[tf.Tensor | tf.IndexedSlices | None]:
    """Applies the gradients of `loss` with respect to `variables`.

    `loss` is this replica's share of the global loss (see `global_mean`).
    The gradients are summed across replicas in one all-reduce *before* the
    optimizer sees them, so the update equals one device's update on the
    global batch, gradient clipping (`clipnorm`, `global_clipnorm`,
    `clipvalue`) included: Keras's own `apply` clips each replica's part
    before summing. The loss is scaled through `optimizer.scale_loss()` on
    the same tape, so a `keras.optimizers.LossScaleOptimizer` (mixed
    precision) keeps its own loss scale, and it decides on overflow from the
    summed gradients, the same decision on every replica.

    Args:
        loss: Scalar loss share recorded on `tape`.
        variables: The variables to update (e.g. `model.trainable_weights`).
        optimizer: A `keras.optimizers.Optimizer`, built for `variables`.
        tape: The `tf.GradientTape` that recorded the forward pass. It is
            re-entered to record the loss scaling, then consumed.

    Returns:
        The list of gradients that were applied, summed across replicas
        (loss-scaled when the optimizer scales the loss).

    Example:

    ```python
    class MyModel(keras_ctl.CTLModel):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                per_example = keras.losses.sparse_categorical_crossentropy(
                    y, y_pred, from_logits=True)
                loss = keras_ctl.global_mean(per_example)
            keras_ctl.minimize(loss, self.trainable_weights, self.optimizer, tape)
            return {"batch_loss": keras_ctl.ReplicaSum(loss)}

    with strategy.scope():
        model = MyModel(inputs, outputs)
        model.compile(optimizer="sgd")
    history = model.fit(x, y, batch_size=64, epochs=1)
    ```
    """
    variables = list(variables)
    with tape:
        scaled_loss = optimizer.scale_loss(loss)
    gradients, _ = sum_across_replicas(_keras.gradients(tape, scaled_loss, variables))
    update.apply_summed(optimizer, gradients, variables)
    return gradients


def written_in_shares(step: _Step) -> _Step:
    """Declares `step`, a `train_step` or `test_step` of one's own, written
    in replica shares: on each replica it runs as written on the replica's
    part of the batch, and the replicas' gradients are summed as they are.

    Without it a step of one's own is read as one device's code: each
    replica's gradients are weighed by its part of the global batch, which
    makes a mean over examples one device's mean. A step that computes its
    replica's share itself (gathered rows and `1 / num_replicas()` of their
    loss, `tf.nn.compute_average_loss`, a loss that is a sum over examples,
    whose replicas' sums add up to the global batch's) is written in shares.
    The declaration takes effect when the decorated function runs, however
    it is reached (a decorator of one's own around it, a helper the step
    calls first, a `functools.partial`), before the step computes any
    loss. Replica arithmetic (`all_gather`, `all_reduce_sum`, `row_offset`,
    `tf.nn.compute_average_loss`, a replica context's `all_reduce`) in a
    step not so declared is refused at its first trace.

    Args:
        step: The step method (a `tf.function` too).

    Returns:
        `step`, declared.

    Raises:
        ValueError: when the declared function runs after the step computed
            a loss as one device's code, or inside a `compute_loss`.

    Example:

    ```python
    class SumOfLosses(keras_ctl.CTLModel):
        @keras_ctl.written_in_shares
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = keras.losses.sparse_categorical_crossentropy(
                    y, self(x, training=True), from_logits=True)  # one per example
            grads = tape.gradient(loss, self.trainable_weights)  # their sum
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
            return {"loss_sum": keras_ctl.ReplicaSum(tf.reduce_sum(loss))}

    with strategy.scope():
        model = SumOfLosses(inputs, outputs)
        model.compile(optimizer=keras.optimizers.SGD(1e-3))
    history = model.fit(x, y, batch_size=64, epochs=1)
    ```
    """
    declared = getattr(step, "__qualname__", None) or repr(step)

    @functools.wraps(step)
    def in_shares(*args: Any, **kwargs: Any) -> Any:
        declare_in_shares(declared)
        return step(*args, **kwargs)

    setattr(in_shares, IN_SHARES_MARK, True)
    return in_shares  # type: ignore[return-value]
