"""Whether the user's loss is a mean over examples, measured on the first
batch before any step trains on it (`check_for`).

Under R replicas each replica's loss on its part of the batch is weighed
by that part's share of the global batch: the default steps weigh a
`compute_loss` of one's own, and a `train_step` of one's own read as one
device's code has its gradients weighed. That is one device's loss when
the loss is a mean over examples (Keras's `Loss` objects and
`super().compute_loss` are made exact in the step, whatever their
reduction), not for a sum over examples (a loss of one value an example,
which `tape.gradient` sums) or a loss that couples the batch's examples
(in-batch negatives, a masked mean over a count of entries written by
hand), and nothing in how it is spelled says which. So what runs is
compared: the gradients the replicas' weighted losses sum to (for a step,
what it would apply: `_keras.applies_captured`), against one device's on
the whole batch (`refuse_unless_mean`, `refuse_unless_step_mean`). The
loss on the whole batch and on its halves (`measure`, also the parity
kit's) says which kind a refused `compute_loss` is.

`compile(compute_loss_over=...)` decides: `None` (the default) measures
the first batch of the first `fit()` or `evaluate()` under several
replicas (a step of one's own: of `fit()`) and refuses a loss that is not
a mean, naming the numbers and the choices; `"replica_batch"` runs it on
each replica's part as written; `"global_batch"` computes a `compute_loss`
over the global batch, as one device does.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
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
from keras_ctl._engine import forward
from keras_ctl._engine import gather
from keras_ctl._engine import loss as loss_module
from keras_ctl._engine import state as engine_state
from keras_ctl._engine.padding import pad_empty_batch
from keras_ctl._engine.replica_step import FirstBatch
from keras_ctl._engine.replica_step import Trace
from keras_ctl._engine.replica_step import optionals_to_none
from keras_ctl._keras.iterators import without_positions
from keras_ctl._own_code import is_keras_ctls
from keras_ctl._own_code import is_users_function
from keras_ctl._own_code import is_users_own
from keras_ctl._own_code import marked_in_shares
from keras_ctl._own_code import replica_arithmetic_noted

_T = TypeVar("_T")

# A loss of float32 round-off (the halves' mean recombined) passes.
_RTOL, _ATOL = 1e-5, 1e-7


class Measurement(NamedTuple):
    """A `compute_loss` on a batch of `rows` examples and on its halves
    (the first `rows // 2` examples, then the rest)."""

    rows: int
    whole: float
    first: float
    second: float

    @property
    def mean_of_halves(self) -> float:
        half = self.rows // 2
        return (half * self.first + (self.rows - half) * self.second) / self.rows

    @property
    def is_mean(self) -> bool:
        return bool(np.isclose(self.whole, self.mean_of_halves, _RTOL, _ATOL))

    @property
    def is_sum(self) -> bool:
        return bool(np.isclose(self.whole, self.first + self.second, _RTOL, _ATOL))

    @property
    def kind(self) -> str:
        """What a loss that is not a mean is: a sum, or a coupling."""
        if self.is_sum:
            return "a sum over examples"
        return "a loss that couples the batch's examples"

    def __str__(self) -> str:
        return (
            f"measured on a batch of {self.rows}, it is {self.whole:.6g} on "
            f"the whole batch and {self.first:.6g} and {self.second:.6g} on "
            f"its halves, whose size-weighted mean is "
            f"{self.mean_of_halves:.6g}: {self.kind}"
        )


def measure(model: keras.Model, batch: Any) -> Measurement | None:
    """`model.compute_loss` on `batch` (`(x, y)` or `(x, y,
    sample_weight)`) and on its halves, each on the model's predictions
    for its examples (`training=False`: no draw, no batch statistic).
    `None` for a batch of fewer than two examples, and for a loss that
    calls replica arithmetic (`keras_ctl.all_gather` of its rows, a
    replica count): it handles the replicas itself, and outside a replica
    step, where it is measured, each half would be a batch of its own.
    The model's variables and metrics are as they were afterwards."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(tuple(batch))
    rows = examples_in(batch)
    if rows < 2:
        return None
    variables = model.variables + model.metrics_variables
    state = [v.numpy() for v in variables]

    def loss_of(start: int, stop: int) -> float:
        part_x, part_y, part_weight = tree.map_structure(
            lambda a: None if a is None else tf.convert_to_tensor(a)[start:stop],
            (x, y, sample_weight),
        )
        y_pred = model(part_x, training=False)
        with replica_arithmetic_noted() as noted:
            try:
                loss = _keras.user_compute_loss(
                    model, part_x, part_y, y_pred, part_weight, False
                )
            except Exception:
                if not noted:
                    raise
                # Code written for a replica step (`row_offset`'s int32
                # beside an eager shape's int64): its step runs it there.
        if noted:
            raise _HandlesReplicas
        return float(np.mean(loss))

    try:
        half = rows // 2
        return Measurement(
            rows, loss_of(0, rows), loss_of(0, half), loss_of(half, rows)
        )
    except _HandlesReplicas:
        return None
    finally:
        for variable, value in zip(variables, state):
            variable.assign(value)


