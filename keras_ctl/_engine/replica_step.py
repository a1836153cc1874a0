"""One step on every replica, and its logs reduced once: what each loop
shape of `loop.py` runs.

    outputs = strategy.run(step, data)          # with accumulation and EMA
    logs = strategy.run(replica logs, outputs)  # one collective for all logs

What tracing the step notes for its logs (the variables it writes, the
logged values that are metric results) is a `Trace`, which the loop makes
for each function it traces and hands to the step and then to its logs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any
from typing import NamedTuple

import tensorflow as tf
from keras import tree

from keras_ctl import _keras
from keras_ctl import _replaced
from keras_ctl import outputs as outputs_module
from keras_ctl._engine import batch_statistics
from keras_ctl._engine import own_step
from keras_ctl._engine import random_draws
from keras_ctl._engine.autograph import not_converted
from keras_ctl._engine.plan import StepPlan
from keras_ctl._engine.positions import without_positions
from keras_ctl._engine.state import EngineState
from keras_ctl._example_dependence import eager_ops_noted
from keras_ctl._replicas import examples_before
from keras_ctl._replicas import static_rows
from keras_ctl.distribute import preemption
from keras_ctl.distribute import topology


class StepParts(NamedTuple):
    """What a train or test function runs besides its step and plan.

    The callables are read when the step is traced (or, for
    `builds_on_first_use`, at the first call): a model's metrics can be
    built lazily.

    Attributes:
        strategy: The strategy the step runs under.
        state: The model's `EngineState` (accumulation, resume plan).
        optimizers: The optimizers the step updates (the model's
            `optimizers_and_variables()` when the function was made).
        metrics: Returns the model's metrics, whose state the step updates.
        builds_on_first_use: Returns whether the first step creates
            variables (optimizers, compiled loss or metrics built on first
            use), so it must run eagerly under several replicas.
        reads_as_one_device: Whether the step is the user's own, read as
            one device's code (`own_step`).
        step_name: The step as messages name it (`"MyModel.train_step"`).
        weights: Returns the model's weights, whose batch statistics a
            training step checks (`batch_statistics`).
        random_as_one_device: Whether Keras's random draws of a batch's
            rows draw one device's numbers for them
            (`random_draws.as_one_device`).
        warns_of_replica_draws: Whether a training step that draws, each
            replica its own numbers, is warned of
            (`random_draws.warns_of_replica_draws`).
        measurement: Called with a `MeasuredBatch` the function reads,
            before any step runs on it, or `None` (`loss_mean`); returns
            whether to measure later batches too.
    """

    strategy: tf.distribute.Strategy
    state: EngineState
    optimizers: list[Any]
    metrics: Callable[[], list[Any]]
    builds_on_first_use: Callable[[], bool]
    reads_as_one_device: bool = False
    random_as_one_device: bool = False
    warns_of_replica_draws: bool = False
    step_name: str = "the step"
    weights: Callable[[], list[Any]] = list
    measurement: Callable[[MeasuredBatch], bool] | None = None


@dataclasses.dataclass
class Trace:
    """What one traced function's steps noted, for its logs.

    Attributes:
        stands_for_trace: The steps run eagerly in place of a traced
            function (the first step, when it builds state), so they
            report what a trace would (`_keras.replica_step`).
        written: The ids of the variables the steps assigned: the logs
            re-read only the metrics they updated.
        results: The logged values that are metric results,
            `{key: (metric, entry)}`.
        statistics: For a step measured before it trains (`on_replica`),
            the paths of the model's weights a training step assigned
            from its replica's own examples (`batch_statistics`); else
            `None`, not looked for.
        drew: For a step measured before it trains, whether a training
            step advanced a seed generator (it draws random numbers).
    """

    stands_for_trace: bool = False
    written: set[int] = dataclasses.field(default_factory=set)
    results: dict[str, Any] = dataclasses.field(default_factory=dict)
    statistics: list[str] | None = None
    drew: bool = False

    def add(self, other: Trace) -> None:
        """Adds what `other`, a trace of a step within this one, noted."""
        self.written |= other.written
        self.results.update(other.results)


class ReplicaStep:
    """`step` on every replica (`run`) and its logs (`logs`).

    Args:
        parts: The `StepParts` the step runs with.
        step: `step(data) -> outputs`, run on every replica.
        plan: The `StepPlan`.
        training: Whether this is the train step: it runs the model's
            gradient accumulation and updates the optimizers' EMA.
    """

    def __init__(
        self,
        parts: StepParts,
        step: Callable[[Any], Any],
        plan: StepPlan,
        training: bool,
    ) -> None:
        self.parts = parts
        self.step = step
        self.training = training
        self.strategy = parts.strategy
        # Read as the step is traced: a measurement before the first trace
        # may find a step read as one device's code to be written in
        # shares (`loss_mean.refuse_unless_step_mean`).
        self.reads_as_one_device = parts.reads_as_one_device
        self.compiled = plan.xla == "whole_step"
        # Workers share a preemption notice through the logs' all-reduce.
        self.notice = None
        if topology.of(self.strategy).workers > 1:
            self.notice = preemption.notice_variable()
        # The logs that are not scalars: under replicas, one whose shape
        # follows the batch fails the logs' collective, which names none.
        self.logs_not_scalar: set[str] = set()
        self.draws_as_one_device = (
            parts.random_as_one_device and self.strategy.num_replicas_in_sync > 1
        )
        if self.compiled:
            # One XLA function, traced once: its trace notes into its own
            # `Trace`, which each call adds to its caller's.
            self._compiled_trace = Trace()
            self._compiled_step = tf.function(
                lambda data: self._on_every_replica(data, self._compiled_trace),
                jit_compile=True,
                reduce_retracing=True,
                autograph=False,
            )

    @not_converted
    def run(self, data: Any, trace: Trace) -> Any:
        """The step on every replica; returns each replica's own outputs."""
        if not self.compiled:
            return self._on_every_replica(data, trace)
        outputs = self._compiled_step(data)
        trace.add(self._compiled_trace)
        return outputs

    def _on_every_replica(self, data: Any, trace: Trace) -> Any:
        def run() -> Any:
            return self.strategy.run(lambda d: self._replica(d, trace), args=(data,))

        if not self.training:
            return run()
        ema = _keras.EmaAfterStep(self.parts.optimizers)
        accumulation = self.parts.state.accumulation
        outputs = accumulation.run(run) if accumulation else run()
        ema.update()
        return outputs

    def _replica(self, data: Any, trace: Trace) -> Any:
        data, positions = without_positions(optionals_to_none(data))
        replicas = self.strategy.num_replicas_in_sync
        statistics = self.parts.state.batch_statistics if self.training else None
        assigned: list[Any] | None = [] if self.training and replicas > 1 else None
        with (
            _keras.replica_step(
                trace.written, trace.stands_for_trace, statistics, assigned
            ),
            _random_rows_as_one_device(data, positions, self.draws_as_one_device),
            eager_ops_noted(data),
        ):
            with _replaced.metrics.results_noted(self.parts.metrics()) as noted:
                if self.reads_as_one_device:
                    outputs = own_step.run_as_one_device(
                        self.step, data, self.parts.step_name
                    )
                else:
                    outputs = self.step(data)
            trace.results.update(_replaced.metrics.metric_results_among(outputs, noted))
            if assigned:
                weights = self.parts.weights()
                state = self.parts.state
                if trace.statistics is not None:
                    found = batch_statistics.per_replica(assigned, weights)
                    # A value read from a metric's result (a running loss)
                    # leaves the gradients as they are: they are measured.
                    read = batch_statistics.from_metric_results(found)
                    trace.statistics += [name for name in found if name not in read]
                    trace.drew = any(_keras.is_seed_state(v) for v, _ in assigned)
                batch_statistics.check(assigned, weights, statistics, state, replicas)
                if self.parts.warns_of_replica_draws:
                    random_draws.warn_if_drawn(assigned, state, replicas)
            return outputs

    @not_converted
    def logs(self, outputs: Any, trace: Trace) -> Any:
        """The logs of the step that gave `outputs`, the same on every
        replica: one collective (after the updates' ones, so in the same
        order on every replica)."""
        logs = self.strategy.run(lambda o: self._replica_logs(o, trace), (outputs,))
        return tf.nest.map_structure(
            lambda value: self.strategy.experimental_local_results(value)[0], logs
        )

    def _replica_logs(self, outputs: Any, trace: Trace) -> Any:
        outputs, fraction = own_step.logs_and_fraction(outputs)
        self.logs_not_scalar |= _not_scalar(outputs)
        if (
            self.notice is not None
            and isinstance(outputs, dict)
            and preemption.NOTICE_LOG not in outputs  # rode on the gradients'
        ):
            shared = outputs_module.ReplicaSum(self.notice.read_value())
            outputs = {**outputs, preemption.NOTICE_LOG: shared}
        if _reduced_already(outputs):
            # The step's logs rode on its gradients' collective.
            return outputs_module.reduce_step_logs(outputs)
        updates_done = [tf.identity(o.iterations) for o in self.parts.optimizers]
        with tf.control_dependencies(updates_done):
            updated = _replaced.metrics.updated_metrics(
                self.parts.metrics(), trace.written
            )
            return outputs_module.reduce_step_logs(
                outputs, updated, trace.results, fraction
            )

    def one(self, data: Any) -> Any:
        """One step and its logs."""
        trace = Trace()
        return self.logs(self.run(data, trace), trace)

    @not_converted
    def on_replica(self, data: Any, eagerly: bool) -> tuple[Any, Trace]:
        """This replica's step on its `data` (called by `strategy.run`, run
        `eagerly` or traced), without the EMA, accumulation and logs of
        `run` and `logs`: `(outputs, trace)`, the trace with the step's
        `statistics` and whether it `drew`."""
        trace = Trace(stands_for_trace=eagerly, statistics=[])
        return self._replica(data, trace), trace


