"""The train, test and predict functions: `strategy.run`, the
`steps_per_execution` loop, and one exact reduction of what a step logs.

The loop, for each call of the train (or test) function by `fit()`:

    resume plan?  skip the batches a killed run trained on, or end the epoch
    count = min(steps_per_execution, batches left), when the data's length
            is known (arrays, a dataset's cardinality)
    repeat count times (else up to steps_per_execution times, while the
    data lasts):
        outputs = step(next batch)            # on every replica
    logs = all_reduce_logs(last outputs)      # on every replica, one collective
    return logs

Keras calls callbacks once per execution, with its last logs, so the logs
are reduced once per execution too.

Running out of data is handled in one place: when the length is known, the
count; otherwise `get_next_as_optional` inside the loop (Keras's epoch
iterator ends the epoch for the first batch), which under several workers
agrees on it with an all-reduce per batch (`_keras.iterators.next_batch`).

Keras 3.15 reduces every logged value with a mean over replicas (on
per-replica metric results, a mean of means) and, under
`MultiWorkerMirroredStrategy`, calls `strategy.reduce("MEAN", scalar,
axis=0)`, which fails; reading metric results in cross-replica context
costs one collective per metric variable. Here every output follows
`keras_ctl.outputs.all_reduce_logs`, inside the replica step: one
collective for all the logs.
"""

import contextlib
import functools
import weakref
from typing import Callable
from typing import NamedTuple

import tensorflow as tf
from keras import tree

from keras_ctl import _keras
from keras_ctl import outputs as outputs_module
from keras_ctl._engine import errors
from keras_ctl._engine import own_step
from keras_ctl._keras.iterators import DeferredIterator
from keras_ctl._keras.iterators import next_batch
from keras_ctl._keras.iterators import opened
from keras_ctl._keras.iterators import replay_epochs
from keras_ctl._replicas import rows_and_offset
from keras_ctl.distribute import preemption
from keras_ctl.distribute import topology


class StepParts(NamedTuple):
    """What a train or test function runs besides its step and plan.

    The callables are read when the step is traced (or, for
    `builds_on_first_use`, at the first call): a model's optimizers and
    metrics can be built lazily.

    Attributes:
        strategy: The strategy the step runs under.
        state: The model's `EngineState` (accumulation, resume plan).
        optimizers: Returns the optimizers the step updates.
        metrics: Returns the model's metrics, whose state the step updates.
        builds_on_first_use: Returns whether the first step creates
            variables (optimizers, compiled loss or metrics built on first
            use), so it must run eagerly under several replicas.
        reads_as_one_device: Whether the step is the user's own, read as
            one device's code (`own_step`).
        random_as_one_device: Whether Keras's random draws of a batch's
            rows draw one device's numbers for them
            (`compile(random_draws="as_one_device")`).
    """

    strategy: tf.distribute.Strategy
    state: object
    optimizers: Callable[[], list]
    metrics: Callable[[], list]
    builds_on_first_use: Callable[[], bool]
    reads_as_one_device: bool = False
    random_as_one_device: bool = False