class _HandlesReplicas(Exception):
    """The loss measured calls replica arithmetic."""


def examples_in(batch: Any) -> int:
    """The number of examples of `batch`: the rows of its first input."""
    x, _, _ = keras.utils.unpack_x_y_sample_weight(tuple(batch))
    return int(tree.flatten(x)[0].shape[0])


def check_for(
    model: keras.Model, training: bool
) -> Callable[[FirstBatch], None] | None:
    """The first-batch check of `model`'s train (`training`) or test
    function (`StepParts.first_batch_check`), or `None`."""
    strategy = model.distribute_strategy
    if (
        engine_state.of(model).compute_loss_over is not None
        or strategy.num_replicas_in_sync == 1
        or isinstance(strategy, tf.distribute.ParameterServerStrategy)
    ):
        return None
    step = "train_step" if training else "test_step"
    if not is_users_own(model, step):
        if is_users_own(model, "compute_loss"):
            return functools.partial(refuse_unless_mean, model)
        if is_keras_ctls(model, "compute_loss") and _users_losses_compiled(model):
            return functools.partial(read_compiled_losses, model)
        return None
    if training and not marked_in_shares(model, step):
        return functools.partial(refuse_unless_step_mean, model)
    return None


def _users_losses_compiled(model: keras.Model) -> bool:
    """Whether `compile(loss=...)` holds a loss of the user's own (a `Loss`
    subclass's `call`, or a function), which the first batch reads."""
    compile_loss = _keras.compile_loss(model)
    given = [] if compile_loss is None else tree.flatten(_keras.user_loss(compile_loss))
    return any(_is_users_loss(loss) for loss in given)


def _is_users_loss(loss: Any) -> bool:
    """Whether a loss computes with code of the user's own: a `Loss`
    subclass's own `call` or `__call__`, the function a Keras loss wraps
    (`LossFunctionWrapper.fn`), or a plain function."""
    if isinstance(loss, keras.losses.Loss):
        wrapped = getattr(loss, "fn", None)
        code = [type(loss).call, type(loss).__call__, *([wrapped] if wrapped else [])]
        return any(is_users_function(f) for f in code)
    return callable(loss) and is_users_function(loss)


def read_compiled_losses(model: keras.Model, first: FirstBatch) -> None:
    """Reads each compiled loss of the user's own as one device computes
    it, measured on the `first` batch before any step runs on it: the loss
    on the whole batch against its halves (`Measurement`), on one device,
    with the predictions of `training=False`. A mean over examples (one
    value for the batch, or Keras's reduction of one value an example)
    keeps the mean reading; a sum (the tutorial's `sum(per_example) /
    GLOBAL_BATCH` inside a `Loss`, a `reduction="sum"` of one value) is
    read as each replica's share, summed as it is; anything else is
    refused, naming the numbers. The readings go to the engine state
    (`loss_readings`), which the traced step reads."""
    whole = _global_batch(first, model.run_eagerly)
    readings = engine_state.of(model).loss_readings
    for loss, name, measured in _one_device(_compiled_loss_measurements, model, whole):
        if measured.is_mean:
            readings[id(loss)] = "mean"
        elif measured.is_sum:
            readings[id(loss)] = "share"
        else:
            raise ValueError(
                f"The loss of output `{name}` ({type(loss).__name__}) is "
                f"neither a mean nor a sum over examples: {measured}. Each "
                "replica computes it on its part of the batch, which cannot "
                "add up to one device's loss. Return one value per example "
                "from its `call()` (Keras then reduces them over the global "
                "batch), or compute it in a `compute_loss` of the model's "
                'own with `compile(compute_loss_over="global_batch")`, '
                "which sees the global batch."
            )