class MeasuredBatch(NamedTuple):
    """A batch a train or test function reads, before any step runs on it
    (`StepParts.measurement`).

    Attributes:
        element: The batch, as the strategy distributed it.
        spec: The iterator's element spec (the batches the step is traced
            for).
        step: The function's `ReplicaStep`.
        eagerly: Whether the call's first step runs eagerly (it builds
            state, or the model runs eagerly).
        number: The number of the step that runs on it, counted over the
            function's calls from 1.
        traced: The functions measurements traced, kept by the function
            for the next measurement (`measuring.on_replicas`).
        part: The part of the batch measured (`measuring.sliced`).
        gathered: The part's examples as one device has them, where
            they are gathered already (`measuring.GlobalBatch`).
    """

    element: Any
    spec: Any
    step: ReplicaStep
    eagerly: bool
    number: int
    traced: dict[Any, Any]
    part: int = 0
    gathered: Any = None


def _reduced_already(outputs: Any) -> bool:
    """Whether every log in `outputs` (a dict) is the same on every replica
    already (`outputs.Synchronized`)."""
    return isinstance(outputs, dict) and all(
        isinstance(value, outputs_module.Synchronized) for value in outputs.values()
    )


def _not_scalar(outputs: Any) -> set[str]:
    """The names of the logs in `outputs` (a dict) that are tensors of at
    least one dimension."""
    if not isinstance(outputs, dict):
        return set()
    return {
        str(name)
        for name, value in outputs.items()
        if isinstance(value, tf.Tensor) and value.shape.rank != 0
    }


