"""Typed step outputs: how a logged value is reduced across replicas.

A step returns its logs from every replica; after `strategy.run` the step
engine reduces each to one value. Wrap a value in one of three types to say
how:

- `ReplicaSum(value)`: add the replicas' values (use it for shares);
- `ExampleMean(total, count)`: `sum(total) / sum(count)` over replicas;
- `Synchronized(value)`: already equal on every replica; take one.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple
from typing import TypeAlias

import keras
import tensorflow as tf

from keras_ctl._replicas import SummedTogether
from keras_ctl._replicas import num_replicas
from keras_ctl._replicas import weighed_by_fraction
from keras_ctl.distribute import topology

# Gives a log's reduced value once the step's sums are all-reduced.
_Finish: TypeAlias = Callable[[], Any]


class ReplicaSum(NamedTuple):
    """A step output that is summed across replicas.

    Use it for shares returned by `global_mean` or
    `scaled_regularization_loss`: their sum is the global value.

    Example:

    ```python
    class WithConfidence(keras_ctl.CTLModel):
        def train_step(self, data):
            logs = super().train_step(data)
            x, _ = data
            confidence = tf.reduce_max(tf.nn.softmax(self(x)), axis=-1)
            share = keras_ctl.global_mean(confidence)  # this replica's share
            return {**logs, "confidence": keras_ctl.ReplicaSum(share)}

    with strategy.scope():
        model = WithConfidence(inputs, outputs)
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))
    history = model.fit(x, y, batch_size=64, epochs=1)
    print(history.history["confidence"])  # the last global batch's mean
    ```
    """

    value: Any


class ExampleMean(NamedTuple):
    """A step output reduced as `sum(total) / sum(count)` across replicas.

    Example:

    ```python
    class WithBatchAccuracy(keras_ctl.CTLModel):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(gradients, self.trainable_variables)
            hits = tf.argmax(y_pred, axis=-1, output_type=y.dtype) == y
            correct = tf.reduce_sum(tf.cast(hits, "float32"))
            seen = tf.cast(tf.shape(hits)[0], "float32")
            return {"batch_accuracy": keras_ctl.ExampleMean(correct, seen)}

    with strategy.scope():
        model = WithBatchAccuracy(inputs, outputs)
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))
    history = model.fit(x, y, batch_size=64, epochs=1)
    print(history.history["batch_accuracy"])  # of the last global batch
    ```
    """

    total: Any
    count: Any


class Synchronized(NamedTuple):
    """A step output that is already equal on every replica.

    Example:

    ```python
    class WithLearningRate(keras_ctl.CTLModel):
        def train_step(self, data):
            logs = super().train_step(data)
            return {**logs, "lr": keras_ctl.Synchronized(self.optimizer.learning_rate)}

    with strategy.scope():
        model = WithLearningRate(inputs, outputs)
        model.compile(optimizer=keras.optimizers.SGD(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=64, epochs=1)
    print(history.history["lr"])  # the learning rate, 0.01
    ```
    """

    value: Any


def all_reduce_logs(outputs: Any, metrics: Sequence[keras.metrics.Metric] = ()) -> Any:
    """Reduces a step's outputs across replicas, in one all-reduce.

    Call it in replica context, at the end of the step: every replica gets
    the same, exact logs. All the sums the logs need go into one collective
    per dtype (one in practice), however many values and metrics there are;
    each collective is a round trip between workers.

    Every outcome, leaf by leaf:

    - `ReplicaSum(v)`: the sum of `v` over replicas.
    - `ExampleMean(total, count)`: `sum(total) / sum(count)` over replicas
      (0 when the count is 0), in the total's float dtype (else float32).
    - `Synchronized(v)`: this replica's `v`.
    - dicts, lists and tuples: reduced item by item.
    - compatibility glue for keras.io steps that return
      `{m.name: m.result() for m in self.metrics}`: an untyped value at the
      top of a dict named after one of `metrics` (or after a result of a
      metric whose `result()` is a dict, like `compile_metrics`) is replaced
      by that metric's result computed from its state variables summed over
      replicas (`Metric.stateless_result`): exact.
    - any other untyped value: its mean over replicas, as Keras does. Wrap
      it in a type to make it exact.
    - on one replica, every value as the step computed it (typed values
      unwrapped).

    (`fit()` reduces the logs of a step of the user's own with more: a
    metric's result is recognized under any key, and any other untyped
    value is weighed by the replica's fraction of the global batch, as one
    device's code read on each replica's part.)

    Args:
        outputs: A nest (dicts, lists, tuples) of step outputs.
        metrics: The model's metrics, whose state the step has updated.
            Defaults to `()` (no metric is re-read).

    Returns:
        The same nest with every leaf reduced to one tensor.
    """
    return reduce_step_logs(outputs, metrics)


def reduce_step_logs(
    outputs: Any,
    metrics: Sequence[keras.metrics.Metric] = (),
    results: dict[str, tuple[keras.metrics.Metric, str | None]] | None = None,
    fraction: tf.Tensor | None = None,
) -> Any:
    """`all_reduce_logs`, with what the step engine knows of the step.

    Args:
        outputs, metrics: As `all_reduce_logs`'s.
        results: `{key: (metric, entry)}`: top-level outputs known to be a
            metric's result (`entry` names an item of a result that is a
            dict, else `None`), reduced from the metric's state.
        fraction: This replica's fraction of the global batch, in a step of
            the user's own: an untyped float value is weighed by it and
            summed (a mean over the replica's examples becomes the global
            batch's mean; a replica without examples adds nothing) rather
            than averaged over replicas.
    """
    together = SummedTogether()
    finish = _planned_step_logs(outputs, metrics, results, fraction, together)
    together.all_reduce()
    return finish()


def _planned_step_logs(
    outputs: Any,
    metrics: Sequence[keras.metrics.Metric],
    results: dict[str, tuple[keras.metrics.Metric, str | None]] | None,
    fraction: tf.Tensor | None,
    together: SummedTogether,
) -> _Finish:
    """`reduce_step_logs`, its sums queued in `together`: returns
    `finish()`, the logs once `together` is all-reduced."""
    replicas = num_replicas()
    one_replica = replicas == 1
    results = results or {}
    add = together.add

    def plan(value: Any) -> _Finish:
        """Returns `finish() -> value` for one leaf."""
        if isinstance(value, ReplicaSum):
            return add(value.value)
        if isinstance(value, ExampleMean):
            total, count = add(value.total), add(value.count)
            return lambda: _mean(total(), count())
        if isinstance(value, Synchronized):
            return lambda: value.value
        if isinstance(value, dict):
            parts = {key: plan(item) for key, item in value.items()}
            return lambda: {key: part() for key, part in parts.items()}
        if isinstance(value, (list, tuple)):
            items = [plan(item) for item in value]
            return lambda: type(value)(item() for item in items)
        if one_replica:
            return lambda: value
        value = tf.convert_to_tensor(value)
        if fraction is not None and value.dtype.is_floating:
            return add(weighed_by_fraction(value, fraction))
        total = add(value)
        return lambda: total() / replicas

    if one_replica or not isinstance(outputs, dict) or not (metrics or results):
        return plan(outputs)
    by_name = _metric_results(outputs, metrics, results, together)
    parts = {
        name: by_name[name] if name in by_name else plan(value)
        for name, value in outputs.items()
    }
    return lambda: {name: part() for name, part in parts.items()}


def planned_metric_results(
    metrics: Iterable[keras.metrics.Metric], together: SummedTogether
) -> _Finish:
    """`finish()`: what Keras's `Model.get_metrics_result()` returns for
    `metrics`, each result computed from the metric's state summed across
    replicas (queued in `together`), without its local result."""
    central = topology.of().one_copy
    planned = [(metric, _state_result(metric, together, central)) for metric in metrics]

    def finish() -> dict[str, Any]:
        logs: dict[str, Any] = {}
        for metric, result in planned:
            value = result()
            if isinstance(value, dict):
                logs.update(value)
            else:
                logs[metric.name] = value
        return logs

    return finish


def _metric_results(
    outputs: dict[str, Any],
    metrics: Iterable[keras.metrics.Metric],
    results: dict[str, tuple[keras.metrics.Metric, str | None]],
    together: SummedTogether,
) -> dict[str, _Finish]:
    """`{key: finish()}` for the untyped outputs that are metric
    results: recognized (`results`) or named after a metric."""
    wanted = {name for name, value in outputs.items() if not _is_typed(value)}
    # id(metric) -> (metric, {key: entry or None})
    entries: dict[int, tuple[keras.metrics.Metric, dict[str, str | None]]] = {}
    for key, (metric, entry) in results.items():
        if key in wanted:
            entries.setdefault(id(metric), (metric, {}))[1][key] = entry
    wanted -= set(results)
    for metric in metrics if wanted else ():
        if metric.name in wanted:
            named = {metric.name: None}  # the whole result
        else:
            local = metric.result()  # a dict names the results it holds
            held = set(local) & wanted if isinstance(local, dict) else set()
            named = {key: key for key in held}
        if named:
            entries.setdefault(id(metric), (metric, {}))[1].update(named)
            wanted -= set(named)
    central = topology.of().one_copy
    finishers: dict[str, _Finish] = {}
    for metric, keys in entries.values():
        result = _state_result(metric, together, central)
        for key, entry in keys.items():
            finishers[key] = result if entry is None else _item(result, entry)
    return finishers


def _item(result: _Finish, entry: str) -> _Finish:
    """`finish()`: the `entry` of the dict `result()` gives."""
    return lambda: result()[entry]


def _state_result(
    metric: keras.metrics.Metric, together: SummedTogether, central: bool
) -> _Finish:
    """`finish()`: `metric`'s result from its state summed across
    replicas."""
    if central:
        # One copy of each variable, updated with every replica's part.
        return _cached(lambda: metric.result())
    state = [together.add(variable.value) for variable in metric.variables]
    return _cached(lambda: metric.stateless_result([part() for part in state]))


def _cached(function: _Finish) -> _Finish:
    """`function()`, computed once for the one all-reduce of a step."""
    cache: dict[str, Any] = {}

    def cached() -> Any:
        if "value" not in cache:
            cache["value"] = function()
        return cache["value"]

    return cached


def _mean(total: tf.Tensor, count: tf.Tensor) -> tf.Tensor:
    dtype = total.dtype if total.dtype.is_floating else tf.float32
    return tf.math.divide_no_nan(tf.cast(total, dtype), tf.cast(count, dtype))


def _is_typed(value: object) -> bool:
    return isinstance(value, (ReplicaSum, ExampleMean, Synchronized))