def _compiled_loss_measurements(
    model: keras.Model, batch: Any
) -> list[tuple[Any, str, Measurement]]:
    """`[(loss, output name, Measurement)]` of each compiled loss of the
    user's own on `batch` (none for a batch of fewer than 2 examples, or
    a compiled loss Keras has not built)."""
    x, y, _ = keras.utils.unpack_x_y_sample_weight(tuple(batch))
    rows = examples_in(batch)
    compile_loss = _keras.compile_loss(model)
    if rows < 2 or not compile_loss.built:
        return []
    y_pred = model(x, training=False)
    half = rows // 2
    found = []
    outputs = loss_module.output_losses(compile_loss, y, y_pred, None)
    # Without sample weights: Keras weighs one value an example exactly in
    # the step, and refuses one value for the batch with weights.
    for loss, y_true, pred, _, _, name in outputs:
        if _is_users_loss(loss):
            whole, first, second = (
                _value_on_rows(loss, [y_true, pred], start, stop)
                for start, stop in ((0, rows), (0, half), (half, rows))
            )
            found.append((loss, name, Measurement(rows, whole, first, second)))
    return found


def _value_on_rows(loss: Any, arguments: list[Any], start: int, stop: int) -> float:
    """`loss(y_true, y_pred)` of rows `start:stop`."""
    return float(np.mean(loss(*tree.map_structure(lambda t: t[start:stop], arguments))))


def refuse_unless_mean(model: keras.Model, first: FirstBatch) -> None:
    """Raises a `ValueError` naming the numbers and the choices when the
    gradient of the model's `compute_loss` that the default step sums
    across replicas on the `first` batch, each replica's loss on its part
    weighed by the part's share, differs from one device's gradient on the
    whole batch by more than round-off. Predictions with `training=False`;
    the model's variables and metrics are as they were afterwards."""
    with _restored(model, []):
        summed, whole = _summed_across_replicas(model, first)
        one_device = _one_device(_gradients_on_one_device, model, whole)
    off = _relative_difference(summed, one_device)
    if off <= _gradient_rtol(model):
        return
    measured = _one_device(measure, model, whole)
    values = "" if measured is None else f"; {measured}"
    raise ValueError(
        f"{type(model).__name__}.compute_loss is not a mean over examples: "
        f"{_on_the_first_batch(model, whole)}, the "
        "gradient of each replica's loss on its part, weighed by the part's "
        f"share of the batch and summed, is {off:.3g} off (relative) one "
        f"device's gradient on the whole batch{values}. Pass "
        '`compute_loss_over="global_batch"` to `compile()`: every replica '
        "then computes it on the global batch, and the model trains as on "
        'one device. Or pass `compute_loss_over="replica_batch"` to compute '
        "it on each replica's part as written (a sum then covers the part's "
        "examples only)."
    )


