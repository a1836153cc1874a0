"""Whether the user's loss is a mean over examples, measured on a batch
before any step trains on it (`check_for`), at the steps
`measurement_schedule` says.

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
what it would apply: `_replaced.optimizers.applies_captured`), against one device's on
the same examples (`refuse_unless_mean`, `refuse_unless_step_mean`;
`measuring` runs both on each replica's slice), past the round-off
measured (`_tolerance`). The loss on the examples and on their halves
(`measure`, also the parity kit's) says which kind a refused
`compute_loss` is. A loss measured a sum over examples (the replicas'
losses summed as they are equal one device's) is read in shares instead,
at its first measurement (`refuse_unless_step_mean`, `refuse_unless_mean`).

`compile(compute_loss_over=...)` decides: `None` (the default) measures
batches of `fit()` and `evaluate()` under several replicas (a step of
one's own: of `fit()`) and refuses a loss that is not a mean, naming the
numbers and the choices; `"replica_batch"` runs it on
each replica's part as written; `"global_batch"` computes a `compute_loss`
over the global batch, as one device does.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf
from keras import tree

from keras_ctl import _keras
from keras_ctl._engine import loss as loss_module
from keras_ctl._engine import measuring
from keras_ctl._engine import state as engine_state
from keras_ctl._engine.replica_step import MeasuredBatch
from keras_ctl._own_code import is_keras_ctls
from keras_ctl._own_code import is_users_function
from keras_ctl._own_code import is_users_own
from keras_ctl._own_code import replica_arithmetic_noted
from keras_ctl.distribute import topology

# Where no round-off is measured (the parity kit's `measure`): a loss of
# float32 round-off (the halves' mean recombined) passes.
_RTOL = 1e-5


class Measurement(NamedTuple):
    """A `compute_loss` on a batch of `rows` examples and on its halves
    (the first `rows // 2` examples, then the rest), equal where they
    differ by at most `tolerance` relative to the largest of them."""

    rows: int
    whole: float
    first: float
    second: float
    tolerance: float = _RTOL

    @property
    def mean_of_halves(self) -> float:
        half = self.rows // 2
        return (half * self.first + (self.rows - half) * self.second) / self.rows

    @property
    def is_mean(self) -> bool:
        return self._equal(self.whole, self.mean_of_halves)

    @property
    def is_sum(self) -> bool:
        return self._equal(self.whole, self.first + self.second)

    def _equal(self, a: float, b: float) -> bool:
        scale = max(abs(self.whole), abs(self.first), abs(self.second))
        return abs(a - b) <= self.tolerance * scale

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
    rows = measuring.examples_in(batch)
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


class Refused(ValueError):
    """A loss whose reading is not one device's, refused by name."""


class _HandlesReplicas(Exception):
    """The loss measured calls replica arithmetic."""


def check_for(
    model: keras.Model, training: bool
) -> Callable[[MeasuredBatch], bool] | None:
    """The measurement of `model`'s train (`training`) or test function
    (`StepParts.measurement`), or `None`."""
    strategy = model.distribute_strategy
    if (
        engine_state.of(model).compute_loss_over is not None
        or strategy.num_replicas_in_sync == 1
        or topology.of(strategy).parameter_servers
    ):
        return None
    step = "train_step" if training else "test_step"
    check = None
    if not is_users_own(model, step):
        if is_users_own(model, "compute_loss"):
            check = refuse_unless_mean
        elif is_keras_ctls(model, "compute_loss") and _users_losses_compiled(model):
            check = read_compiled_losses
    elif training:  # declared in shares or not: measured
        check = refuse_unless_step_mean
    return None if check is None else functools.partial(_in_parts, check, model)


