"""The train and test functions that `fit()` and `evaluate()` call.

For each call (one execution of up to `steps_per_execution` steps):

    resumed run?  replay the epochs trained before the backup; skip the
                  batches of the resumed epoch a killed run trained on
    loop = counted, when the number of batches left is known (arrays, a
           dataset's cardinality); else checked (asks before each batch);
           the first call runs eagerly when the step builds state;
           its first batch is read and measured first when the step has
           a measurement (`loss_mean`) and the schedule says so
           (`measurement_schedule`), then trained on
    logs = loop(iterator)      # steps, then one reduction of the last logs
    return logs, with a preemption notice shared by every worker

Keras 3.15 reduces every logged value with a mean over replicas (on
per-replica metric results, a mean of means) and, under
`MultiWorkerMirroredStrategy`, calls `strategy.reduce("MEAN", scalar,
axis=0)`, which fails; reading metric results in cross-replica context
costs one collective per metric variable. Here every output follows
`keras_ctl.outputs.all_reduce_logs`, inside the replica step: one
collective for all the logs (`replica_step.ReplicaStep.logs`).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from keras_ctl import _keras
from keras_ctl import _replaced
from keras_ctl._engine import errors
from keras_ctl._engine import loop
from keras_ctl._engine.autograph import not_converted
from keras_ctl._engine.measurement_schedule import MeasurementSchedule
from keras_ctl._engine.plan import StepPlan
from keras_ctl._engine.replica_step import MeasuredBatch
from keras_ctl._engine.replica_step import ReplicaStep
from keras_ctl._engine.replica_step import StepParts
from keras_ctl._keras.iterators import DeferredIterator
from keras_ctl._keras.iterators import opened
from keras_ctl._keras.iterators import replay_epochs
from keras_ctl.distribute import preemption


class StepFunction:
    """The train or test function: `function(iterator) -> logs`.

    Runs `plan.steps_per_execution` steps per call (fewer at the end of the
    data) and returns the logs of the last one. The train function
    (`training`) follows the engine state's resume plan when it has one.

    `graphs()` lists the graphs traced so far, for counting what a step does
    (`benchmarks/bench.py` counts its collectives). `steps(count)` is the
    `tf.function` running `count` steps per call, which a
    `ClusterCoordinator` schedules on the workers.

    Args:
        parts: The `StepParts` the step runs with.
        step: `step(data) -> outputs`, run on every replica.
        plan: The `StepPlan`.
        training: Whether this is the train function.
    """

    def __init__(
        self,
        parts: StepParts,
        step: Callable[[Any], Any],
        plan: StepPlan,
        training: bool = False,
    ) -> None:
        self._step = ReplicaStep(parts, step, plan, training)
        self._engine = parts.state
        self._training = training
        self._builds_on_first_use = parts.builds_on_first_use
        self._steps = plan.steps_per_execution
        self._run_eagerly = plan.run_eagerly
        self._first_call = True
        self._measurement = parts.measurement
        self._schedule = MeasurementSchedule(parts.state)
        # What measurements traced, for the next (`measuring.on_replicas`).
        self._measurement_traces: dict[Any, Any] = {}
        # For a call whose first batch was read before it.
        self._one: dict[str, Any] = {}  # `tf.function`s by batch spec
        self._checked_after_first: Callable[[Any], Any] | None = None
        self._counts: dict[int, tf.Tensor] = {}
        self._scheduled: dict[int, Any] = {}
        steps = plan.steps_per_execution
        # A step whose batches are measured runs one batch read before its
        # call (`_after_first_batch`): with one step a call, the loops run
        # that step's trace, so the step is traced once for both.
        one = None
        if self._measurement is not None and steps == 1 and not plan.run_eagerly:
            one = self._one_of_iterator
        # `loop(iterator, count=...)` and `loop(iterator)`, traced once
        # per iterator type unless the plan runs eagerly.
        self._counted: Callable[..., Any] = loop.counted(self._step, steps, one=one)
        self._checked: Callable[..., Any] = loop.checked(self._step, steps, one=one)
        # In place of a traced function: for a first step that builds state.
        self._eager = loop.checked(self._step, steps, stands_for_trace=True)
        if not plan.run_eagerly:
            self._counted = _ConcreteDispatch(self._counted)
            self._checked = _ConcreteDispatch(self._checked)

    def __call__(self, iterator: Any) -> Any:
        # Keras's `train_on_batch` and friends call it outside `fit()`.
        with _keras.in_effect():
            self._before_call(iterator)
            return preemption.after_step(self._run(iterator))

    def _before_call(self, iterator: Any) -> None:
        engine = self._engine
        if self._training and engine.epochs_to_replay is not None:
            replay_epochs(iterator, engine.epochs_to_replay)
            engine.epochs_to_replay = None
        resume = engine.resume_plan if self._training else None
        if resume is not None:
            if resume.finished:
                engine.resume_plan = None
            else:
                resume.before_call(iterator, self._steps)
        if self._step.notice is not None:
            preemption.before_step()

    def _run(self, iterator: Any) -> Any:
        deferred, iterator = iterator, opened(iterator)
        if not isinstance(
            iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)
        ):
            # `train_on_batch` and friends pass a plain Python iterator.
            for data in iterator:
                logs = _explaining_errors(self._step.one, data, self._step)
            return logs
        count = None
        if isinstance(deferred, DeferredIterator):
            count = deferred.batches_for_call(self._steps)
        loop_for_call = self._loop_for(count)
        spec = iterator.element_spec
        measurement = self._measurement
        number = None if measurement is None else self._schedule.due(spec)
        if measurement is not None and number is not None:
            # The batch, read and measured before any step runs on it.
            iterator = _FirstBatchRead(iterator)
            eagerly = loop_for_call is self._eager or self._run_eagerly
            batch = MeasuredBatch(
                iterator.first,
                spec,
                self._step,
                eagerly,
                number,
                self._measurement_traces,
            )
            # What stops the step as it runs stops its measurement too.
            again = _explaining_errors(measurement, batch, self._step)
            self._schedule.measured(number, spec, again)
            if not eagerly:
                loop_for_call = functools.partial(self._after_first_batch, count=count)
        try:
            logs = _explaining_errors(loop_for_call, iterator, self._step)
        except Exception as error:
            if not _replaced.seed_generators.needs_eager_step(error):
                raise
            # State the step creates on first use (the seed generators of
            # unseeded draws): created by this call, run eagerly.
            if isinstance(iterator, _FirstBatchRead):
                iterator.unread()
            logs = _explaining_errors(self._eager, iterator, self._step)
        if count is not None:
            deferred.took(count)
        self._schedule.ran(self._steps if count is None else count)
        return logs

    def _loop_for(self, count: int | None) -> Callable[[Any], Any]:
        """The loop of this call: where running out of data is decided."""
        first_call, self._first_call = self._first_call, False
        if first_call and self._builds_on_first_use():
            # Optimizers, compiled losses and metrics that the step builds
            # on first use (the keras.io GAN's optimizers, a step of one's
            # own's compiled metrics) cannot create variables in a traced
            # replica step.
            return self._eager
        if count is None or self._run_eagerly:
            return self._checked
        if count not in self._counts:
            self._counts[count] = tf.constant(count)
        return functools.partial(self._counted, count=self._counts[count])

    def _after_first_batch(self, read: _FirstBatchRead, count: int | None) -> Any:
        """The call's steps, traced: the first on the batch `read` holds,
        then the others (`count - 1`, or up to `steps_per_execution - 1`
        while the data lasts) from its iterator."""
        # Traced for the iterator's batches (a dynamic batch size), as the
        # other steps are, not for the shapes of the one read.
        logs = self._one_for(read.iterator.element_spec)(read.get_next())
        if count is not None:
            if count > 1:
                logs = self._counted(read.iterator, count=tf.constant(count - 1))
            return logs
        if self._steps == 1:
            return logs
        if self._checked_after_first is None:
            checked = loop.checked(self._step, self._steps - 1)
            self._checked_after_first = _ConcreteDispatch(checked)
        try:
            return self._checked_after_first(read.iterator)
        except tf.errors.OutOfRangeError:
            return logs  # the data held one batch

    def _one_for(self, spec: Any) -> Any:
        """The step and its logs on one batch of `spec`, traced once."""
        one = self._one.get(repr(spec))
        if one is None:
            # A `partial`: TensorFlow counts the traces of every function
            # of one code together, and warns of retracing when models are
            # made one after another (a tuner's trials).
            step = functools.partial(not_converted(self._step.one))
            one = self._one[repr(spec)] = tf.function(step, input_signature=[spec])
        return one

    def _one_of_iterator(self, iterator: Any, data: Any) -> Any:
        """`_one_for` the iterator's batches, on `data`: called as a loop is
        traced, it traces the step or calls its trace."""
        return self._one_for(iterator.element_spec)(data)

    def steps(self, count: int) -> Any:
        """The `tf.function` running up to `count` steps per call."""
        if count not in self._scheduled:
            self._scheduled[count] = tf.function(
                loop.checked(self._step, count), reduce_retracing=True
            )
        return self._scheduled[count]

    def graphs(self) -> list[tf.Graph]:
        """The graphs traced so far: those running a known number of steps
        first, then those that check for data at every step, then those
        running the one step of a measured batch."""
        return [
            concrete.graph
            for function in (self._counted, self._checked)
            if isinstance(function, _ConcreteDispatch)  # not run eagerly
            for concrete in function.concrete.values()
        ] + [one.get_concrete_function().graph for one in self._one.values()]


class _FirstBatchRead:
    """An iterator whose first batch is read already (`first`): the next
    `get_next()` returns it, every other read is the `iterator`'s. An eager
    loop reads through it; a traced one needs the iterator itself."""

    def __init__(self, iterator: Any) -> None:
        self.iterator = iterator
        self.first = iterator.get_next()
        self._unread = True

    def unread(self) -> None:
        """Makes the next `get_next()` return the first batch again."""
        self._unread = True

    def get_next(self) -> Any:
        if self._unread:
            self._unread = False
            return self.first
        return self.iterator.get_next()

    def get_next_as_optional(self) -> Any:
        return self.iterator.get_next_as_optional()


def _explaining_errors(
    function: Callable[[Any], Any], argument: Any, step: ReplicaStep
) -> Any:
    try:
        return function(argument)
    except tf.errors.InvalidArgumentError as error:
        replicas = step.strategy.num_replicas_in_sync
        explanation = errors.explained(error, replicas, step.logs_not_scalar)
        if explanation is None:
            raise
        raise explanation from error


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

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        self.concrete: dict[Any, Any] = {}
        # Each iterator's TypeSpec and components, for as long as it lives:
        # its components keep its resources (prefetching threads) alive.
        self._flat: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def __call__(self, iterator: Any, **tensors: Any) -> Any:
        flat = self._flat.get(iterator)
        if flat is None:
            spec = tf.type_spec_from_value(iterator)
            flat = spec, tf.nest.flatten(iterator, expand_composites=True)
            self._flat[iterator] = flat
        spec, components = flat
        concrete = self.concrete.get(spec)
        if concrete is not None:
            return concrete(components, **tensors)

        @not_converted
        def rebuilt(components: Any, **tensors: Any) -> Any:
            iterator = tf.nest.pack_sequence_as(
                spec, components, expand_composites=True
            )
            return self.function(iterator, **tensors)

        # The first call goes through `tf.function`, which can create
        # variables a step makes lazily (e.g. a loaded model's optimizer).
        # A `partial`: TensorFlow counts the traces of all functions of one
        # code together, and warned of retracing after five models.
        traced = tf.function(functools.partial(rebuilt), reduce_retracing=True)
        outputs = traced(components, **tensors)
        self.concrete[spec] = traced.get_concrete_function(components, **tensors)
        return outputs
