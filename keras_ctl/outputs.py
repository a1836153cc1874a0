"""Typed step outputs: how a logged value is reduced across replicas.

A step returns its logs from every replica; after `strategy.run` the step
engine reduces each to one value. Wrap a value in one of three types to say
how:

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


def reduce_step_outputs(outputs, strategy, read_metrics=None):
    """Reduces the outputs of `strategy.run(step)` to one value each.

    Every outcome, leaf by leaf:

    - `ReplicaSum(v)`: the sum of `v` over replicas.
    - `ExampleMean(total, count)`: `sum(total) / sum(count)` over replicas
      (0 when the count is 0), as float32.
    - `Synchronized(v)`: the first replica's `v`.
    - dicts, lists and tuples: reduced item by item.
    - any other value on one replica: the value itself.
    - compatibility glue for keras.io steps that return
      `{m.name: m.result() for m in self.metrics}`: an untyped value at the
      top of a dict whose name `read_metrics` knows is replaced by that
      metric's result read in cross-replica context (its on-read variables
      summed over replicas: exact).
    - any other untyped value under several replicas: its mean over
      replicas, as Keras does. Wrap it in a type to make it exact.

    Args:
        outputs: A nest (dicts, lists, tuples) of step outputs.
        strategy: The `tf.distribute.Strategy` the step ran under.
        read_metrics: Optional `read_metrics(names)`, called in
            cross-replica context: `{name: exact value}` for the names that
            are model metrics. Defaults to `None` (no metric is re-read).

    Returns:
        The same nest with every leaf reduced to one tensor.
    """
    one_replica = strategy.num_replicas_in_sync == 1

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
        if one_replica:
            return strategy.experimental_local_results(value)[0]
        return strategy.reduce("MEAN", value, axis=None)

    if one_replica or read_metrics is None or not isinstance(outputs, dict):
        return reduce(outputs)
    untyped = [name for name, value in outputs.items() if not _is_typed(value)]
    exact = read_metrics(untyped) if untyped else {}
    return {
        name: exact[name] if name in exact else reduce(value)
        for name, value in outputs.items()
    }


def _is_typed(value):
    return isinstance(value, (ReplicaSum, ExampleMean, Synchronized))