def _in_parts(
    check: Callable[[keras.Model, MeasuredBatch], bool],
    model: keras.Model,
    batch: MeasuredBatch,
) -> bool:
    """`check` on every part of `batch` (`measuring.sliced`: each within a
    replica's memory, together the whole batch); whether to measure later
    batches."""
    whole = measuring.global_batch(batch, model.run_eagerly)
    for part in range(whole.parts):
        # Part 0 is gathered already.
        gathered = whole if part == 0 else None
        try:
            if not check(model, batch._replace(part=part, gathered=gathered)):
                return False
        except (Refused, tf.errors.InvalidArgumentError):
            raise  # named already, or by the step function
        except Exception as error:
            if whole.parts == 1:
                raise
            # The step's own error, its type and message kept (PEP 678).
            note = _measured_in_parts(model, batch, whole)
            if not hasattr(error, "add_note"):  # Python 3.10 keeps no notes
                raise ValueError(f"{note} The error: {error}") from error
            error.add_note(note)
            raise
    return True


def _measured_in_parts(
    model: keras.Model, batch: MeasuredBatch, whole: measuring.GlobalBatch
) -> str:
    return (
        f"keras_ctl: raised as {type(model).__name__}'s step was measured "
        f"{_where(model, batch, whole)}, which runs it on each replica's part "
        "in slices so one device holds no more than a replica's part. If the "
        "step assumes its batch's size (a queue or a constant sized to it), "
        "make it follow the batch it is given (`ops.shape(x)[0]`), or pass "
        '`compute_loss_over="replica_batch"` to `compile()` to run it '
        "unmeasured."
    )


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


def read_compiled_losses(model: keras.Model, batch: MeasuredBatch) -> bool:
    """Reads each compiled loss of the user's own as one device computes
    it, measured on `batch` before any step runs on it: the loss on the
    examples measured against their halves (`Measurement`), on one device,
    with the predictions of `training=False`. A mean over examples (one
    value for the batch, or Keras's reduction of one value an example)
    keeps the mean reading; a sum (the tutorial's `sum(per_example) /
    GLOBAL_BATCH` inside a `Loss`, a `reduction="sum"` of one value) is
    read as each replica's share, summed as it is; anything else, and a
    reading other than an earlier batch's (the step runs the first), is
    refused, naming the numbers. The readings go to the engine state
    (`loss_readings`), which the traced step reads."""
    whole = measuring.global_batch(batch, model.run_eagerly)
    readings = engine_state.of(model).loss_readings
    measurements = measuring.one_device(_compiled_loss_measurements, model, whole.data)
    for loss, name, measured in measurements:
        reading = "mean" if measured.is_mean else "share" if measured.is_sum else None
        known = readings.setdefault(id(loss), reading or "mean")
        if reading == known:
            continue
        where = _where(model, batch, whole)
        if reading is None:
            raise Refused(
                f"The loss of output `{name}` ({type(loss).__name__}) is "
                f"neither a mean nor a sum over examples {where}: {measured}. "
                "Each replica computes it on its part of the batch, which "
                "cannot add up to one device's loss. Return one value per "
                "example from its `call()` (Keras then reduces them over the "
                "global batch), or compute it in a `compute_loss` of the "
                'model\'s own with `compile(compute_loss_over="global_batch")`, '
                "which sees the global batch."
            )
        raise Refused(
            f"The loss of output `{name}` ({type(loss).__name__}) was a "
            f"{_READING[known]} on the batches measured before, and is a "
            f"{_READING[reading]} {where}: {measured}. The step reads it as "
            "the first batch measured it. Return one value per example from "
            "its `call()`: Keras then reduces them over the global batch, "
            "whatever the batch."
        )
    return True


_READING = {"mean": "mean over examples", "share": "sum over examples"}


def _compiled_loss_measurements(
    model: keras.Model, batch: Any
) -> list[tuple[Any, str, Measurement]]:
    """`[(loss, output name, Measurement)]` of each compiled loss of the
    user's own on `batch` (none for a batch of fewer than 2 examples, or
    a compiled loss Keras has not built)."""
    x, y, _ = keras.utils.unpack_x_y_sample_weight(tuple(batch))
    rows = measuring.examples_in(batch)
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
            # Round-off: the whole batch in reverse order.
            again = _value_on_rows(loss, [y_true, pred], 0, rows, reverse=True)
            scale = max(abs(whole), np.finfo("float64").tiny)
            tolerance = _tolerance(model, abs(again - whole) / scale)
            measured = Measurement(rows, whole, first, second, tolerance)
            found.append((loss, name, measured))
    return found