def make_step_function(parts, step, plan, training=False):
    """Returns `function(iterator) -> logs` running `step` under a strategy.

    Runs `plan.steps_per_execution` steps per call (fewer at the end of the
    data) and returns the logs of the last one. The train function
    (`training`) follows the state's `ResumePlan` when it has one, and
    updates the optimizers' EMA after the replicas' step.

    Args:
        parts: The `StepParts` the step runs with.
        step: `step(data) -> outputs`, run on every replica.
        plan: The `StepPlan`.
        training: Whether this is the train function.
    """
    strategy = parts.strategy
    engine = parts.state
    # Workers share a preemption notice through the logs' all-reduce.
    notice = None
    if topology.of(strategy).workers > 1:
        notice = preemption.notice_variable()

    # The variables the step assigns, noted as it is traced: the logs
    # re-read only the metrics it updated.
    written = set()
    # Whether the step runs eagerly in place of its traced function (the
    # first step, when it builds state).
    for_trace = [False]
    # The logged values that are metric results, noted as the step is
    # traced: `{key: (metric, entry)}`.
    results = {}

    draws_as_one_device = parts.random_as_one_device and (
        strategy.num_replicas_in_sync > 1
    )

    def replica_step(data):
        data = _optionals_to_none(data)
        with (
            _keras.replica_step(written, stands_for_trace=for_trace[0]),
            _random_rows_as_one_device(data, draws_as_one_device),
        ):
            with _keras.results_noted(parts.metrics()) as noted:
                if parts.reads_as_one_device:
                    outputs = own_step.run_as_one_device(step, data)
                else:
                    outputs = step(data)
            results.update(_keras.metric_results_among(outputs, noted))
            return outputs

    @tf.autograph.experimental.do_not_convert
    def run_step(data):
        """The step on every replica; returns each replica's own outputs."""
        if not training:
            return strategy.run(replica_step, args=(data,))
        ema = _keras.EmaAfterStep(parts.optimizers())
        if engine.accumulation:
            outputs = engine.accumulation.run(
                lambda: strategy.run(replica_step, args=(data,))
            )
        else:
            outputs = strategy.run(replica_step, args=(data,))
        ema.update()
        return outputs

    def replica_logs(outputs):
        # The logs' collective comes after the updates' (collective order
        # must be the same on every replica).
        outputs, fraction = own_step.logs_and_fraction(outputs)
        if notice is not None and isinstance(outputs, dict):
            shared = outputs_module.ReplicaSum(notice.read_value())
            outputs = {**outputs, preemption.NOTICE_LOG: shared}
        updates_done = [tf.identity(o.iterations) for o in parts.optimizers()]
        with tf.control_dependencies(updates_done):
            updated = _keras.updated_metrics(parts.metrics(), written)
            return outputs_module.reduce_step_logs(outputs, updated, results, fraction)

    @tf.autograph.experimental.do_not_convert
    def reduce_logs(outputs):
        logs = strategy.run(replica_logs, args=(outputs,))
        # Every replica holds the same logs.
        return tf.nest.map_structure(
            lambda value: strategy.experimental_local_results(value)[0], logs
        )

    if plan.xla == "whole_step":
        run_step = tf.function(run_step, jit_compile=True, reduce_retracing=True)

    def one_step(data):
        return reduce_logs(run_step(data))

    def counted_steps_of(steps):
        """`function(iterator, count)`: exactly `count` (<= `steps`) steps,
        their batches read without asking whether there is one."""

        @tf.autograph.experimental.do_not_convert
        def counted_steps(iterator, count):
            def batch():
                return next_batch(iterator)

            if steps == 1:
                return one_step(batch())
            traced = len(tf.compat.v1.get_default_graph().get_operations())
            outputs = run_step(batch())
            if _gathers_across_replicas(since=traced):
                return reduce_logs(
                    unrolled(steps, outputs, lambda i: (i < count, batch))
                )
            _, outputs = tf.while_loop(
                lambda i, outputs: i < count,
                lambda i, outputs: (i + 1, run_step(batch())),
                (tf.constant(1), outputs),
            )
            return reduce_logs(outputs)

        return counted_steps

    def checked_steps_of(steps):
        """`function(iterator)`: up to `steps` steps while the data lasts,
        every batch read with the workers' agreement on whether any
        replica has one."""

        @tf.autograph.experimental.do_not_convert
        def checked_steps(iterator):
            if steps == 1:
                return one_step(iterator.get_next())
            traced = len(tf.compat.v1.get_default_graph().get_operations())
            outputs = run_step(iterator.get_next())
            if _gathers_across_replicas(since=traced):

                def next_step(i):
                    data = iterator.get_next_as_optional()
                    return data.has_value(), data.get_value

                return reduce_logs(unrolled(steps, outputs, next_step))

            def keep_going(i, outputs, next_data):
                return tf.logical_and(i < steps, next_data.has_value())

            def body(i, outputs, next_data):
                outputs = run_step(next_data.get_value())
                # Do not consume a batch that this execution will not run.
                next_data = tf.cond(
                    i + 1 < steps,
                    iterator.get_next_as_optional,
                    lambda: next_data,
                )
                return i + 1, outputs, next_data

            _, outputs, _ = tf.while_loop(
                keep_going,
                body,
                (tf.constant(1), outputs, iterator.get_next_as_optional()),
            )
            return reduce_logs(outputs)

        return checked_steps

    def unrolled(steps, outputs, next_step):
        """Steps 2 to `steps`, each traced on its own; `next_step(i)` gives
        whether step `i` runs and a function reading its batch. A step that
        all-gathers (sparse gradients, whose rows vary with the batch)
        cannot run in a `tf.while_loop`, where TensorFlow keeps each
        collective's shape from its first iteration ("Shape mismatch in the
        collective instance" at a smaller last batch, TensorFlow 2.21)."""
        for i in range(1, steps):
            runs, batch = next_step(i)
            outputs = tf.cond(
                runs,
                lambda batch=batch: run_step(batch()),
                lambda outputs=outputs: outputs,
            )
        return outputs

    steps_per_execution = plan.steps_per_execution
    checked = checked_steps_of(steps_per_execution)
    counted = counted_steps_of(steps_per_execution)
    eager_checked = checked
    if not plan.run_eagerly:
        checked = _ConcreteDispatch(checked)
        counted = _ConcreteDispatch(counted)
    counts = {}
    first_call = [True]

    def call(iterator):
        if training and engine.epochs_to_replay is not None:
            replay_epochs(iterator, engine.epochs_to_replay)
            engine.epochs_to_replay = None
        resume = engine.resume_plan if training else None
        if resume is not None:
            if resume.finished:
                engine.resume_plan = None
            else:
                resume.before_call(iterator, steps_per_execution)
        if notice is not None:
            preemption.before_step()
        deferred = iterator
        iterator = opened(iterator)
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            count = None
            if isinstance(deferred, DeferredIterator):
                count = deferred.batches_for_call(steps_per_execution)
            if first_call[0] and parts.builds_on_first_use():
                # Optimizers, compiled losses and metrics that the step
                # builds on first use (the keras.io GAN's optimizers, a step
                # of one's own's compiled metrics) cannot create variables
                # in a traced replica step.
                run = _standing_for_trace(eager_checked, for_trace)
            elif count is None or plan.run_eagerly:
                run = checked
            else:
                if count not in counts:
                    counts[count] = tf.constant(count)
                run = functools.partial(counted, count=counts[count])
            first_call[0] = False
            try:
                logs = _explaining_errors(run, iterator)
            except Exception as error:
                if not _needs_eager_step(error):
                    raise
                # State the step creates on first use (the seed generators
                # of unseeded draws): created by this call, run eagerly.
                eager = _standing_for_trace(eager_checked, for_trace)
                logs = _explaining_errors(eager, iterator)
            if count is not None:
                deferred.took(count)
            return preemption.after_step(logs)
        # `train_on_batch` and friends pass a plain Python iterator.
        for data in iterator:
            logs = _explaining_errors(one_step, data)
        return preemption.after_step(logs)

    scheduled = {}

    def steps_per_call(count):
        if count not in scheduled:
            scheduled[count] = tf.function(
                checked_steps_of(count), reduce_retracing=True
            )
        return scheduled[count]

    return StepFunction(call, [counted, checked], steps_per_call)


