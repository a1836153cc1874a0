"""Exact cross-replica reductions for custom training steps.

Inside a replica step (`strategy.run`), every function here returns this
replica's *share* of a global quantity: the shares of all replicas sum to the
value one device would compute on the whole global batch. Because
`tf.distribute` sums gradients across replicas, the gradient of a share is
also this replica's exact share of the global gradient.

Step outputs are wrapped in one of three small types that say how the
step engine reduces them across replicas after `strategy.run`:

- `ReplicaSum(value)`: add the replicas' values (use it for shares);
- `ExampleMean(total, count)`: `sum(total) / sum(count)` over replicas;
- `Synchronized(value)`: already equal on every replica; take one.
"""

from typing import Any
from typing import NamedTuple

import tensorflow as tf


class ReplicaSum(NamedTuple):
    """A step output that is summed across replicas.

    Use it for shares returned by `global_mean` or
    `scaled_regularization_loss`: their sum is the global value.

    Example:

    ```python
    share = keras_ctl.global_mean(per_example_loss)
    return {"my_loss": keras_ctl.ReplicaSum(share)}
    ```
    """

    value: Any


class ExampleMean(NamedTuple):
    """A step output reduced as `sum(total) / sum(count)` across replicas.

    Example:

    ```python
    correct = tf.reduce_sum(tf.cast(hits, "float32"))
    seen = tf.cast(tf.shape(hits)[0], "float32")
    return {"batch_accuracy": keras_ctl.ExampleMean(correct, seen)}
    ```
    """

    total: Any
    count: Any


class Synchronized(NamedTuple):
    """A step output that is already equal on every replica.

    Example:

    ```python
    return {"lr": keras_ctl.Synchronized(self.optimizer.learning_rate)}
    ```
    """

    value: Any


def num_replicas():
    """Returns the number of replicas of the current strategy."""
    return tf.distribute.get_strategy().num_replicas_in_sync


def all_reduce_sum(value):
    """Sums `value` across replicas; the identity on a single replica.

    Call it inside a replica step. Every replica must call it the same number
    of times in the same order, because it is a collective.

    Example:

    ```python
    global_count = keras_ctl.all_reduce_sum(tf.shape(x)[0])
    ```
    """
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce("SUM", value)


def global_mean(values, sample_weight=None):
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

    Returns:
        A scalar: this replica's share of the global mean.

    Raises:
        ValueError: if `values` is a scalar (already reduced).

    Example:

    ```python
    per_example = keras.losses.sparse_categorical_crossentropy(y, y_pred)
    loss = keras_ctl.global_mean(per_example)
    ```
    """
    values = tf.convert_to_tensor(values)
    if values.shape.rank == 0:
        raise ValueError(
            "Expected `values` with one entry per example (rank >= 1), so "
            "that the mean can be taken over the global batch. Received: "
            f"values with shape {values.shape}. Pass the unreduced "
            "per-example values (e.g. a loss with `reduction=None`)."
        )
    if sample_weight is None:
        weights = tf.ones_like(values)
    else:
        weights = tf.broadcast_to(
            tf.cast(sample_weight, values.dtype), tf.shape(values)
        )
    local_sum = tf.reduce_sum(values * weights)
    global_weight = all_reduce_sum(tf.stop_gradient(tf.reduce_sum(weights)))
    return tf.math.divide_no_nan(local_sum, global_weight)


def scaled_regularization_loss(losses):
    """Returns this replica's share of the sum of `losses`.

    Regularization losses (weight regularizers, `add_loss`) are added once
    per global batch. Every replica computes them and gradients are summed
    across replicas, so each replica contributes `sum(losses) / replicas`.
    This is `tf.nn.scale_regularization_loss`.

    Args:
        losses: A list of scalar tensors, typically `model.losses` read right
            after the forward pass.

    Returns:
        A scalar float32 tensor (zero when `losses` is empty).

    Example:

    ```python
    y_pred = self(x, training=True)
    reg = keras_ctl.scaled_regularization_loss(self.losses)
    ```
    """
    if not losses:
        return tf.zeros((), "float32")
    total = tf.add_n([tf.cast(tf.reduce_sum(loss), "float32") for loss in losses])
    # Gradients are summed across replicas, so each one adds 1/R of it.
    return total / num_replicas()


def reduce_step_outputs(outputs, strategy):
    """Reduces the outputs of `strategy.run(step)` to one value each.

    Typed outputs get their own reduction. An untyped value is taken as-is on
    one replica and averaged across replicas otherwise (Keras's behaviour);
    wrap it in a type to make it exact.

    Args:
        outputs: A nest (dicts, lists, tuples) of step outputs.
        strategy: The `tf.distribute.Strategy` the step ran under.

    Returns:
        The same nest with every leaf reduced to one tensor.
    """

    def total(value):
        return strategy.reduce("SUM", value, axis=None)

    def reduce(value):
        if isinstance(value, ReplicaSum):
            return total(value.value)
        if isinstance(value, ExampleMean):
            count = tf.cast(total(value.count), tf.float32)
            return tf.math.divide_no_nan(tf.cast(total(value.total), tf.float32), count)
        if isinstance(value, Synchronized):
            return strategy.experimental_local_results(value.value)[0]
        if isinstance(value, dict):
            return {key: reduce(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(reduce(item) for item in value)
        if strategy.num_replicas_in_sync == 1:
            return strategy.experimental_local_results(value)[0]
        return strategy.reduce("MEAN", value, axis=None)

    return reduce(outputs)