def _value_on_rows(
    loss: Any, arguments: list[Any], start: int, stop: int, reverse: bool = False
) -> float:
    """`loss(y_true, y_pred)` of rows `start:stop` (in reverse order)."""

    def rows(t: Any) -> Any:
        t = t[start:stop]
        return tf.reverse(t, [0]) if reverse else t

    return float(np.mean(loss(*tree.map_structure(rows, arguments))))


def refuse_unless_mean(model: keras.Model, batch: MeasuredBatch) -> bool:
    """Runs the model's `compute_loss` in the reading that equals one
    device, measured on `batch` (its slices: `measuring.sliced`), or raises
    a `Refused` naming the numbers and the choices.

    Read as one device's code, each replica's loss on its part is weighed
    by the part's share of the batch; in shares, summed as it is. The
    gradient the default step sums across replicas in the loss's reading
    is compared with one device's on the same examples, past round-off
    (`_tolerance`). At the model's first measurement (before a step
    function reads it), a loss whose weighed gradient differs is measured
    in shares, and read in shares from then on when that equals one
    device's (a sum over examples: the masked language model's
    `ops.sum` of one value a token). Later, a difference in the reading
    the steps run is refused. Predictions with `training=False`; the
    model's variables and metrics are as they were afterwards."""
    readings = engine_state.of(model).loss_readings
    with measuring.restored(model, []):
        summed, whole = measuring.summed_across_replicas(model, batch)
        one_device = measuring.gradients_on_one_device(model, batch, whole.data)
        reordered = measuring.reordered(whole.data)
        again = measuring.gradients_on_one_device(model, batch, reordered)
        tolerance = _tolerance(model, _relative_difference(again, one_device))
        off = _relative_difference(summed, one_device)
        first = engine_state.COMPUTE_LOSS not in readings
        if off <= tolerance:
            readings.setdefault(engine_state.COMPUTE_LOSS, "mean")
            return True
        off_in_shares = None
        if first:
            readings[engine_state.COMPUTE_LOSS] = "share"
            in_shares, _ = measuring.summed_across_replicas(model, batch)
            off_in_shares = _relative_difference(in_shares, one_device)
            if off_in_shares <= tolerance:
                return True  # read in shares from now on
            del readings[engine_state.COMPUTE_LOSS]
    measured = measuring.one_device(measure, model, whole.data)
    values = "" if measured is None else f"; {measured}"
    known = readings.get(engine_state.COMPUTE_LOSS)
    if known == "share":
        kind = "no longer a sum over examples"
        reading = "summed as it is (read in shares, as measured before)"
    else:
        kind = "not a mean over examples"
        reading = "weighed by the part's share of the batch and summed"
        if off_in_shares is not None:
            kind = "neither a mean nor a sum over examples"
            reading += f" (summed as it is: {off_in_shares:.3g} off)"
    raise Refused(
        f"{type(model).__name__}.compute_loss is {kind}: "
        f"{_where(model, batch, whole)}, the gradient of each replica's loss "
        f"on its part, {reading}, "
        f"is {off:.3g} off (relative) one device's gradient on the same "
        f"examples, past round-off ({tolerance:.2g}){values}. Pass "
        '`compute_loss_over="global_batch"` to `compile()`: every replica '
        "then computes it on the global batch, and the model trains as on "
        'one device. Or pass `compute_loss_over="replica_batch"` to compute '
        "it on each replica's part as written (a sum then covers the part's "
        "examples only)."
    )