def _standing_for_trace(function, flag):
    """`function`, with `flag[0]` true while it runs: an eager step run in
    place of the traced one reports what the traced one would
    (`_keras.replica_step`)."""

    def run(argument):
        flag[0] = True
        try:
            return function(argument)
        finally:
            flag[0] = False

    return run


def _needs_eager_step(error):
    """Whether `error` (or an error it was raised from: AutoGraph wraps what
    a converted function raises) is `_keras.NeedsEagerStep`."""
    while error is not None:
        if isinstance(error, _keras.NeedsEagerStep):
            return True
        error = error.__cause__ or error.__context__
    return False


def _explaining_errors(function, argument):
    try:
        return function(argument)
    except tf.errors.InvalidArgumentError as error:
        explanation = errors.explained(error)
        if explanation is None:
            raise
        raise explanation from error


class StepFunction:
    """The train or test function: `function(iterator) -> logs`.

    `graphs()` lists the graphs traced so far, for counting what a step does
    (`benchmarks/bench.py` counts its collectives). `steps(count)` is the
    `tf.function` running `count` steps per call, which a
    `ClusterCoordinator` schedules on the workers.
    """

    def __init__(self, call, traced, steps_per_call):
        self._call = call
        self._traced = traced
        self.steps = steps_per_call

    def __call__(self, iterator):
        # Keras's `train_on_batch` and friends call it outside `fit()`.
        with _keras.in_effect():
            return self._call(iterator)

    def graphs(self):
        """The graphs traced so far: those running a known number of steps
        first, then those that check for data at every step."""
        return [
            concrete.graph
            for function in self._traced
            if isinstance(function, _ConcreteDispatch)  # not run eagerly
            for concrete in function.concrete.values()
        ]