@contextlib.contextmanager
def _random_rows_as_one_device(
    data: Any, positions: tf.Tensor | None, as_one_device: bool
) -> Iterator[None]:
    """Within it, this replica's random draws of its rows are one device's
    (`_replaced.random_rows.draw_rows_as_one_device`), when `as_one_device`. Where its
    examples sit in the global batch is known as the step is traced where
    every replica's batch size is (`_even_offset`), else read from the
    `positions` its data carries (`positions.with_positions`), else
    asked of the other replicas at the first draw that needs it (an
    all-gather of their batch sizes, which a step that draws nothing never
    makes)."""
    if not as_one_device:
        yield
        return
    first = [t for t in tree.flatten(data) if t is not None][0]
    static = static_rows(first)
    # A batch whose size the trace knows is never empty; an empty
    # replica's layers see one row, its placeholder.
    count = tf.constant(static) if static else tf.shape(first)[0]
    rows = count if static else tf.maximum(count, 1)
    offset: Any = _even_offset(static, positions is not None)
    if offset is None and positions is None:
        offset = lambda: examples_before(count)  # noqa: E731
    elif offset is None:
        # The first example's position; 0 for an empty replica, whose
        # placeholder row's numbers weigh nothing. Computed at the first
        # draw: a step that draws nothing computes nothing.
        offset = functools.partial(_first_position, positions, bool(static))
    with _replaced.random_rows.draw_rows_as_one_device(rows, offset, static):
        yield


def _first_position(positions: tf.Tensor, never_empty: bool) -> tf.Tensor:
    """The position of this replica's first example (0 without any)."""
    return positions[0] if never_empty else tf.reduce_sum(positions[:1])


def _even_offset(rows: int | None, numbered: bool) -> int | None:
    """Where this replica's examples start in the global batch, where the
    trace knows it (else `None`): where every replica holds `rows` examples
    (the element spec all replicas share), the replicas before this one
    hold `rows` each; in batches `fit()` numbered (`numbered`), the first
    replica's start at 0 whatever the split (without numbers, the others
    ask every replica, which must join that collective). Not in an eager
    step, whose shapes are each replica's own (3 and 2 examples). Numbered
    batches are split in replica order on one machine only: workers may
    shard their examples apart."""
    if tf.executing_eagerly():
        return None
    context = tf.distribute.get_replica_context()
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    if replica is None or (numbered and topology.of().workers > 1):
        return None
    if rows:
        return int(replica) * rows
    return 0 if replica == 0 and numbered else None


def optionals_to_none(data: Any) -> Any:
    """`data`, an empty optional (a replica without a batch) as `None`."""
    return tree.map_structure(
        lambda value: None if isinstance(value, tf.experimental.Optional) else value,
        data,
    )
