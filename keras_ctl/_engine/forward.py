"""The forward pass and loss share of the default steps, eager or with XLA.

Each output's loss is called once a step (`compiled_terms`), and what its
denominators need decides the path (`LossTerms.foldable`,
`LossTerms.fixed_counts`): `exact_gradients` for the eager step,
`evaluation_loss` for `evaluate()`, `CompiledPass` for XLA per replica.

Training makes one collective a step where it can: when every loss
divides by a fixed count per example, each replica differentiates its loss
*times its number of examples* (no global count needed), and the gradients
travel with the count in one all-reduce, divided by the global count after
it (`exact_gradients`). Other losses (masks, sample-weight sums, a user's
`compute_loss`) and mixed precision (a summed loss could overflow the
float16 gradients before the loss scale adapts) all-reduce the count first.

XLA cannot compile a `strategy.run` that spans devices (Keras 3.15 fails
with "Trying to access resource ... located in device CPU:1 from device
CPU:0"), and a compiled function cannot hold the collectives of a step. So
under several replicas each replica compiles its own forward and backward
pass, and the collectives stay outside it. Without an all-reduce inside,
every loss denominator must be a fixed count per example (no masks, no
sample-weight sums); a loss that needs more runs the eager exact step
instead, with a warning.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple
from typing import cast

import keras
import tensorflow as tf

from keras_ctl import _keras
from keras_ctl import _replaced
from keras_ctl._engine import gather
from keras_ctl._engine import loss as loss_module
from keras_ctl._engine import state as engine_state
from keras_ctl._engine.autograph import not_converted
from keras_ctl._own_code import is_keras_ctls
from keras_ctl._own_code import watching_replica_arithmetic
from keras_ctl._replicas import Gradient
from keras_ctl._replicas import Reading
from keras_ctl._replicas import SummedTogether
from keras_ctl._replicas import global_shares
from keras_ctl._replicas import num_replicas
from keras_ctl._replicas import only_if_real
from keras_ctl._replicas import read_as_batch_losses
from keras_ctl._replicas import sum_across_replicas

# What a `compute_loss` of one's own sees (`CTLModel.compile`).
COMPUTE_LOSS_OVER = (None, "replica_batch", "global_batch")


class Pass(NamedTuple):
    """One replica's pass of a default step.

    Attributes:
        y_pred: The predictions.
        loss: This replica's share of the global batch's loss (compiled
            loss and `model.losses`), or `None` where the step did without
            the global count (`evaluation_pass`).
        loss_sum: This replica's part of `loss x global batch size`: what
            the loss tracker adds, with `shares.local_batch_size` examples.
        shares: The `LossShares`; `shares.global_batch_size` is `None`
            where the step did without it.
        gradients: The gradients (summed across replicas unless the caller
            asked for this replica's share), or `None` without training.
    """

    y_pred: Any
    loss: tf.Tensor | None
    loss_sum: tf.Tensor
    shares: loss_module.LossShares
    gradients: list[Gradient | None] | None = None


def _pass(
    y_pred: Any,
    loss: tf.Tensor,
    shares: loss_module.LossShares,
    gradients: list[Gradient | None] | None = None,
) -> Pass:
    return Pass(y_pred, loss, loss * shares.global_batch_size, shares, gradients)


def forward_and_loss(
    model: keras.Model,
    x: Any,
    y: Any,
    sample_weight: Any,
    batch_size: tf.Tensor,
    *,
    training: bool,
    y_pred: Any = None,
    terms: loss_module.LossTerms | None = None,
) -> Pass:
    """Returns the `Pass` (without gradients) of one replica's batch.

    Args:
        model: The `CTLModel`.
        x, y, sample_weight: This replica's part of the batch.
        batch_size: Number of real examples (0 on a padded replica).
        training: Whether the model runs in training mode.
        y_pred: The predictions, when the caller ran the forward pass.
        terms: The compiled loss's `LossTerms`, when the caller has them.

    A subclass's own `compute_loss` is read as on one device: the loss of
    this replica's batch, weighed by the replica's fraction of the global
    batch (`read_as_batch_losses`).
    """
    if not is_keras_ctls(model, "compute_loss"):
        return own_compute_loss(
            model, x, y, y_pred, sample_weight, batch_size, training
        )
    if y_pred is None:
        y_pred = model(x, training=training)
    loss, shares = default_loss_share(
        model, y, y_pred, sample_weight, batch_size, terms=terms
    )
    return _pass(y_pred, loss, shares)


def own_compute_loss(
    model: keras.Model,
    x: Any,
    y: Any,
    y_pred: Any,
    sample_weight: Any,
    batch_size: tf.Tensor,
    training: bool,
) -> Pass:
    """The `Pass` of a subclass's own `compute_loss` on this replica.

    Its value is this replica's batch's loss, as one device computes it
    (a mean over the batch, Keras's `Loss` objects, `super().compute_loss`,
    terms that do not depend on the batch), and the step weighs it by the
    replica's fraction of the global batch: the replicas' weighted losses
    sum to one device's, and so do their gradients. A tracker given one
    value inside it weighs it the same (`_replaced.metrics.weighed_by_batch`).
    A loss its first measurement found a sum over examples
    (`loss_mean.refuse_unless_mean`) is read in shares instead: each
    replica's value is its share of the global batch's, summed as it is,
    the loss logged and a tracker's one value too.
    The forward pass runs after the count's collective, unless the caller
    ran it: `compute_loss` reads the layer losses, which another replica's
    forward pass may overwrite after a collective (the replicas share the
    layers).
    """
    dtype = keras.config.floatx()
    shares = loss_module.count_only_shares(batch_size, dtype)
    fraction = tf.math.divide_no_nan(shares.local_batch_size, shares.global_batch_size)
    if y_pred is None:
        y_pred = model(x, training=training)
    seen = (x, y, y_pred, sample_weight)
    weight = fraction
    over_global_batch = engine_state.of(model).compute_loss_over == "global_batch"
    if over_global_batch:
        # Every replica's loss is the whole batch's, reduced as on one
        # device. Only the first replica's trains: the gradients of
        # variables used after the gather (an embedding looked up for
        # gathered labels) are then one device's slices, where weights
        # summing to 1 over the replicas would give R weighed copies of
        # each, which Adam's sparse update squares one by one.
        seen = gather.global_batch(seen)
        weight = gather.first_replica()
    rows = (
        _replaced.losses.rows_of_global_batch()
        if over_global_batch
        else contextlib.nullcontext()
    )
    owner = f"{type(model).__name__}.compute_loss"
    readings = engine_state.of(model).loss_readings
    in_shares = readings.get(engine_state.COMPUTE_LOSS) == "share"
    with (
        read_as_batch_losses(fraction, owner) as reading,
        rows,
        watching_replica_arithmetic(),
    ):
        if in_shares and not over_global_batch:
            # Measured a sum over examples: each replica's value is its
            # share of the global batch's, summed as it is.
            cast(Reading, reading).in_shares = True
            weight = tf.ones_like(fraction)
        loss = _keras.user_compute_loss(model, *seen, training)
    # A loss of several values is read as their mean, as Keras's `Mean`
    # tracker takes it.
    dtype = loss.dtype if loss.dtype.is_floating else dtype
    loss = tf.reduce_mean(tf.cast(loss, dtype))
    # What the loss tracker adds: the replicas' sum over the global count is
    # one device's loss.
    examples = shares.global_batch_size if in_shares else shares.local_batch_size
    weighed = loss * tf.cast(weight, dtype)
    return Pass(y_pred, weighed, loss * tf.cast(examples, dtype), shares)


def compiled_terms(
    model: keras.Model, y: Any, y_pred: Any, sample_weight: Any, batch_size: tf.Tensor
) -> loss_module.LossTerms | None:
    """The `LossTerms` of the model's compiled loss, or `None` without one."""
    compile_loss = _keras.compile_loss(model)
    if compile_loss is None:
        return None
    return _terms(model, compile_loss, y, y_pred, sample_weight, batch_size)


def _terms(
    model: keras.Model,
    compile_loss: Any,
    y: Any,
    y_pred: Any,
    sample_weight: Any,
    batch_size: tf.Tensor,
) -> loss_module.LossTerms:
    """`compile_loss`'s terms, each loss read as the first batch measured
    (`EngineState.loss_readings`)."""
    readings = engine_state.of(model).loss_readings
    return loss_module.loss_terms(
        compile_loss, y, y_pred, sample_weight, batch_size, readings
    )


def loss_times_examples(
    model: keras.Model, terms: loss_module.LossTerms, batch_size: tf.Tensor
) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """`(total, per_output)`: this replica's part of `loss x batch size`,
    with no collective, for foldable `terms` (see
    `loss.loss_times_examples`); regularization counts once per example of
    the batch, as on one device."""
    total, per_output = loss_module.loss_times_examples(terms)
    if not model.losses:
        return total, per_output
    local_batch = tf.cast(batch_size, total.dtype)
    # Regularization's share of a global batch of 1, as the terms'.
    regularization = regularization_share(model.losses, local_batch, 1.0)
    return total + regularization, per_output


def evaluation_pass(
    model: keras.Model, y: Any, y_pred: Any, sample_weight: Any, batch_size: tf.Tensor
) -> Pass:
    """The `Pass` of `evaluate()` for predictions `y_pred`, without a
    collective where it can.

    The loss tracker adds `loss_sum` and this replica's count. For one
    output whose loss is foldable, `loss_sum` is this replica's part of
    `loss x examples`, with no global count, and the logs' sum across
    replicas makes the mean exact. Per-output losses are logged as means
    over steps, which need each step's global count.
    """
    terms = compiled_terms(model, y, y_pred, sample_weight, batch_size)
    compile_loss = _keras.compile_loss(model)
    if (
        terms is None
        or not terms.foldable
        or _keras.per_output_loss_trackers(compile_loss)
    ):
        loss, shares = default_loss_share(
            model, y, y_pred, sample_weight, batch_size, terms=terms
        )
        return _pass(y_pred, loss, shares)
    total, _ = loss_times_examples(model, terms, batch_size)
    local_batch = tf.cast(batch_size, total.dtype)
    shares = loss_module.LossShares(None, [], None, local_batch)
    return Pass(y_pred, None, total, shares)


def exact_gradients(
    model: keras.Model,
    x: Any,
    y: Any,
    sample_weight: Any,
    batch_size: tf.Tensor,
    sum_gradients: bool = True,
    before_sum: Callable[[Pass], SummedTogether | None] | None = None,
) -> Pass:
    """Trains' forward and backward pass: its `Pass`, with the gradients
    summed across replicas, in one collective where it can.

    Without `sum_gradients`, the gradients are this replica's share (summed
    later, e.g. once per accumulated update). `before_sum` is called with
    the `Pass` (without gradients) before the gradients are summed; what
    it returns rides on their collective (`metric_updates.RidingLogs`)."""
    with tf.GradientTape() as tape:
        y_pred, terms = None, None
        if is_keras_ctls(model, "compute_loss"):
            y_pred = model(x, training=True)
            terms = compiled_terms(model, y, y_pred, sample_weight, batch_size)
        # One replica divides its loss once, as one device does, where the
        # fold would divide each gradient.
        fold = (
            sum_gradients
            and num_replicas() > 1
            and terms is not None
            and terms.foldable
            and not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        )
        if fold and terms is not None:  # `fold` needs `terms`
            summed = loss_times_examples(model, terms, batch_size)
            objective = summed[0]
        else:
            forward = forward_and_loss(
                model,
                x,
                y,
                sample_weight,
                batch_size,
                training=True,
                y_pred=y_pred,
                terms=terms,
            )
            objective = forward.loss
        scaled = model.optimizer.scale_loss(objective)
    gradients = _keras.gradients(tape, scaled, model.trainable_weights)
    if fold:
        # Zeroed for a replica without examples as they are summed.
        return divide_after_sum(y_pred, summed, gradients, batch_size, before_sum)
    if not sum_gradients:
        return forward._replace(gradients=zero_if_padded(gradients, batch_size))
    riders = before_sum(forward) if before_sum else None
    # The count's all-reduce first: collectives must run in one order on
    # every replica.
    with tf.control_dependencies([forward.shares.global_batch_size]):
        gradients, _ = sum_across_replicas(
            gradients, riders=riders, examples=batch_size
        )
    return forward._replace(gradients=gradients)


def zero_if_padded(
    gradients: list[Gradient | None], batch_size: tf.Tensor
) -> list[Gradient | None]:
    """Zeros for the gradients of a replica padded with a placeholder
    example (`batch_size` 0).

    Its loss is zero, but the backward pass can still make NaN from the
    placeholder (a fully masked example's average divides 0 by 0, and
    0 / 0 stays NaN), which the sum across replicas would spread.
    """
    if num_replicas() == 1:
        return gradients
    return [only_if_real(g, batch_size) for g in gradients]


def divide_after_sum(
    y_pred: Any,
    summed: tuple[tf.Tensor, list[tf.Tensor]],
    gradients: Sequence[Gradient | None],
    batch_size: tf.Tensor,
    before_sum: Callable[[Pass], SummedTogether | None] | None = None,
) -> Pass:
    """The `Pass` of `y_pred` from `loss x examples` parts `summed`.

    The gradients and this replica's number of examples are summed in one
    all-reduce; every part is a sum over examples, so one division by the
    global count gives one device's mean, and its gradient. `before_sum`
    is as `exact_gradients`'s: its `Pass` has no global count.
    """
    total, per_output = summed
    local_batch = tf.cast(batch_size, total.dtype)
    riders = None
    if before_sum is not None:
        local = loss_module.LossShares(None, [], None, local_batch)
        riders = before_sum(Pass(y_pred, None, total, local))
    gradients, (global_batch,) = sum_across_replicas(
        gradients,
        [local_batch],
        riders=riders,
        over_first_count=True,
        examples=batch_size,
    )
    mean = tf.math.divide_no_nan(total, global_batch)
    shares = loss_module.LossShares(
        total=mean,
        per_output=[
            mean if part is total else tf.math.divide_no_nan(part, global_batch)
            for part in per_output
        ],
        global_batch_size=global_batch,
        local_batch_size=local_batch,
    )
    return Pass(y_pred, shares.total, total, shares, gradients)


def default_loss_share(
    model: keras.Model,
    y: Any,
    y_pred: Any,
    sample_weight: Any,
    batch_size: tf.Tensor,
    global_batch: tf.Tensor | None = None,
    terms: loss_module.LossTerms | None = None,
) -> tuple[tf.Tensor, loss_module.LossShares]:
    """Returns `(share of compiled loss + model.losses, LossShares)`, from
    the compiled loss's `terms` when the caller has them."""
    # Read layer losses right after the forward pass: replica threads share
    # the layers, and the all-reduce below is a sync point.
    compile_loss = _keras.compile_loss(model)
    dtype = compile_loss.dtype if compile_loss is not None else None
    losses = model.losses
    if compile_loss is None:
        if not model.losses:
            raise ValueError(
                "No loss to compute. Expected a `loss` argument in "
                "`compile()` or losses added with `add_loss`. Received: "
                "loss=None. Call e.g. `model.compile(optimizer, loss=...)`."
            )
        dtype = keras.config.floatx()
        shares = loss_module.count_only_shares(batch_size, dtype)
    else:
        if terms is None:
            terms = _terms(model, compile_loss, y, y_pred, sample_weight, batch_size)
        shares = loss_module.compiled_loss_shares(terms, batch_size, global_batch)
    # Not `None`: `compiled_loss_shares` and `count_only_shares` set it.
    total = cast(tf.Tensor, shares.total)
    if not losses:
        return total, shares
    regularization = regularization_share(
        losses, shares.local_batch_size, shares.global_batch_size
    )
    return total + regularization, shares


def regularization_share(
    losses: Sequence[tf.Tensor],
    local_batch: tf.Tensor,
    global_batch: tf.Tensor | float | None = None,
    valued_as_global: bool = False,
) -> tf.Tensor:
    """This replica's share of `losses` (its `model.losses`), counted once
    per example of the global batch: `1/R` of it when the batch splits
    evenly, 0 on a replica without examples.

    A loss `add_loss` computes from the replica's own examples then counts
    as one device's too. `global_batch` is the global number of examples
    when the caller has it (else all-reduced here); `valued_as_global`
    values the share as the sum of every replica's."""
    regularization = loss_module.regularization_total(losses, local_batch.dtype)
    (share,), _ = global_shares(
        [regularization * local_batch],
        [local_batch],
        global_counts=None if global_batch is None else [global_batch],
        valued_as_global=valued_as_global,
    )
    return share


def with_layer_losses(
    compiled: tf.Tensor | None, losses: Sequence[tf.Tensor], batch_size: tf.Tensor
) -> tf.Tensor | None:
    """`compiled` plus `losses` (this replica's `model.losses`) once per
    global batch: valued as one device's sum, differentiable as this
    replica's share.

    Keras's `compute_loss` adds every layer loss whole on each replica, and
    the replicas' gradients are summed: a weight regularizer would count R
    times. Each replica takes the share of its examples instead (`0` for a
    replica without any), so a loss that `add_loss` computes from the
    replica's own examples counts as one device's too. One collective,
    after `compiled`'s (collectives run in one order on every replica).

    Args:
        compiled: The compiled loss, valued as the global batch's, or `None`.
        losses: This replica's `model.losses`, read before any collective.
        batch_size: This replica's number of real examples.
    """
    if not losses:
        return compiled
    dtype = compiled.dtype if compiled is not None else keras.config.floatx()
    local = tf.cast(batch_size, dtype)
    after = [compiled] if compiled is not None else []
    with tf.control_dependencies(after):
        total = regularization_share(losses, local, valued_as_global=True)
    return total if compiled is None else compiled + total


class CompiledPass:
    """Each replica's forward (and, when training, backward) pass under XLA.

    Called from every replica's thread. Whether the loss can do without a
    count all-reduce inside the pass is decided once, when the pass is
    traced (`LossTerms`); if it cannot, the pass turns off for every replica
    and warns once, and the caller runs the eager exact step.
    """

    def __init__(self, model: keras.Model, training: bool) -> None:
        self._model = model
        self._training = training
        self._function = tf.function(self._run, jit_compile=True, reduce_retracing=True)
        self._lock = threading.Lock()
        self.usable = True

    # Python decisions only, nothing for AutoGraph to convert (converted, it
    # once called `_turn_off` with `_loss_fits`'s arguments in a long run).
    @not_converted
    def __call__(self, data: Any, batch_size: tf.Tensor) -> Pass | None:
        """Returns the `Pass`, with the gradients summed across replicas, or
        `None` when the caller must run the eager step."""
        if not self.usable:
            return None
        model = self._model
        fold = self._training and not isinstance(
            model.optimizer, keras.optimizers.LossScaleOptimizer
        )
        global_batch = None
        if not fold:
            dtype = _keras.compile_loss(model).dtype
            _, (global_batch,) = global_shares([], [tf.cast(batch_size, dtype)])
        if not self._loss_fits(data, batch_size, global_batch):
            self._turn_off()
            return None
        if fold:
            y_pred, total, per_output, gradients, _ = self._function(
                data, batch_size, None
            )
            summed = (total, per_output)
            return divide_after_sum(y_pred, summed, gradients, batch_size)
        with tf.control_dependencies([global_batch]):
            y_pred, loss, shares, gradients, _ = self._function(
                data, batch_size, global_batch
            )
            gradients, _ = sum_across_replicas(gradients)
        return _pass(y_pred, loss, shares, gradients)

    def _loss_fits(self, *args: Any) -> bool:
        """Whether the loss fits the pass for `args`: what its trace (which
        runs nothing) returned as a constant."""
        concrete = self._function.get_concrete_function(*args)
        return bool(tf.get_static_value(concrete.structured_outputs[-1]))

    def tracing_count(self) -> int:
        """How many times XLA traced the pass (0 until a step ran it)."""
        count: int = self._function.experimental_get_tracing_count()
        return count

    def _turn_off(self) -> None:
        with self._lock:
            if not self.usable:
                return
            self.usable = False
        warnings.warn(
            "`jit_compile=True` under a multi-replica strategy compiles each "
            "replica's pass only when every loss divides by a fixed count per "
            "example. This model's loss uses masks or sample-weight sums, so "
            "its steps run without XLA (still exact).",
            stacklevel=3,
        )

    def _run(
        self, data: Any, batch_size: tf.Tensor, global_batch: tf.Tensor | None
    ) -> tuple[
        Any,
        tf.Tensor,
        list[tf.Tensor] | loss_module.LossShares,
        list[Gradient | None],
        bool,
    ]:
        """With `global_batch` None: `(y_pred, loss x examples, per-output
        parts, gradients, fits)`, else `(y_pred, loss share, shares,
        gradients, fits)`. `fits`, whether the loss's counts allow the pass,
        is decided as it is traced: a constant of the traced function."""
        model = self._model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = model(x, training=self._training)
            # The model has a compiled loss (`build._step_function`).
            compile_loss = _keras.compile_loss(model)
            terms = _terms(model, compile_loss, y, y_pred, sample_weight, batch_size)
            fits = terms.foldable if global_batch is None else terms.fixed_counts
            if not fits:
                return y_pred, tf.zeros(()), [], [], False  # traced, never run
            loss, parts = (
                loss_times_examples(model, terms, batch_size)
                if global_batch is None
                else default_loss_share(
                    model, y, y_pred, sample_weight, batch_size, global_batch, terms
                )
            )
            scaled_loss = model.optimizer.scale_loss(loss) if self._training else loss
        gradients = (
            zero_if_padded(
                _keras.gradients(tape, scaled_loss, model.trainable_weights),
                batch_size,
            )
            if self._training
            else []
        )
        return y_pred, loss, parts, gradients, True
