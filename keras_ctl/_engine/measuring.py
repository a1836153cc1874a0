"""How a batch is measured: what the replicas' step makes of it and what
one device makes of the same examples, within a step's memory, each
function traced once.

A measurement (`loss_mean`) reads a `MeasuredBatch`, the batch a train or
test function is about to run as the strategy distributed it, in parts:
in part `p` each replica gives its rows `p * k` to `(p + 1) * k`, `k` the
largest replica's part divided by the replica count (at least one row),
so the examples of a part, gathered, are no more than the largest
replica's part (`sliced`) and one device's run on them needs no more
memory than a step; the parts together cover the batch
(`loss_mean._in_parts` measures each). Every function a measurement runs
is traced once per name and batch spec (the part a tensor argument) and
kept in the batch's `traced` (its step function's), so a later
measurement runs what the first traced.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any
from typing import NamedTuple
from typing import TypeVar

import keras
import numpy as np
import tensorflow as tf
from keras import tree

from keras_ctl import _keras
from keras_ctl import _replaced
from keras_ctl._engine import forward
from keras_ctl._engine import gather
from keras_ctl._engine import state as engine_state
from keras_ctl._engine.padding import pad_empty_batch
from keras_ctl._engine.positions import PositionedBatch
from keras_ctl._engine.positions import without_positions
from keras_ctl._engine.replica_step import MeasuredBatch
from keras_ctl._engine.replica_step import optionals_to_none
from keras_ctl._replicas import static_rows

_T = TypeVar("_T")


class Measured(NamedTuple):
    """What `on_replicas` gives: replica 0's `result`, the `notes` tracing
    wrote down, the examples of the batch the slices were cut from, and
    the number of parts that cover it."""

    result: Any
    notes: Any
    of_rows: int
    parts: int


def on_replicas(
    batch: MeasuredBatch,
    name: str,
    make: Callable[[], tuple[Callable[[Any, bool], Any], Any]],
    eagerly: bool | None = None,
) -> Measured:
    """`on_replica(data, eagerly)` on every replica's slice of `batch`
    (`sliced`), where `make()` gives `(on_replica, notes)`, the notes what
    tracing `on_replica` writes down. Traced once for the batch's spec and
    `name` (or run `eagerly`, by default as the batch's step runs, or
    where tracing asks for it: `_replaced.seed_generators.NeedsEagerStep`)."""
    strategy = batch.step.strategy
    eagerly = batch.eagerly if eagerly is None else eagerly
    part = tf.constant(batch.part, tf.int32)

    def on_every_replica(
        on_replica: Callable[[Any, bool], Any],
        element: Any,
        part: tf.Tensor,
        eagerly: bool,
    ) -> Any:
        def run(data: Any) -> Any:
            data, of_rows, parts = sliced(data, part)
            return on_replica(data, eagerly), of_rows, parts

        return tree.map_structure(
            lambda value: strategy.experimental_local_results(value)[0],
            strategy.run(run, (element,)),
        )

    if not eagerly:
        key = (name, repr(batch.spec))
        if key not in batch.traced:
            on_replica, notes = make()
            # A `partial`, traced once a model (`step_function._after_first_batch`).
            traced = tf.function(
                functools.partial(on_every_replica, on_replica, eagerly=False),
                input_signature=[batch.spec, tf.TensorSpec((), tf.int32)],
                autograph=False,
            )
            batch.traced[key] = traced, notes
        traced, notes = batch.traced[key]
        try:
            result, of_rows, parts = traced_call(traced, batch.element, part)
            return Measured(result, notes, int(of_rows), int(parts))
        except Exception as error:
            if not _replaced.seed_generators.needs_eager_step(error):
                raise
            del batch.traced[key]
    on_replica, notes = make()
    ran_eagerly()
    result, of_rows, parts = on_every_replica(on_replica, batch.element, part, True)
    return Measured(result, notes, int(of_rows), int(parts))


def sliced(data: Any, part: tf.Tensor) -> tuple[Any, tf.Tensor, tf.Tensor]:
    """`(slice, rows, parts)`: this replica's examples `part * k` to
    `(part + 1) * k` of its `data`, `k` the largest replica's examples
    divided by the replica count, at least 1; the examples of every
    replica (one all-gather of their counts); and the parts that cover
    them. Positions, where `data` carries them, are the slice's in the
    slices gathered (where one device draws for them). All of `data`, one
    part, where a part of it is not a dense or ragged tensor."""
    batch, positions = without_positions(optionals_to_none(data))
    leaves = [leaf for leaf in tree.flatten(batch) if leaf is not None]
    context = tf.distribute.get_replica_context()
    rows = tf.shape(leaves[0], out_type=tf.int32)[0] if leaves else tf.constant(0)
    counts = context.all_gather(tf.reshape(rows, [1]), axis=0)
    if not leaves or not all(_sliceable(leaf) for leaf in leaves):
        return optionals_to_none(data), tf.reduce_sum(counts), tf.constant(1)
    largest = tf.reduce_max(counts)
    replicas = context.num_replicas_in_sync
    k = tf.maximum(largest // replicas, 1)
    # Where every replica's batch has a static size (the spec the replicas
    # share, traced) that the replicas divide, so do the slices: code
    # traced for static shapes (a refusal raised as the step is traced)
    # sees them.
    static = None if tf.executing_eagerly() else static_rows(leaves[0])
    if static and static % replicas == 0 and isinstance(leaves[0], tf.Tensor):
        k = static // replicas
    start = part * k

    def cut(t: Any) -> Any:
        if t is None or t.shape.rank == 0:
            return t
        rows = t[start : start + k]
        if isinstance(k, int):
            rows = tf.ensure_shape(rows, [k, *t.shape[1:]])
        return rows

    batch = tree.map_structure(cut, batch)
    if positions is not None:
        kept = tf.clip_by_value(counts - start, 0, k)
        before = tf.reduce_sum(kept[: context.replica_id_in_sync_group])
        batch = PositionedBatch(
            batch, before + tf.range(kept[context.replica_id_in_sync_group])
        )
    return batch, tf.reduce_sum(counts), (largest + k - 1) // k


def _sliceable(leaf: Any) -> bool:
    return isinstance(leaf, (tf.Tensor, tf.RaggedTensor)) and leaf.shape.rank != 0


class AppliedOnReplicas(NamedTuple):
    """The gradients a step applies on the slices measured, its replicas'
    summed as the step sums them, and whether it drew random numbers."""

    gradients: list[tf.Tensor]
    drew: bool
    as_one_device: bool


class GlobalBatch(NamedTuple):
    """The examples measured, as one device has them: `data`, the
    structure the step reads, every replica's slice gathered; `rows`, its
    examples; `of_rows`, the examples of the batch it was cut from;
    `parts`, the parts that cover that batch."""

    data: Any
    rows: int
    of_rows: int
    parts: int


def global_batch(batch: MeasuredBatch, eagerly: bool) -> GlobalBatch:
    """The examples measured of `batch`, as one device has them (those
    gathered already, where `batch.gathered` holds them)."""
    if batch.gathered is not None:
        return batch.gathered  # type: ignore[no-any-return]

    def make() -> tuple[Callable[[Any, bool], Any], None]:
        def on_replica(data: Any, eagerly: bool) -> Any:
            with _keras.replica_step(stands_for_trace=eagerly):
                data, _ = pad_empty_batch(without_positions(data)[0])
                return gather.global_batch(data)

        return on_replica, None

    measured = on_replicas(batch, "global_batch", make, eagerly)
    data = measured.result
    return GlobalBatch(data, examples_in(data), measured.of_rows, measured.parts)


def examples_in(batch: Any) -> int:
    """The number of examples of `batch` (any structure a step reads): the
    rows of its first tensor."""
    return int([t for t in tree.flatten(batch) if t is not None][0].shape[0])


def reordered(batch: Any) -> Any:
    """`batch` with its examples in reverse order: one device's run on it
    differs from the run in order by round-off only, for a step that draws
    nothing."""
    return tree.map_structure(
        lambda t: t if t is None or t.shape.rank == 0 else tf.reverse(t, [0]), batch
    )


def applied_on_replicas(batch: MeasuredBatch) -> AppliedOnReplicas | None:
    """The gradients the model's step applies on the slices of `batch` in
    its reading (`ReplicaStep.reads_as_one_device`), its replicas' summed
    as the step sums them (replica 0's view, one tensor a variable and
    `apply`), and whether it applied them read as one device's code (a
    step read so may declare itself in shares as it runs); or `None` when
    there is nothing to compare: it applies nothing, applies in both
    readings, applies through keras_ctl's own steps (exact as written),
    assigns batch statistics from each
    replica's own examples (each replica's normalization is not one
    device's; `batch_statistics` warns of them), or draws each replica's
    own random numbers (`random_draws="per_replica"`, or XLA's default)."""

    def make() -> tuple[Callable[[Any, bool], Any], dict[str, list[Any]]]:
        # Made while `applies_captured` notes the applies in `noted`.
        lock = threading.Lock()
        notes: dict[str, list[Any]] = {"readings": [], "traces": []}

        def on_replica(data: Any, eagerly: bool) -> list[tf.Tensor]:
            _, trace = batch.step.on_replica(data, eagerly)
            applied = noted.pop(threading.get_ident(), [])
            with lock:
                notes["readings"] += [a.reading for a in applied]
                notes["traces"].append(trace)
            return flat_gradients(applied)

        return on_replica, notes

    as_one_device = batch.step.reads_as_one_device
    with _replaced.optimizers.applies_captured() as noted:
        measured = on_replicas(batch, f"applied_{as_one_device}", make)
    readings, traces = measured.notes.values()
    # A step read as one device's code is measured in the reading its
    # applies show, one for all; one in shares from its first line, as
    # such. keras_ctl's own steps called from one device's code are not.
    expected = ["one_device", "declared"] if as_one_device else ["unread", "declared"]
    if not readings or len(set(readings)) != 1 or readings[0] not in expected:
        return None
    if any(trace.statistics for trace in traces):
        return None
    drew = any(trace.drew for trace in traces)
    if drew and not batch.step.draws_as_one_device:
        return None
    return AppliedOnReplicas(measured.result, drew, readings[0] == "one_device")


def applying_on_one_device(
    model: keras.Model, batch: MeasuredBatch, data: Any
) -> list[tf.Tensor]:
    """The gradients the model's `train_step` applies on `data` on one
    device, traced once for any number of examples (as the step is): a
    second run draws the next numbers of TensorFlow's own random ops, as a
    second step would."""

    capture: dict[str, dict[int, list[_replaced.optimizers.Applied]]] = {}

    def applied(data: Any) -> list[tf.Tensor]:
        # A `train_step` decorated with `tf.function` applies in this
        # trace, whose outputs the gradients can be.
        with _replaced.functions.users_functions_inlined():
            model.train_step(data)
        return flat_gradients(capture["noted"].pop(threading.get_ident(), []))

    def run() -> list[tf.Tensor]:
        with _replaced.optimizers.applies_captured() as noted:
            capture["noted"] = noted
            if model.run_eagerly:
                ran_eagerly()
                return applied(data)
            key = ("applying_on_one_device", repr(any_rows(data)))
            if key not in batch.traced:
                # A `partial`, traced once a model (`on_replicas`); as the
                # step is traced, without AutoGraph.
                batch.traced[key] = tf.function(
                    functools.partial(applied),
                    input_signature=[any_rows(data)],
                    autograph=False,
                )
            return traced_call(batch.traced[key], data)  # type: ignore[no-any-return]

    return one_device(run)


def summed_across_replicas(
    model: keras.Model, batch: MeasuredBatch
) -> tuple[list[tf.Tensor], GlobalBatch]:
    """`(gradients, batch)`: the gradients of the model's trainable weights
    that the default step sums across replicas on the slices of `batch`,
    and the examples measured, `(x, y, sample_weight)`."""
    weights = model.trainable_weights

    def make() -> tuple[Callable[[Any, bool], Any], None]:
        def on_replica(data: Any, eagerly: bool) -> tuple[list[tf.Tensor], Any]:
            # Keras's losses exact, as in the step.
            with _keras.replica_step(stands_for_trace=eagerly):
                data, batch_size = pad_empty_batch(without_positions(data)[0])
                x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
                with tf.GradientTape() as tape:
                    step = forward.forward_and_loss(
                        model, x, y, sample_weight, batch_size, training=False
                    )
                gradients = dense(tape.gradient(step.loss, weights), weights)
                context = tf.distribute.get_replica_context()
                summed = context.all_reduce(tf.distribute.ReduceOp.SUM, gradients)
                return summed, gather.global_batch((x, y, sample_weight))

        return on_replica, None

    # Traced apart for each reading of a `compute_loss` of one's own: one
    # device's (before the first measurement decides, too) or in shares.
    reading = engine_state.of(model).loss_readings.get(engine_state.COMPUTE_LOSS)
    name = f"summed_across_replicas_{reading == 'share'}"
    measured = on_replicas(batch, name, make, model.run_eagerly)
    gradients, data = measured.result
    whole = GlobalBatch(data, examples_in(data), measured.of_rows, measured.parts)
    return gradients, whole


def gradients_on_one_device(
    model: keras.Model, batch: MeasuredBatch, data: Any
) -> list[tf.Tensor]:
    """One device's gradients of the model's `compute_loss` on `data`,
    `(x, y, sample_weight)`, traced once for any number of examples (as
    the step is)."""
    weights = model.trainable_weights
    given = [i for i, part in enumerate(data) if part is not None]

    def gradients(*parts: Any) -> list[tf.Tensor]:
        x, y, sample_weight = (
            parts[given.index(i)] if i in given else None for i in range(3)
        )
        with tf.GradientTape() as tape:
            y_pred = model(x, training=False)
            loss = _keras.user_compute_loss(model, x, y, y_pred, sample_weight, False)
            # A loss of several values is read as their mean, as in the step.
            loss = tf.reduce_mean(tf.cast(loss, weights[0].dtype))
        return dense(tape.gradient(loss, weights), weights)

    parts = [data[i] for i in given]

    def run() -> list[tf.Tensor]:
        if model.run_eagerly:
            ran_eagerly()
            return gradients(*parts)
        key = ("gradients_on_one_device", repr(any_rows(parts)))
        if key not in batch.traced:
            batch.traced[key] = tf.function(
                functools.partial(gradients),
                input_signature=any_rows(parts),
                autograph=False,
            )
        return traced_call(batch.traced[key], *parts)  # type: ignore[no-any-return]

    return one_device(run)


def any_rows(structure: Any) -> Any:
    """The specs of `structure`'s tensors for any number of rows."""
    return tree.map_structure(
        lambda t: t if t is None else tf.TensorSpec([None, *t.shape[1:]], t.dtype),
        structure,
    )


def flat_gradients(applied: list[_replaced.optimizers.Applied]) -> list[tf.Tensor]:
    """The gradients of every `apply`, in order; a variable without one
    (`None`) as a scalar 0."""
    return [
        tf.zeros(()) if g is None else g for each in applied for g in each.gradients
    ]


def dense(gradients: list[Any], weights: list[Any]) -> list[tf.Tensor]:
    return [
        tf.zeros_like(w) if g is None else tf.convert_to_tensor(g)
        for w, g in zip(weights, gradients)
    ]


@contextlib.contextmanager
def restored(model: keras.Model, optimizers: list[Any]) -> Iterator[Callable[[], None]]:
    """Yields `restore()`, which sets the variables of `model` (its
    metrics' included) and of `optimizers`, and every variable a function
    the measurement traces reads (`traced_call`: a `tf.Variable` a step
    keeps of its own) or an earlier measurement created, back to their
    values on entry, and those created since to their first values;
    called on exit too.

    A traced function changes no variable its trace does not read, so
    after traced runs only (`traced_call`) `restore()` looks at the
    variables they read; after a run in Python (`ran_eagerly`), at
    every variable. Of those, it sets the ones that changed (most of a
    measurement's runs change a few: their metrics'): reading a
    distributed variable costs a fraction of assigning each of its
    copies."""
    variables = model.variables + model.metrics_variables
    variables += [v for optimizer in optimizers for v in optimizer.variables]
    variables += list(_made_in_measurements.values())
    state: dict[int, tuple[Any, Any]] = {}
    created: list[tuple[Any, tf.Tensor]] = []
    # The variables that may have changed since the last `restore()`:
    # `None` for all of them.
    touched: set[int] | None = set()

    def keep(variables: list[Any] | None, read: bool = True) -> None:
        nonlocal touched
        if variables is None:  # a run in Python
            touched = None
            return
        for variable in variables:
            if id(variable) not in state:
                state[id(variable)] = variable, variable.numpy()
            if read and touched is not None:
                touched.add(id(variable))

    def noting(next_creator: Callable[..., Any], **kwargs: Any) -> Any:
        variable = next_creator(**kwargs)
        with tf.init_scope():
            created.append((variable, tf.identity(variable)))
        state[id(variable)] = variable, None
        _made_in_measurements[id(variable)] = variable
        return variable

    def restore() -> None:
        nonlocal touched
        looked_at = (
            list(state.values())
            if touched is None
            else [state[i] for i in touched if i in state]
        )
        for variable, value in [*looked_at, *created]:
            if value is not None and not _holds(variable, value):
                variable.assign(value)
        touched = set()

    keep(variables, read=False)
    _keeping.append(keep)
    try:
        with tf.variable_creator_scope(noting):
            yield restore
    finally:
        _keeping.remove(keep)
        restore()


def ran_eagerly() -> None:
    """Notes, for the `restored` blocks entered, a run in Python (not
    `traced_call`), which may change any variable."""
    for keep in _keeping:
        keep(None)


def _holds(variable: Any, value: Any) -> bool:
    """Whether `variable` reads as `value`, bit for bit (a NaN too)."""
    now = np.asarray(variable.numpy())
    value = np.asarray(value)
    return bool(
        now.dtype == value.dtype
        and now.shape == value.shape
        and now.tobytes() == value.tobytes()
    )


# The `keep(variables)` of the `restored` blocks entered.
_keeping: list[Callable[[list[Any] | None], None]] = []
# Variables a step made while measured (its first call's), which a later
# measurement, or part of one, sets back too.
_made_in_measurements: weakref.WeakValueDictionary[int, Any] = (
    weakref.WeakValueDictionary()
)


def traced_call(function: Any, *args: Any) -> Any:
    """`function(*args)`, a `tf.function`, the variables its trace reads
    kept first by the `restored` blocks entered. Not the seed states of
    draws outside the model (an unseeded `keras.random` draw's): a step
    drawing them draws other numbers on a second run, as it would on a
    second step, which tells the measurement it draws its own. A trace
    that draws is noted as a run in Python (`ran_eagerly`): the model's
    seed states, kept as its variables, are set back by their Keras
    variables, not the `tf.Variable`s the trace reads."""
    concrete = function.get_concrete_function(*args)
    read = [v for v in concrete.graph.variables if not _keras.is_seed_state(v)]
    for keep in _keeping:
        keep(read)
    if len(read) < len(concrete.graph.variables):
        ran_eagerly()
    return function(*args)


def one_device(function: Callable[..., _T], *args: Any) -> _T:
    """`function(*args)` in a thread of its own, where no strategy's scope
    is entered: Keras computes as on one device there (a strategy's scope
    divides its losses by the replica count). Raises what it raises."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = function(*args)
        except BaseException as error:  # raised again by the caller
            result["error"] = error

    thread = threading.Thread(target=run, name="keras_ctl-one-device")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    value: _T = result["value"]
    return value