def refuse_unless_step_mean(model: keras.Model, batch: MeasuredBatch) -> bool:
    """Runs a `train_step` of the user's own in the reading that equals one
    device, measured on `batch` (its slices: `measuring.sliced`), or raises
    a `ValueError` naming the numbers and the choices.

    Read as one device's code, each replica's gradients are weighed by its
    part and summed; in shares, summed as they are. The gradients the step
    applies in its reading are compared with those it applies on one device
    on the same examples. Before the step is first traced (the function's
    first measurement), a step read as one device's code whose gradients
    differ by more than round-off (`_tolerance`) is measured in shares, and
    runs in shares when those equal one device's (a loss of one value an
    example, whose gradient `tape.gradient` sums: keras.io's triplet
    siamese network). Later, a difference in the reading it runs is
    refused, naming the step.

    A step declared written in shares (`keras_ctl.written_in_shares`, as it
    runs or as the function it returned) is measured in shares, not
    trusted. Nothing is applied (`_replaced.optimizers.applies_captured`),
    and the model's and its optimizers' variables are as they were
    afterwards. Not refused: a step that applies nothing, or in both
    readings, and one whose gradients on one device differ between two runs
    on the same batch and state (it draws numbers that are not one
    device's: TensorFlow's own random ops, Python's `random`), which is
    warned of instead, and not measured again (returns `False`)."""
    step = batch.step
    with measuring.restored(model, step.parts.optimizers) as restore:
        whole = measuring.global_batch(batch, model.run_eagerly)
        on_replicas = measuring.applied_on_replicas(batch)
        if on_replicas is None:
            return True
        # In order twice (TensorFlow's own draws differ), then in another
        # order (round-off; not where the step draws, row by row).
        orders = [whole.data, whole.data]
        if not on_replicas.drew:
            orders.append(measuring.reordered(whole.data))
        runs = []
        for data in orders:
            restore()
            runs.append(measuring.applying_on_one_device(model, batch, data))
        one_device, again = runs[:2]
        if not _comparable(on_replicas.gradients, one_device):
            return True
        name = f"{type(model).__name__}.train_step"
        if _relative_difference(again, one_device) > _tolerance(model, None):
            warnings.warn(_DRAWS_ITS_OWN.format(step=name), stacklevel=2)
            return False
        roundoff = (
            None if on_replicas.drew else _relative_difference(runs[2], one_device)
        )
        tolerance = _tolerance(model, roundoff)
        off = _relative_difference(on_replicas.gradients, one_device)
        if off <= tolerance:
            return True
        in_shares = None
        if batch.number == 1 and on_replicas.as_one_device:
            restore()
            in_shares = _applied_in_shares(batch)
            if in_shares is not None:
                if _relative_difference(in_shares, one_device) <= tolerance:
                    return True  # the step runs in shares from now on
                step.reads_as_one_device = True
    scale = _norm(on_replicas.gradients) / max(
        _norm(one_device), np.finfo("float64").tiny
    )
    summed = "summed as it is"
    declared = not on_replicas.as_one_device and step.reads_as_one_device
    declared |= not step.parts.reads_as_one_device
    if on_replicas.as_one_device:
        reading = "read as one device's code"
        summed = "weighed by the part's share of the batch and summed"
    elif declared:
        reading = "declared written in shares (`keras_ctl.written_in_shares`)"
    else:
        reading = "run in shares, as the first batch measured it"
    kind = "not a mean over examples"
    if declared:
        kind = (
            "not a sum of the replicas' shares: a mean over the replica's "
            "examples, for one, is one device's code, which the step is read "
            "as without the declaration"
        )
    if in_shares is not None:
        off_in_shares = _relative_difference(in_shares, one_device)
        summed += f" (in shares, summed as they are: {off_in_shares:.3g} off)"
        kind = "neither a mean nor a sum over examples"
    raise Refused(
        f"{name} is {reading}, but the gradients it applies "
        f"{_where(model, batch, whole)}, each replica's on its part {summed}, "
        f"are {off:.3g} off (relative) one device's gradients on the same "
        f"examples ({scale:.3g} times their size; round-off: {tolerance:.2g}): "
        f"its loss is {kind}. A loss that couples the batch's examples "
        "(in-batch negatives, a statistic of the batch) needs their rows "
        "gathered with `keras_ctl.all_gather`. A loss of one value an "
        "example, whose gradient `tape.gradient` sums, is a sum over "
        "examples: take its mean (`ops.mean(loss)`) to write one device's "
        "code, or decorate the step with `@keras_ctl.written_in_shares` "
        "(each replica's sum is then its share of the batch's). Or pass "
        '`compute_loss_over="replica_batch"` to `compile()` to run the '
        "step on each replica's part as written, unmeasured."
    )


