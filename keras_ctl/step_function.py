"""The step engine: `strategy.run`, the `steps_per_execution` loop, and one
exact cross-replica reduction of everything a step logs.

Keras 3.15 reduces every logged value with a mean over replicas (on
per-replica metric results, a mean of means) and, under
`MultiWorkerMirroredStrategy`, calls `strategy.reduce("MEAN", scalar,
axis=0)`, which fails. Here metric results are read from the metrics'
on-read variables in cross-replica context (their sums over replicas, so the
exact global value) and every other output follows its `reduction` type.
"""

import tensorflow as tf
from keras import tree

from keras_ctl import reduction


def make_step_function(model, step):
    """Returns `function(iterator) -> logs` running `step` under a strategy.

    Runs `model.steps_per_execution` steps per call (fewer at the end of the
    data) and returns the logs of the last one.
    """
    strategy = model.distribute_strategy

    def replica_step(data):
        return step(_optionals_to_none(data))

    @tf.autograph.experimental.do_not_convert
    def one_step(data):
        outputs = strategy.run(replica_step, args=(data,))
        return _reduce_logs(model, outputs, strategy)

    if model.jit_compile and strategy.num_replicas_in_sync == 1:
        # XLA cannot place a multi-device `strategy.run`; with one replica it
        # compiles the whole step.
        one_step = tf.function(one_step, jit_compile=True, reduce_retracing=True)

    steps = model.steps_per_execution

    @tf.autograph.experimental.do_not_convert
    def multi_step(iterator):
        logs = one_step(iterator.get_next())
        if steps == 1:
            return logs

        def keep_going(i, logs, next_data):
            return tf.logical_and(i < steps, next_data.has_value())

        def body(i, logs, next_data):
            logs = one_step(next_data.get_value())
            # Do not consume a batch that this execution will not run.
            next_data = tf.cond(
                i + 1 < steps,
                iterator.get_next_as_optional,
                lambda: next_data,
            )
            return i + 1, logs, next_data

        _, logs, _ = tf.while_loop(
            keep_going,
            body,
            (tf.constant(1), logs, iterator.get_next_as_optional()),
        )
        return logs

    if not model.run_eagerly:
        multi_step = _ConcreteDispatch(tf.function(multi_step, reduce_retracing=True))

    def function(iterator):
        _resume_mid_epoch(model, iterator, steps)
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            return multi_step(iterator)
        # `train_on_batch` and friends pass a plain Python iterator.
        for data in iterator:
            logs = one_step(data)
        return logs

    return function


class _ConcreteDispatch:
    """Calls a `tf.function`'s concrete function for each iterator type.

    `fit()` calls the train function once per step. `tf.function` derives a
    trace type from the iterator argument on every call, which costs about a
    fifth of a small model's step on CPU; the iterator's `TypeSpec` (about
    2 microseconds) picks the same concrete function.
    """

    def __init__(self, function):
        self.function = function
        self.concrete = {}

    def __call__(self, iterator):
        spec = tf.type_spec_from_value(iterator)
        concrete = self.concrete.get(spec)
        if concrete is not None:
            return concrete(iterator)
        # The first call goes through `tf.function`, which can create
        # variables a step makes lazily (e.g. a loaded model's optimizer).
        outputs = self.function(iterator)
        self.concrete[spec] = self.function.get_concrete_function(iterator)
        return outputs


def _resume_mid_epoch(model, iterator, steps):
    """Skips the batches a killed run trained on, set by `BackupAndRestore`.

    `model._ctl_resume` is `{"skip": batches trained, "left": batches left
    in the epoch or None}`. Keras still calls the train function once per
    batch of the whole epoch, so the calls past the data end the epoch here,
    before a step runs: a step that runs out of data mid-way may already
    have advanced stateful ops such as random generators.
    """
    resume = model.__dict__.get("_ctl_resume")
    if not resume:
        return
    for _ in range(resume.pop("skip", 0)):
        next(iterator)
    if resume["left"] is None:
        model.__dict__.pop("_ctl_resume")
        return
    if resume["left"] <= 0:
        model.__dict__.pop("_ctl_resume")
        raise StopIteration
    resume["left"] -= steps


def make_predict_function(model):
    """Returns `function(batches) -> outputs` for `predict()`.

    Keras 3.15's `predict()` passes a list of up to `steps_per_execution`
    batches. Each replica's predictions are concatenated in replica order,
    which is the order in which the global batch was split.
    """
    strategy = model.distribute_strategy

    def replica_predict(data):
        return model.predict_step(_optionals_to_none(data))

    if model.jit_compile and not model.run_eagerly:
        replica_predict = tf.function(
            replica_predict, jit_compile=True, reduce_retracing=True
        )

    @tf.autograph.experimental.do_not_convert
    def predict_batches(batches):
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

    if not model.run_eagerly:
        predict_batches = tf.function(predict_batches, reduce_retracing=True)
    return predict_batches


def _gather_batch(value, strategy):
    if strategy.num_replicas_in_sync == 1:
        return strategy.experimental_local_results(value)[0]
    # `gather` orders replicas globally, across workers too.
    return strategy.gather(value, axis=0)


def _reduce_logs(model, outputs, strategy):
    """Reduces step outputs; metric results are re-read across replicas."""
    if strategy.num_replicas_in_sync == 1 or not isinstance(outputs, dict):
        return reduction.reduce_step_outputs(outputs, strategy)
    exact = {}
    untyped = [name for name, value in outputs.items() if _is_untyped(value)]
    if untyped:
        # On-read metric variables sum over replicas when read here. A step
        # may return a metric by its own name (`compile_metrics` gives a
        # dict) or by the names `get_metrics_result()` flattens it to.
        with strategy.scope():
            by_metric = {m.name: m for m in model.metrics}
            flat = None
            for name in untyped:
                if name in by_metric:
                    exact[name] = by_metric[name].result()
                else:
                    flat = model.get_metrics_result() if flat is None else flat
                    if name in flat:
                        exact[name] = flat[name]
    rest = {name: value for name, value in outputs.items() if name not in exact}
    logs = reduction.reduce_step_outputs(rest, strategy)
    return {name: exact[name] if name in exact else logs[name] for name in outputs}


def _is_untyped(value):
    return not isinstance(
        value, (reduction.ReplicaSum, reduction.ExampleMean, reduction.Synchronized)
    )


def _optionals_to_none(data):
    return tree.map_structure(
        lambda value: None if isinstance(value, tf.experimental.Optional) else value,
        data,
    )