def refuse_unless_step_mean(model: keras.Model, first: FirstBatch) -> None:
    """Raises a `ValueError` naming the numbers and the choices when the
    gradients a `train_step` of the user's own, read as one device's code,
    applies on the `first` batch (each replica's weighed by its part and
    summed, as the step sums them) differ from the gradients the step
    applies on one device on the whole batch by more than round-off.

    Nothing is applied (`_keras.applies_captured`), and the model's and
    its optimizers' variables are as they were afterwards. Not refused: a
    step that declares itself in shares as it runs, one that applies
    nothing, and one whose gradients on one device differ between two runs
    on the same batch and state (it draws numbers that are not one
    device's: TensorFlow's own random ops, Python's `random`), which is
    warned of instead."""
    optimizers = first.step.parts.optimizers
    with _restored(model, optimizers) as restore:
        whole = _global_batch(first, model.run_eagerly)
        on_replicas = _applied_on_replicas(first)
        if on_replicas is None:
            return
        run_on_one_device = _applying_on_one_device(model, whole)
        runs = []
        for _ in range(2):
            restore()
            runs.append(_one_device(run_on_one_device))
    one_device, again = runs
    if not _comparable(on_replicas, one_device):
        return
    step = f"{type(model).__name__}.train_step"
    if _relative_difference(again, one_device) > _gradient_rtol(model):
        warnings.warn(
            f"{step} applies other gradients on each run of one device on "
            "the same batch and weights: it draws random numbers that are "
            "not one device's under several replicas (TensorFlow's own "
            "random ops such as `tf.random.normal` or `tf.random.shuffle`, "
            "Python's or NumPy's `random`), so each replica draws its own "
            "and a seeded run ends elsewhere than on one device, and "
            "keras_ctl cannot measure whether its loss is a mean over "
            "examples. Draw with `keras.random` and a "
            "`keras.random.SeedGenerator` for one device's numbers.",
            stacklevel=2,
        )
        return
    off = _relative_difference(on_replicas, one_device)
    if off <= _gradient_rtol(model):
        return
    scale = _norm(on_replicas) / max(_norm(one_device), np.finfo("float64").tiny)
    raise ValueError(
        f"{step} is read as one device's code, but the gradients it applies "
        f"{_on_the_first_batch(model, whole)}, each replica's on its part "
        "weighed by the part's share of the batch and summed, are "
        f"{off:.3g} off (relative) one device's gradients on the whole "
        f"batch ({scale:.3g} times their size): its loss is not a mean over "
        "examples. A loss of one value an example, whose gradient "
        "`tape.gradient` sums, is a sum over examples: take its mean "
        "(`ops.mean(loss)`) to write one device's code, or decorate the "
        "step with `@keras_ctl.written_in_shares` (each replica's sum is "
        "then its share of the batch's). A loss that couples the batch's "
        "examples (in-batch negatives, a statistic of the batch) needs "
        "their rows gathered with `keras_ctl.all_gather`. Or pass "
        '`compute_loss_over="replica_batch"` to `compile()` to run the '
        "step on each replica's part as written, unmeasured."
    )


def _gradient_rtol(model: keras.Model) -> float:
    """The difference that is round-off: float32 gradients summed in another
    order differ by about 1e-6, bfloat16's by about 3e-3 (8 bits of
    mantissa). Eight times the compute dtype's epsilon, at least 1e-4."""
    compute = keras.backend.standardize_dtype(model.dtype_policy.compute_dtype)
    return max(1e-4, 8 * _EPSILON.get(compute, 0.0))


_EPSILON = {"bfloat16": 2.0**-7, "float16": 2.0**-10}


def _on_the_first_batch(model: keras.Model, whole: Any) -> str:
    replicas = model.distribute_strategy.num_replicas_in_sync
    return f"on the first batch ({examples_in(whole)} examples on {replicas} replicas)"


def _norm(gradients: list[tf.Tensor]) -> float:
    return float(tf.linalg.global_norm([tf.cast(g, tf.float64) for g in gradients]))


def _relative_difference(got: list[tf.Tensor], expected: list[tf.Tensor]) -> float:
    """`|got - expected| / |expected|` over all the tensors (0 for equal
    zeros)."""
    off = [
        tf.cast(a, tf.float64) - tf.cast(b, tf.float64) for a, b in zip(got, expected)
    ]
    return float(tf.math.divide_no_nan(tf.linalg.global_norm(off), _norm(expected)))


def _comparable(got: list[tf.Tensor], expected: list[tf.Tensor]) -> bool:
    """Whether two runs applied gradients of the same shapes (a step whose
    updates follow its data may apply others)."""
    return bool(expected) and [g.shape for g in got] == [e.shape for e in expected]