def _applied_in_shares(batch: MeasuredBatch) -> list[tf.Tensor] | None:
    """The gradients the step applies on `batch` read in shares, and that
    reading set on it (`None`, and the reading back, when it applies in
    another)."""
    batch.step.reads_as_one_device = False
    applied = measuring.applied_on_replicas(batch)
    if applied is None:
        batch.step.reads_as_one_device = True
        return None
    return applied.gradients


_DRAWS_ITS_OWN = (
    "{step} applies other gradients on each run of one device on the same "
    "batch and weights: it draws random numbers that are not one device's "
    "under several replicas (TensorFlow's own random ops such as "
    "`tf.random.normal` or `tf.random.shuffle`, Python's or NumPy's "
    "`random`), so each replica draws its own and a seeded run ends "
    "elsewhere than on one device, and keras_ctl cannot measure whether its "
    "loss is a mean over examples. Draw with `keras.random` and a "
    "`keras.random.SeedGenerator` for one device's numbers."
)


def _tolerance(model: keras.Model, roundoff: float | None) -> float:
    """The relative difference of two gradients that is round-off, in the
    model's compute dtype: `_ROUNDOFF_MARGIN` times the `roundoff` measured
    (one device's gradients on the same examples in another order; `None`
    where a step draws row by row, whose draws another order would move),
    at least `_EPSILONS` epsilons of the dtype: 2.3e-13 in float64, 1.2e-4
    in float32. The floor is the round-off of gradients that cancel (a
    bias that cancels in a difference of embeddings): another order does
    not show it, another split does (keras.io's siamese network in float32
    on 3 replicas, exact, 3.4e-5 off with a reordering's 2e-7)."""
    compute = keras.backend.standardize_dtype(model.dtype_policy.compute_dtype)
    epsilon = _EPSILON.get(compute) or float(np.finfo(compute).eps)
    measured = 0.0 if roundoff is None else _ROUNDOFF_MARGIN * roundoff
    return max(_EPSILONS * epsilon, measured)


_EPSILON = {"bfloat16": 2.0**-7}
_ROUNDOFF_MARGIN, _EPSILONS = 32, 1024


def _where(
    model: keras.Model, batch: MeasuredBatch, whole: measuring.GlobalBatch
) -> str:
    """Where a measurement was taken, as messages say it."""
    replicas = model.distribute_strategy.num_replicas_in_sync
    step = "the first batch" if batch.number == 1 else f"step {batch.number}'s batch"
    after = ""
    if batch.number > 1:
        after = (
            ", the batches measured before it being exact (a term switched "
            "on as the run went, or a mask or padding first met here)"
        )
    return (
        f"on {step} ({whole.rows} of its {whole.of_rows} examples, on "
        f"{replicas} replicas{after})"
    )


def _norm(gradients: list[tf.Tensor]) -> float:
    return float(np.sqrt(sum(np.sum(np.square(_float64(g))) for g in gradients)))


def _relative_difference(got: list[tf.Tensor], expected: list[tf.Tensor]) -> float:
    """`|got - expected| / |expected|` over all the tensors (0 for equal
    zeros), in float64 (in NumPy: a few eager ops a tensor cost more than
    the arithmetic)."""
    off = _norm([_float64(a) - _float64(b) for a, b in zip(got, expected)])
    size = _norm(expected)
    return 0.0 if size == 0 else off / size


def _float64(tensor: Any) -> np.ndarray:
    """A gradient (dense, or sparse slices made dense) as float64."""
    if isinstance(tensor, np.ndarray):
        return tensor.astype(np.float64, copy=False)
    return np.asarray(tf.convert_to_tensor(tensor), dtype=np.float64)


def _comparable(got: list[tf.Tensor], expected: list[tf.Tensor]) -> bool:
    """Whether two runs applied gradients of the same shapes (a step whose
    updates follow its data may apply others)."""
    return bool(expected) and [g.shape for g in got] == [e.shape for e in expected]
