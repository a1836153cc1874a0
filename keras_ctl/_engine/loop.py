"""The loop shapes of the train, test and predict functions, one factory
each (the parameter-server loop is `parameter_servers.fit`, which
schedules `checked` loops on the workers).

Keras calls callbacks once per execution, with its last logs, so the logs
are reduced once per execution too. Whether the data lasts is decided in
one place, the step function's choice of loop for a call
(`step_function.StepFunction`): with the number of batches left known,
`counted` reads exactly that many; otherwise `checked` asks before every
batch, and under several workers that asking is an all-reduce per batch
(`DistributedIterator.get_next_as_optional`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
from keras import tree

from keras_ctl import _keras
from keras_ctl._engine.autograph import not_converted
from keras_ctl._engine.plan import StepPlan
from keras_ctl._engine.replica_step import ReplicaStep
from keras_ctl._engine.replica_step import Trace
from keras_ctl._engine.replica_step import optionals_to_none
from keras_ctl._keras.iterators import next_batch


def counted(
    step: ReplicaStep,
    steps: int,
    stands_for_trace: bool = False,
    one: Callable[[Any, Any], Any] | None = None,
) -> Callable[[Any, tf.Tensor], Any]:
    """`loop(iterator, count)`: exactly `count` (<= `steps`) steps, their
    batches read without asking whether there is one.

        outputs = step(next batch)
        repeat count - 1 times:             # unrolled if the step gathers
            outputs = step(next batch)
        return logs(outputs)

    `one(iterator, batch)`, where given, is the step and its logs on one
    batch of the iterator, traced apart (the step function's, which a
    measured batch runs too): with one step a call, the loop calls it, so
    the step is traced once for both.
    """

    @not_converted
    def loop(iterator: Any, count: tf.Tensor) -> Any:
        trace = Trace(stands_for_trace)

        def batch() -> Any:
            return next_batch(iterator)

        if steps == 1 and one is not None:
            return one(iterator, batch())
        if steps == 1:
            return step.logs(step.run(batch(), trace), trace)
        traced = _ops_so_far()
        outputs = step.run(batch(), trace)
        if _gathers_across_replicas(since=traced):
            outputs = _unrolled(
                step, trace, steps, outputs, lambda i: (i < count, batch)
            )
        else:
            _, outputs = tf.while_loop(
                lambda i, outputs: i < count,
                lambda i, outputs: (i + 1, step.run(batch(), trace)),
                (tf.constant(1), outputs),
            )
        return step.logs(outputs, trace)

    return loop


def checked(
    step: ReplicaStep,
    steps: int,
    stands_for_trace: bool = False,
    one: Callable[[Any, Any], Any] | None = None,
) -> Callable[[Any], Any]:
    """`loop(iterator)`: up to `steps` steps while the data lasts, every
    batch read with the workers' agreement on whether any replica has one.

        outputs = step(next batch)          # the epoch's end if there is none
        next = next batch, if any
        while fewer than steps and next:    # unrolled if the step gathers
            outputs = step(next)
            next = next batch, if any and another step is to run
        return logs(outputs)

    `one`: as for `counted`.
    """

    @not_converted
    def loop(iterator: Any) -> Any:
        trace = Trace(stands_for_trace)
        if steps == 1 and one is not None:
            return one(iterator, iterator.get_next())
        if steps == 1:
            return step.logs(step.run(iterator.get_next(), trace), trace)
        traced = _ops_so_far()
        outputs = step.run(iterator.get_next(), trace)
        if _gathers_across_replicas(since=traced):

            def next_step(i: int) -> tuple[tf.Tensor, Callable[[], Any]]:
                data = iterator.get_next_as_optional()
                return data.has_value(), data.get_value

            outputs = _unrolled(step, trace, steps, outputs, next_step)
            return step.logs(outputs, trace)

        def keep_going(i: tf.Tensor, outputs: Any, next_data: Any) -> tf.Tensor:
            return tf.logical_and(i < steps, next_data.has_value())

        def body(i: tf.Tensor, outputs: Any, next_data: Any) -> tuple[Any, ...]:
            outputs = step.run(next_data.get_value(), trace)
            # Do not consume a batch that this execution will not run.
            next_data = tf.cond(
                i + 1 < steps, iterator.get_next_as_optional, lambda: next_data
            )
            return i + 1, outputs, next_data

        first = (tf.constant(1), outputs, iterator.get_next_as_optional())
        _, outputs, _ = tf.while_loop(keep_going, body, first)
        return step.logs(outputs, trace)

    return loop


def _unrolled(
    step: ReplicaStep,
    trace: Trace,
    steps: int,
    outputs: Any,
    next_step: Callable[[int], tuple[Any, Callable[[], Any]]],
) -> Any:
    """Steps 2 to `steps`, each traced on its own; `next_step(i)` gives
    whether step `i` runs and a function reading its batch. A step that
    all-gathers (sparse gradients, whose rows vary with the batch) cannot
    run in a `tf.while_loop`, where TensorFlow keeps each collective's shape
    from its first iteration ("Shape mismatch in the collective instance"
    at a smaller last batch, TensorFlow 2.21)."""
    for i in range(1, steps):
        runs, batch = next_step(i)
        outputs = tf.cond(
            runs,
            lambda batch=batch: step.run(batch(), trace),
            lambda outputs=outputs: outputs,
        )
    return outputs


def _ops_so_far() -> int:
    return len(tf.compat.v1.get_default_graph().get_operations())


def _gathers_across_replicas(since: int) -> bool:
    """Whether the current graph's ops from index `since` on (a step just
    traced) hold an all-gather, whose shape may change from step to step.
    `tf.distribute`'s sum of sparse gradients gathers their row counts
    first, outside the `tf.cond` that gathers the rows."""
    ops = tf.compat.v1.get_default_graph().get_operations()[since:]
    return any(_keras.ops.is_all_gather(op.type) for op in ops)


def predict(
    strategy: tf.distribute.Strategy,
    predict_step: Callable[[Any], Any],
    plan: StepPlan,
) -> Callable[[list[Any]], Any]:
    """`loop(batches) -> outputs` for `predict()`, which passes a list of up
    to `steps_per_execution` batches (Keras 3.15).

        for each batch:
            predictions = predict_step(batch)     # on every replica
            outputs += gather(predictions)        # in replica order

    Each replica's predictions are concatenated in replica order, which is
    the order in which the global batch was split.
    """

    def replica_predict(data: Any) -> Any:
        # A replica without examples predicts no rows (layers that fail on
        # an empty batch run on a placeholder: `_keras.replica_step`).
        with _keras.replica_step():
            return predict_step(optionals_to_none(data))

    # XLA cannot place a per-replica prediction whose variables live on
    # several devices (a replica's compiled function reads another's copy),
    # so under several replicas predictions run without it.
    if plan.xla == "whole_step":
        replica_predict = tf.function(
            replica_predict, jit_compile=True, reduce_retracing=True
        )

    @not_converted
    def loop(batches: list[Any]) -> Any:
        outputs = None
        for data in batches:
            step_outputs = strategy.run(replica_predict, args=(data,))
            step_outputs = tree.map_structure(
                lambda value: _gather_batch(value, strategy), step_outputs
            )
            if outputs is None:
                outputs = step_outputs
            else:
                outputs = tree.map_structure(
                    lambda a, b: tf.concat([a, b], axis=0), outputs, step_outputs
                )
        return outputs

    if not plan.run_eagerly:
        loop = tf.function(loop, reduce_retracing=True)
    return loop


def _gather_batch(value: Any, strategy: tf.distribute.Strategy) -> Any:
    if strategy.num_replicas_in_sync == 1:
        return strategy.experimental_local_results(value)[0]
    # `gather` orders replicas globally, across workers too.
    return strategy.gather(value, axis=0)