@contextlib.contextmanager
def _restored(
    model: keras.Model, optimizers: list[Any]
) -> Iterator[Callable[[], None]]:
    """Yields `restore()`, which sets the variables of `model` (its
    metrics' included) and of `optimizers` back to their values on entry,
    and those created since to their first values; called on exit too."""
    variables = model.variables + model.metrics_variables
    variables += [v for optimizer in optimizers for v in optimizer.variables]
    state = [(v, v.numpy()) for v in variables]
    created: list[tuple[Any, tf.Tensor]] = []

    def noting(next_creator: Callable[..., Any], **kwargs: Any) -> Any:
        variable = next_creator(**kwargs)
        with tf.init_scope():
            created.append((variable, tf.identity(variable)))
        return variable

    def restore() -> None:
        for variable, value in [*state, *created]:
            variable.assign(value)

    try:
        with tf.variable_creator_scope(noting):
            yield restore
    finally:
        restore()


def _on_replicas(
    first: FirstBatch, on_replica: Callable[[Any, bool], _T], eagerly: bool
) -> _T:
    """`on_replica(data, eagerly)` on every replica's part of the `first`
    batch, traced for the iterator's batches as the step is (or run
    `eagerly`, or where tracing asks for it: `_keras.NeedsEagerStep`);
    replica 0's result."""
    strategy = first.step.strategy

    def on_every_replica(element: Any, eagerly: bool) -> Any:
        return tree.map_structure(
            lambda value: strategy.experimental_local_results(value)[0],
            strategy.run(on_replica, (element, eagerly)),
        )

    if not eagerly:
        # A `partial`, traced once a model (`step_function._after_first_batch`).
        traced = tf.function(
            functools.partial(on_every_replica, eagerly=False),
            input_signature=[first.spec],
            autograph=False,
        )
        try:
            return traced(first.element)  # type: ignore[no-any-return]
        except Exception as error:
            if not _keras.needs_eager_step(error):
                raise
    return on_every_replica(first.element, True)  # type: ignore[no-any-return]


def _global_batch(first: FirstBatch, eagerly: bool) -> Any:
    """The `first` batch as one device has it: every replica's rows."""

    def on_replica(data: Any, eagerly: bool) -> Any:
        data = without_positions(optionals_to_none(data))[0]
        with _keras.replica_step(stands_for_trace=eagerly):
            data, _ = pad_empty_batch(data)
            return gather.global_batch(data)

    return _on_replicas(first, on_replica, eagerly)


def _applied_on_replicas(first: FirstBatch) -> list[tf.Tensor] | None:
    """The gradients the model's step applies on the `first` batch, its
    replicas' summed as the step sums them (replica 0's view, one tensor a
    variable and `apply`), or `None` when there is nothing to compare: it
    applies nothing, applies in shares (declared as it runs, or through
    keras_ctl's own steps), assigns batch statistics from each replica's
    own examples (each replica's normalization is not one device's;
    `batch_statistics` warns of them), or draws each replica's own random
    numbers (`random_draws="per_replica"`, or XLA's default)."""
    lock = threading.Lock()
    read_as_one_device: list[bool] = []
    traces: list[Trace] = []

    def on_replica(data: Any, eagerly: bool) -> list[tf.Tensor]:
        _, trace = first.step.on_replica(data, eagerly)
        applied = noted.pop(threading.get_ident(), [])
        with lock:
            read_as_one_device.extend(a.read_as_one_device for a in applied)
            traces.append(trace)
        return _flat_gradients(applied)

    with _keras.applies_captured() as noted:
        gradients = _on_replicas(first, on_replica, first.eagerly)
    if not read_as_one_device or not all(read_as_one_device):
        return None
    if any(trace.statistics for trace in traces):
        return None
    if not first.step.draws_as_one_device and any(trace.drew for trace in traces):
        return None
    return gradients


