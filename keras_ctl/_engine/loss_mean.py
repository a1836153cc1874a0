"""Whether a `compute_loss` of the user's own is a mean over examples,
measured on the first batch before any step trains on it.

Under R replicas the default steps weigh each replica's `compute_loss` on
its part of the batch by that part's share of the global batch. That is
one device's loss when the loss is a mean over examples (Keras's `Loss`
objects and `super().compute_loss` are made exact in the step, whatever
their reduction), not for a sum over examples or a loss that couples the
batch's examples (in-batch negatives, a masked mean over a count of
entries written by hand), and nothing in how it is spelled says which. So
what runs is compared (`refuse_unless_mean`): the gradient the replicas'
weighted losses sum to, against one device's gradient on the whole batch.
The loss on the whole batch and on its halves (`measure`, also the parity
kit's) says which kind a refused loss is.

`compile(compute_loss_over=...)` decides: `None` (the default) measures
the first batch of the first `fit()` or `evaluate()` under several
replicas and refuses a loss that is not a mean, naming the numbers and
both choices; `"replica_batch"` runs it on each replica's part as written;
`"global_batch"` computes it over the global batch, as one device does.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
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
from keras_ctl._engine import state as engine_state
from keras_ctl._engine.padding import pad_empty_batch
from keras_ctl._engine.replica_step import optionals_to_none
from keras_ctl._keras.iterators import without_positions
from keras_ctl._own_code import is_users_own
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
    def kind(self) -> str:
        """What a loss that is not a mean is: a sum, or a coupling."""
        if np.isclose(self.whole, self.first + self.second, _RTOL, _ATOL):
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


def measured_by_default(model: keras.Model, training: bool) -> bool:
    """Whether the first batch of `model`'s train (`training`) or test
    function is measured: a `compute_loss` of the user's own, called by
    keras_ctl's step, under several replicas, without a
    `compute_loss_over` chosen."""
    strategy = model.distribute_strategy
    return (
        engine_state.of(model).compute_loss_over is None
        and strategy.num_replicas_in_sync > 1
        and not isinstance(strategy, tf.distribute.ParameterServerStrategy)
        and is_users_own(model, "compute_loss")
        and not is_users_own(model, "train_step" if training else "test_step")
    )


def refuse_unless_mean(model: keras.Model, element: Any, spec: Any) -> None:
    """Raises a `ValueError` naming the numbers and the choices when the
    gradient of the model's `compute_loss` that the default step sums
    across replicas on `element` (a batch as the strategy distributed it,
    of the iterator's `spec`), each replica's loss on its part weighed by
    the part's share, differs from one device's gradient on the whole batch
    by more than round-off. Predictions with `training=False`; the model's
    variables and metrics are as they were afterwards."""
    variables = model.variables + model.metrics_variables
    state = [v.numpy() for v in variables]
    try:
        summed, whole = _summed_across_replicas(model, element, spec)
        one_device = _one_device(_gradients_on_one_device, model, whole)
    finally:
        for variable, value in zip(variables, state):
            variable.assign(value)
    off = tf.linalg.global_norm([a - b for a, b in zip(summed, one_device)])
    off = float(tf.math.divide_no_nan(off, tf.linalg.global_norm(one_device)))
    if off <= _GRADIENT_RTOL:
        return
    measured = _one_device(measure, model, whole)
    values = "" if measured is None else f"; {measured}"
    raise ValueError(
        f"{type(model).__name__}.compute_loss is not a mean over examples: "
        f"on the first batch ({examples_in(whole)} examples on "
        f"{model.distribute_strategy.num_replicas_in_sync} replicas), the "
        "gradient of each replica's loss on its part, weighed by the part's "
        f"share of the batch and summed, is {off:.3g} off (relative) one "
        f"device's gradient on the whole batch{values}. Pass "
        '`compute_loss_over="global_batch"` to `compile()`: every replica '
        "then computes it on the global batch, and the model trains as on "
        'one device. Or pass `compute_loss_over="replica_batch"` to compute '
        "it on each replica's part as written (a sum then covers the part's "
        "examples only)."
    )


# Round-off of float32 gradients summed in another order is about 1e-6.
_GRADIENT_RTOL = 1e-4


def _summed_across_replicas(
    model: keras.Model, element: Any, spec: Any
) -> tuple[list[tf.Tensor], Any]:
    """`(gradients, batch)`: the gradients of the model's trainable weights
    that the default step sums across replicas on `element`, and the
    global batch `(x, y, sample_weight)` (the replicas' rows gathered).
    Traced for the iterator's batches (`spec`), as the step is."""
    strategy = model.distribute_strategy
    weights = model.trainable_weights

    def on_replica(data: Any) -> tuple[list[tf.Tensor], Any]:
        data = without_positions(optionals_to_none(data))[0]
        with _keras.replica_step():  # Keras's losses exact, as in the step
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

    def on_every_replica(element: Any) -> Any:
        return tree.map_structure(
            lambda value: strategy.experimental_local_results(value)[0],
            strategy.run(on_replica, (element,)),
        )

    if model.run_eagerly:
        return on_every_replica(element)  # type: ignore[no-any-return]
    # A `partial`, traced once a model (`step_function._after_first_batch`).
    traced = tf.function(
        functools.partial(on_every_replica), input_signature=[spec], autograph=False
    )
    return traced(element)  # type: ignore[no-any-return]


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
    spec = tree.map_structure(
        lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), parts
    )
    traced = tf.function(
        functools.partial(gradients), input_signature=spec, autograph=False
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