class _ConcreteDispatch:
    """Calls `function(iterator, **tensors)`, traced once per iterator type,
    with the iterator passed as its component tensors.

    `fit()` calls the train function once per step. Passed the iterator,
    `tf.function` derives a trace type from it on every call (about a fifth
    of a small model's step on CPU), and even a concrete function flattens
    the iterator's structure to bind it (about 0.3 ms a call on 2 replicas,
    TensorFlow 2.21). Its component tensors (its resources), flattened once
    per iterator, bind as a flat list of tensors; the traced function
    rebuilds the iterator from them and its `TypeSpec`.
    """

    def __init__(self, function):
        self.function = function
        self.concrete = {}
        # Each iterator's TypeSpec and components, for as long as it lives:
        # its components keep its resources (prefetching threads) alive.
        self._flat = weakref.WeakKeyDictionary()

    def __call__(self, iterator, **tensors):
        flat = self._flat.get(iterator)
        if flat is None:
            spec = tf.type_spec_from_value(iterator)
            flat = spec, tf.nest.flatten(iterator, expand_composites=True)
            self._flat[iterator] = flat
        spec, components = flat
        concrete = self.concrete.get(spec)
        if concrete is not None:
            return concrete(components, **tensors)

        @tf.autograph.experimental.do_not_convert
        def rebuilt(components, **tensors):
            iterator = tf.nest.pack_sequence_as(
                spec, components, expand_composites=True
            )
            return self.function(iterator, **tensors)

        # The first call goes through `tf.function`, which can create
        # variables a step makes lazily (e.g. a loaded model's optimizer).
        traced = tf.function(rebuilt, reduce_retracing=True)
        outputs = traced(components, **tensors)
        self.concrete[spec] = traced.get_concrete_function(components, **tensors)
        return outputs


@contextlib.contextmanager
def _random_rows_as_one_device(data, as_one_device):
    """Within it, this replica's random draws of its rows are one device's
    (`_keras.draw_rows_as_one_device`), when `as_one_device`."""
    if not as_one_device:
        yield
        return
    rows = tf.shape([t for t in tree.flatten(data) if t is not None][0])[0]
    with _keras.draw_rows_as_one_device(*rows_and_offset(rows)):
        yield


def make_predict_function(strategy, predict_step, plan):
    """Returns `function(batches) -> outputs` for `predict()`.

    Keras 3.15's `predict()` passes a list of up to `steps_per_execution`
    batches. Each replica's predictions are concatenated in replica order,
    which is the order in which the global batch was split.

    Args:
        strategy: The strategy the predictions run under.
        predict_step: `predict_step(data) -> predictions`, on every replica.
        plan: The `StepPlan` (`run_eagerly`; XLA only as `"whole_step"`).
    """

    def replica_predict(data):
        # A replica without examples predicts no rows (layers that fail on
        # an empty batch run on a placeholder: `_keras.replica_step`).
        with _keras.replica_step():
            return predict_step(_optionals_to_none(data))

    # XLA cannot place a per-replica prediction whose variables live on
    # several devices (a replica's compiled function reads another's copy),
    # so under several replicas predictions run without it.
    if plan.xla == "whole_step":
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

    if not plan.run_eagerly:
        predict_batches = tf.function(predict_batches, reduce_retracing=True)
    return predict_batches


def _gather_batch(value, strategy):
    if strategy.num_replicas_in_sync == 1:
        return strategy.experimental_local_results(value)[0]
    # `gather` orders replicas globally, across workers too.
    return strategy.gather(value, axis=0)


def _gathers_across_replicas(since):
    """Whether the current graph's ops from index `since` on (a step just
    traced) hold an all-gather, whose shape may change from step to step.
    `tf.distribute`'s sum of sparse gradients gathers their row counts
    first, outside the `tf.cond` that gathers the rows."""
    ops = tf.compat.v1.get_default_graph().get_operations()[since:]
    return any(op.type == "CollectiveGatherV2" for op in ops)


def _optionals_to_none(data):
    return tree.map_structure(
        lambda value: None if isinstance(value, tf.experimental.Optional) else value,
        data,
    )