def _applying_on_one_device(
    model: keras.Model, batch: Any
) -> Callable[[], list[tf.Tensor]]:
    """`run()`: the gradients the model's `train_step` applies on `batch`
    on one device, traced once for any number of examples (as the step
    is): a second run draws the next numbers of TensorFlow's own random
    ops, as a second step would."""
    traced: list[Callable[[Any], list[tf.Tensor]]] = []

    def run() -> list[tf.Tensor]:
        with _keras.applies_captured() as noted:

            def applied(batch: Any) -> list[tf.Tensor]:
                # A `train_step` decorated with `tf.function` applies in
                # this trace, whose outputs the gradients can be.
                with _keras.users_functions_inlined():
                    model.train_step(batch)
                return _flat_gradients(noted.pop(threading.get_ident(), []))

            if model.run_eagerly:
                return applied(batch)
            if not traced:
                spec = [_any_rows(batch)]
                # A `partial`, traced once a model (`_on_replicas`).
                applied_once = functools.partial(applied)
                traced.append(tf.function(applied_once, input_signature=spec))
            return traced[0](batch)

    return run


def _any_rows(structure: Any) -> Any:
    """The specs of `structure`'s tensors for any number of rows."""
    return tree.map_structure(
        lambda t: t if t is None else tf.TensorSpec([None, *t.shape[1:]], t.dtype),
        structure,
    )


def _flat_gradients(applied: list[_keras.Applied]) -> list[tf.Tensor]:
    """The gradients of every `apply`, in order; a variable without one
    (`None`) as a scalar 0."""
    return [
        tf.zeros(()) if g is None else g for each in applied for g in each.gradients
    ]


def _summed_across_replicas(
    model: keras.Model, first: FirstBatch
) -> tuple[list[tf.Tensor], Any]:
    """`(gradients, batch)`: the gradients of the model's trainable weights
    that the default step sums across replicas on the `first` batch, and
    the global batch `(x, y, sample_weight)` (the replicas' rows
    gathered)."""
    weights = model.trainable_weights

    def on_replica(data: Any, eagerly: bool) -> tuple[list[tf.Tensor], Any]:
        data = without_positions(optionals_to_none(data))[0]
        # Keras's losses exact, as in the step.
        with _keras.replica_step(stands_for_trace=eagerly):
            data, batch_size = pad_empty_batch(data)
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            with tf.GradientTape() as tape:
                step = forward.forward_and_loss(
                    model, x, y, sample_weight, batch_size, training=False
                )
            gradients = _dense(tape.gradient(step.loss, weights), weights)
            context = tf.distribute.get_replica_context()
            summed = context.all_reduce(tf.distribute.ReduceOp.SUM, gradients)
            return summed, gather.global_batch((x, y, sample_weight))

    return _on_replicas(first, on_replica, model.run_eagerly)


def _gradients_on_one_device(model: keras.Model, batch: Any) -> list[tf.Tensor]:
    """One device's gradients of the model's `compute_loss` on `batch`,
    `(x, y, sample_weight)`, traced for any number of examples (as the
    step is)."""
    weights = model.trainable_weights
    given = [i for i, part in enumerate(batch) if part is not None]

    def gradients(*parts: Any) -> list[tf.Tensor]:
        x, y, sample_weight = (
            parts[given.index(i)] if i in given else None for i in range(3)
        )
        with tf.GradientTape() as tape:
            y_pred = model(x, training=False)
            loss = _keras.user_compute_loss(model, x, y, y_pred, sample_weight, False)
            # A loss of several values is read as their mean, as in the step.
            loss = tf.reduce_mean(tf.cast(loss, weights[0].dtype))
        return _dense(tape.gradient(loss, weights), weights)

    parts = [batch[i] for i in given]
    if model.run_eagerly:
        return gradients(*parts)
    traced = tf.function(
        functools.partial(gradients), input_signature=_any_rows(parts), autograph=False
    )
    return traced(*parts)  # type: ignore[no-any-return]


def _dense(gradients: list[Any], weights: list[Any]) -> list[tf.Tensor]:
    return [
        tf.zeros_like(w) if g is None else tf.convert_to_tensor(g)
        for w, g in zip(weights, gradients)
    ]


def _one_device(function: Callable[..., _T], *args: Any) -> _T:
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
