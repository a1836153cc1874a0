"""The one module that reads Keras internals.

Everything else in keras_ctl uses public Keras only. Each accessor says why
no public hook does the job. The supported range is declared in
pyproject.toml (checked on import by `keras_ctl._compat`), and `.ci/compat`
runs the fast tests at both of its ends. When a new Keras minor
comes out, re-read the Keras code each accessor names, then widen the range.

Checked on Keras 3.12.0 and 3.15.1 unless an accessor says otherwise.
"""

import contextlib
import threading
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf
from keras import ops
from keras import tree
from keras.src.backend.tensorflow import nn as _tf_nn
from keras.src.backend.tensorflow.core import Variable as _TFVariable
from keras.src.backend.tensorflow.optimizer import TFOptimizer
from keras.src.losses import loss as _loss_module
from keras.src.models.functional import Functional
from keras.src.models.model import functional_init_arguments
from keras.src.optimizers.base_optimizer import BaseOptimizer as _BaseOptimizer
from keras.src.saving import object_registration
from keras.src.saving.keras_saveable import KerasSaveable as _KerasSaveable

from keras_ctl._engine.iterators import DeferredDataset
from keras_ctl._engine.replicas import all_reduce_sum
from keras_ctl._engine.replicas import num_replicas
from keras_ctl._engine.replicas import sum_across_replicas
from keras_ctl._engine.replicas import valued_as_global

__all__ = [
    "RAN_OUT_OF_DATA",
    "Functional",
    "EmaAfterStep",
    "SymbolicBuildFromFirstReplica",
    "add_metric_update",
    "add_to_mean",
    "all_layers",
    "build_from_spec",
    "compile_loss",
    "compile_loss_terms",
    "compile_metrics",
    "count_micro_batch",
    "count_only_real_examples",
    "end_epoch_early",
    "functional_init_arguments",
    "gradients",
    "gradients_already_summed",
    "initial_epoch",
    "install_sharded_reads",
    "keras_accumulators",
    "loss_tracker",
    "micro_batch_iterations",
    "one_copy_of_each_variable",
    "one_update_of_accumulated_steps",
    "pack_like_compile_loss",
    "per_output_loss_trackers",
    "reduce_as_saved_model",
    "register_under_name",
    "replica_step",
    "set_initial_epoch",
    "user_compute_loss",
    "user_loss",
    "without_strategy",
]


def compile_loss(model):
    """The model's `CompileLoss` built by `compile(loss=...)`, or `None`.

    Keras exposes only `model.compute_loss`, which reduces each output on its
    replica; the exact step needs the per-output losses, their paths, weights
    and names to divide each by a global count (`Trainer._compile_loss`).
    """
    return model._compile_loss


def compile_loss_terms(compile_loss):
    """`[(path, loss_fn, loss_weight, name)]`, one per output with a loss.

    `CompileLoss._flat_losses`, filled when the loss is built (see
    `pack_like_compile_loss`): a namedtuple `Loss(path, loss, loss_weights,
    name)` per output, read by position.
    """
    return [tuple(term) for term in compile_loss._flat_losses]


def user_loss(compile_loss):
    """The `loss` given to `compile()`, as given (`CompileLoss._user_loss`):
    where it is `None` for an output, that output has no label."""
    return compile_loss._user_loss


def pack_like_compile_loss(compile_loss, y_true, y_pred):
    """Builds `compile_loss` on first use and packs `y_true`/`y_pred` like it.

    Mirrors the structure handling at the top of `CompileLoss.call`, which is
    not a separate public function (`_y_pred_build_structure`,
    `_y_true_build_structure`).
    """
    if not compile_loss.built:
        compile_loss.build(y_true, y_pred)

    def pack(structure, values):
        try:
            tree.assert_same_structure(structure, values)
            return values
        except (ValueError, TypeError):
            return tree.pack_sequence_as(structure, tree.flatten(values))

    return (
        pack(compile_loss._y_true_build_structure, y_true),
        pack(compile_loss._y_pred_build_structure, y_pred),
    )


def per_output_loss_trackers(compile_loss):
    """The `Mean` of each output's loss (`<output>_loss` in the logs), in the
    order of `compile_loss_terms`: `CompileLoss.metrics`."""
    return compile_loss.metrics


def loss_tracker(model):
    """The `Mean` behind the logged `loss` (`Trainer._loss_tracker`).

    Keras creates it in `compile()` and lists it first in `model.metrics`,
    but has no public name for it.
    """
    return model._loss_tracker


def add_to_mean(tracker, total, count):
    """Adds to a `keras.metrics.Mean`'s running `total` and `count`.

    `Mean.update_state` divides nothing but takes one value per example; the
    exact step adds a share of a global value with a weight of its own.
    `total`/`count` are Mean's variables (not underscored, not documented).
    """
    _add(tracker.total, _as_dtype(total, tracker.dtype))
    _add(tracker.count, _as_dtype(count, tracker.dtype))


def _as_dtype(value, dtype):
    # `tf.cast` of a Python float makes a float32 constant first: 1/3 would
    # be rounded to float32 in a float64 tracker.
    if tf.is_tensor(value):
        return tf.cast(value, dtype)
    return tf.constant(value, dtype)


def _add(variable, value):
    # Keras's `Variable.assign_add` is `assign(self + value)`: under a
    # strategy that sums every replica's assignment into one copy
    # (CentralStorageStrategy), that adds the variable R times. The
    # TensorFlow variable underneath (`Variable.value`) adds `value` once.
    variable.value.assign_add(value)


def one_copy_of_each_variable(strategy):
    """Whether `strategy` keeps one copy of each variable, which replica
    updates reach through `merge_call` (`CentralStorageStrategy`)."""
    return isinstance(strategy, tf.distribute.experimental.CentralStorageStrategy)


def compile_metrics(model):
    """The `CompileMetrics` built by `compile(metrics=...)`, or `None`
    (`Trainer._compile_metrics`)."""
    return model._compile_metrics


def add_metric_update(metric, *args):
    """Adds `metric`'s update on this replica's data to its variables.

    `stateless_update_state` gives the updated state without assigning it;
    its difference from the current state is added with `_add`, which
    stays right where Keras's `assign_add` counts a variable R times.
    """
    current = [variable.value for variable in metric.variables]
    updated = metric.stateless_update_state(current, *args)
    for variable, old, new in zip(metric.variables, current, updated):
        _add(variable, new - old)


def all_layers(model):
    """Every layer inside `model`, nested ones too (`Layer._flatten_layers`,
    Keras 3.12-3.15: no public accessor walks a subclassed model's
    attributes)."""
    return list(model._flatten_layers(include_self=False, recursive=True))


def user_compute_loss(model, x, y, y_pred, sample_weight, training):
    """Calls a subclass's `compute_loss`, with `training` when it takes it.

    `Trainer._compute_loss`: the compatibility wrapper Keras's own steps use
    for overrides written before Keras 3.3 added `training`.
    """
    return model._compute_loss(x, y, y_pred, sample_weight, training=training)


class SymbolicBuildFromFirstReplica:
    """A `keras.Model` mixin: build from the data's shapes, reading nothing.

    `fit()`, `evaluate()` and `predict()` call the TensorFlow trainer's
    `_maybe_symbolic_build` before the first step. Keras builds from
    `strategy.reduce("MEAN", first_batch)`, which fails for uneven
    per-replica batches and under MultiWorkerMirroredStrategy
    (keras-team/keras#20585). Shapes and dtypes are all
    `Trainer._symbolic_build` needs (it makes `KerasTensor`s of them), so it
    gets the element spec of the epoch iterator's dataset
    (`EpochIterator.data_adapter.get_tf_dataset()`): no batch is read, so a
    Python generator loses none (a read batch, and the iterator's prefetch,
    would be lost) and no multi-device iterator is opened (about 0.2 s on
    CPU). Data whose spec is unknown gives the first replica's part of its
    first batch instead. There is no public hook before the first step.
    """

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None or not _callable_model(self):
            # Keras builds when the step is traced (a model without `call`,
            # like the keras.io guide's GAN, can only be built so).
            return
        strategy = self.distribute_strategy
        epoch_iterator = iterator
        if iterator is not None and data_batch is None:
            data_batch = _batch_spec(iterator)
            if data_batch is None:
                iterator = _first_replica_batches(iterator, strategy)
            else:
                iterator = None
        with strategy.scope():
            try:
                self._symbolic_build(iterator=iterator, data_batch=data_batch)
            except StopIteration:
                raise ValueError(
                    "Expected the data to hold at least one batch: the model "
                    "is built from the first one. Received: data without any "
                    "batch (an empty array or dataset, or `steps` past its "
                    "end). Pass data with examples, or build the model first."
                ) from None
        if epoch_iterator is not None:
            _defer_iterators(epoch_iterator)


def _callable_model(model):
    """Whether `model` defines a forward pass (`call`, or a functional graph)."""
    return isinstance(model, Functional) or type(model).call is not keras.Model.call


def _batch_spec(epoch_iterator):
    """The `tf.TensorSpec` nest of one batch, or `None` when unknown."""
    adapter = getattr(epoch_iterator, "data_adapter", None)
    try:
        dataset = adapter.get_tf_dataset()
    except Exception:  # an adapter without a tf.data form
        return None
    if not isinstance(dataset, tf.data.Dataset):
        return None  # e.g. a dataset the user distributed already
    return dataset.element_spec


def _defer_iterators(epoch_iterator):
    """Makes Keras's epoch iterator open each distributed iterator on first
    use (`TFEpochIterator._distributed_dataset`, returned by its
    `_get_iterator`, is what it calls `iter()` on, one epoch ahead).
    """
    dataset = getattr(epoch_iterator, "_distributed_dataset", None)
    if dataset is not None and not isinstance(dataset, DeferredDataset):
        epoch_iterator._distributed_dataset = DeferredDataset(dataset)


def _first_replica_batches(epoch_iterator, strategy):
    """`epoch_iterator`'s steps, each batch cut to the first replica's part.

    A generator: nothing is read until Keras asks for a batch.
    """
    for begin, end, batches in epoch_iterator:
        yield begin, end, (strategy.experimental_local_results(b)[0] for b in batches)


def build_from_spec(model, element_spec):
    """Builds `model` (under its strategy) from the shapes of a batch, as
    `fit()` does before its first step (`_maybe_symbolic_build`)."""
    model._maybe_symbolic_build(data_batch=element_spec)


@contextlib.contextmanager
def without_strategy(model):
    """Within it, `model.distribute_strategy` is the current (default) one:
    the strategy the model was created under (`Trainer._distribute_strategy`)
    is set aside."""
    strategy = model._distribute_strategy
    model._distribute_strategy = None
    try:
        yield
    finally:
        model._distribute_strategy = strategy


def initial_epoch(model):
    """The epoch the next `fit()` starts at, when a restored backup set one
    (`Trainer._initial_epoch`), else `None`."""
    return getattr(model, "_initial_epoch", None)


def set_initial_epoch(model, epoch):
    """Makes the next `fit()` start at `epoch` (what Keras's own
    `BackupAndRestore` sets on restore: `Trainer._initial_epoch`)."""
    model._initial_epoch = epoch


def end_epoch_early():
    """Ends the current epoch from inside the train function.

    Keras's epoch loop ends an epoch when the train function raises
    `StopIteration` (`EpochIterator.catch_stop_iteration`), and warns "Your
    input ran out of data". There is no public way to end one epoch.
    """
    raise StopIteration


# The warning Keras gives when `end_epoch_early` ends an epoch
# (`EpochIterator._interrupted_warning`), for a filter that hides it when the
# epoch is cut short on purpose.
RAN_OUT_OF_DATA = "Your input ran out of data"


def reduce_as_saved_model(model):
    """`model.__reduce__()` for pickle, naming a loader pickle can import.

    Keras pickles a model as a saved file plus `type(model)._unpickle_model`
    (`KerasSaveable.__reduce__`), which pickle finds through the class's
    module and name; a class made at run time has none that leads back to
    it. The loader ignores its class (it loads the file), so `keras.Model`'s
    is the same function under an importable name.
    """
    _, arguments = _KerasSaveable.__reduce__(model)
    return keras.Model._unpickle_model, arguments


def register_under_name(cls, name):
    """Saves instances of `cls` under the registered `name` of another class.

    `object_registration.GLOBAL_CUSTOM_NAMES`: `register_keras_serializable`
    would also register `cls` as the object to load for `name`.
    """
    object_registration.GLOBAL_CUSTOM_NAMES[cls] = name


_SUMMED_MARK = "_keras_ctl_gradients_summed"
_EMA_DEFERRED = "_keras_ctl_ema_deferred"
_patch_lock = threading.Lock()


@contextlib.contextmanager
def gradients_already_summed(optimizer):
    """Within it, `optimizer` applies gradients as given, without summing them
    across replicas first.

    Keras sums each replica's gradients inside `optimizer.apply`, after
    clipping them (`TFOptimizer._all_reduce_sum_gradients`, called from
    `_backend_update_step`), and has no public switch to skip it (Keras 3
    dropped `skip_gradients_aggregation`). The exact step sums them itself,
    so that clipping and the loss-scale check see the sum, and so that the
    global count rides along in the same collective. The mark is counted per
    optimizer (a `LossScaleOptimizer`'s or `MultiOptimizer`'s inner
    optimizers included), not per thread: Keras applies a loss-scaled update
    from threads of its own.

    Keras also updates the EMA of the model's variables inside `apply`, and
    every `ema_overwrite_frequency` steps overwrites them with it, in a
    `tf.cond` around a cross-replica update: that fails inside a replica
    step's control flow (a `merge_call`), and one-copy variables
    (`CentralStorageStrategy`) refuse an assignment in replica context.
    Within it `apply` leaves the EMA out (`use_ema` reads `False` while any
    replica applies); `EmaAfterStep` does it after the replicas' step.
    """
    _install_summed_gradients_switch()
    family = _optimizer_family(optimizer)
    for member in family:
        applying = getattr(member, _SUMMED_MARK, 0)
        if not applying and getattr(member, "use_ema", False):
            setattr(member, _EMA_DEFERRED, True)
            member.use_ema = False
        setattr(member, _SUMMED_MARK, applying + 1)
    # This thread's own record: replica threads share the optimizer, and
    # one replica may enter its next `apply` while another is still inside
    # this one (a GAN's discriminator steps).
    outer = getattr(_in_step, "summed", frozenset())
    _in_step.summed = outer | {id(member) for member in family}
    try:
        yield
    finally:
        _in_step.summed = outer
        for member in family:
            applying = getattr(member, _SUMMED_MARK) - 1
            setattr(member, _SUMMED_MARK, applying)
            if not applying and getattr(member, _EMA_DEFERRED, False):
                member.use_ema = True


class EmaAfterStep:
    """The EMA updates that `apply` left out (see `gradients_already_summed`),
    in cross-replica context after the replicas' step.

    Create it before the step (it reads each optimizer's `iterations`), call
    `update()` after. The arithmetic is Keras's (`BaseOptimizer.
    _update_model_variables_moving_average`, which reads `iterations` before
    `apply` counts the step: the first step copies the variables), and the
    overwrite Keras's own (`TFOptimizer.
    _overwrite_model_variables_with_average_value`, when `iterations` is a
    multiple of `ema_overwrite_frequency`). Checked on Keras 3.12.0 and
    3.15.1. A step that did not apply (a loss scale's overflow) changes
    nothing.
    """

    def __init__(self, optimizers):
        self.members = [
            member
            for optimizer in optimizers
            for member in _optimizer_family(optimizer)
            if getattr(member, "use_ema", False)
        ]
        self.before = [tf.identity(member.iterations) for member in self.members]

    def update(self):
        for member, before in zip(self.members, self.before):
            if vars(member).pop(_EMA_DEFERRED, False):
                applied = tf.not_equal(member.iterations, before)
                tf.cond(applied, lambda m=member, b=before: _ema(m, b), _nothing)


def _ema(optimizer, iterations_before):
    variables = optimizer._trainable_variables
    for variable, average in zip(variables, optimizer._model_variables_moving_average):
        if average is None:
            continue
        momentum = tf.cast(tf.not_equal(iterations_before, 0), variable.dtype)
        momentum = momentum * optimizer.ema_momentum
        average.assign(momentum * average + (1 - momentum) * variable)
    frequency = optimizer.ema_overwrite_frequency
    if frequency:

        def overwrite():
            optimizer._overwrite_model_variables_with_average_value(variables)
            return tf.constant(True)

        due = tf.equal(optimizer.iterations % frequency, 0)
        tf.cond(due, overwrite, _nothing)
    return tf.constant(True)


def _nothing():
    return tf.constant(False)


def _optimizer_family(optimizer):
    family = [optimizer]
    inner = getattr(optimizer, "inner_optimizer", None)  # LossScaleOptimizer
    if inner is not None:
        family += _optimizer_family(inner)
    if type(optimizer).__name__ == "MultiOptimizer":  # Keras >= 3.15
        for member in optimizer.optimizers:
            family += _optimizer_family(member)
    return family


def _install_summed_gradients_switch():
    def replacement(original):
        def all_reduce_sum_gradients(self, grads_and_vars):
            if getattr(self, _SUMMED_MARK, 0):
                return list(grads_and_vars)
            return original(self, grads_and_vars)

        return all_reduce_sum_gradients

    _patch_once(TFOptimizer, "_all_reduce_sum_gradients", replacement)


def _patch_once(owner, name, replacement):
    """Replaces `owner.name` by `replacement(original)`, once per process.

    Each replacement does what the original does unless keras_ctl's step
    asked otherwise (a mark on the optimizer, a flag of the thread).
    """
    with _patch_lock:
        original = getattr(owner, name)
        if getattr(original, "_keras_ctl", False):
            return
        patched = replacement(original)
        patched._keras_ctl = True
        setattr(owner, name, patched)


_in_step = threading.local()


@contextlib.contextmanager
def replica_step():
    """Within it (in this thread), Keras code called by a replica step is
    exact across replicas: `Loss` objects (`_install_exact_reduction`),
    synchronized BatchNorm (`_install_exact_sync_moments`),
    layers on a replica without examples
    (`_install_layers_of_empty_batches`), `optimizer.apply`
    (`_install_summing_apply`) and variables that
    workers share (`_install_atomic_updates`) or that are sharded across
    parameter servers (`_install_sharded_updates`)."""
    _install_exact_reduction()
    _install_exact_sync_moments()
    _install_layers_of_empty_batches()
    _install_summing_apply()
    _install_atomic_updates()
    _install_sharded_updates()
    previous = vars(_in_step).copy()
    _in_step.active = True
    _in_step.real_examples = None
    try:
        yield
    finally:
        vars(_in_step).clear()
        vars(_in_step).update(previous)


def count_only_real_examples(batch_size):
    """Tells synchronized BatchNorm in this replica step that only the first
    `batch_size` examples are real (the rest is a placeholder)."""
    _in_step.real_examples = batch_size


class LossParts(NamedTuple):
    """One `Loss` call on this replica's examples, as Keras reduces it.

    Attributes:
        total: The weighted sum Keras's reduction divides (differentiable).
        count: Its denominator on this replica, or `None` when Keras does
            not divide (`reduction="sum"`).
        per_example: The denominator's share of one example when it is a
            fixed number (no mask, not a weight sum), else `None`.
    """

    total: tf.Tensor
    count: object
    per_example: object


_MEAN_REDUCTIONS = ("mean", "sum_over_batch_size", "mean_with_sample_weight")


def loss_parts(loss, y_true, y_pred, sample_weight=None):
    """Calls `loss(y_true, y_pred, sample_weight)` and returns its
    `LossParts` on this replica, or `None` for `reduction=None`.

    Keras's `Loss.__call__` casts, calls, combines masks with the sample
    weights and divides (`losses.loss.reduce_weighted_values`); the exact
    step needs the sum and the denominator apart, to divide by the global
    denominator. Both come from Keras's own reduction, called with
    `reduction="sum"`: the sum on the loss values, the denominator on ones
    shaped like them (with the sample weights only where Keras divides by
    their sum). Masks, `ignore_class`, sample weights and dtypes therefore
    mean what they mean in Keras. A loss that returns one value for the
    batch is taken as that value for each example of this replica.
    """
    _install_exact_reduction()
    examples = tf.shape(tree.flatten(y_pred)[0])[0]
    previous = getattr(_in_step, "capture", None)
    _in_step.capture = {"examples": examples}
    try:
        loss(y_true, y_pred, sample_weight)
        return _in_step.capture.get("parts")
    finally:
        _in_step.capture = previous


def _parts_of(original, values, sample_weight, mask, reduction, dtype, examples):
    """`LossParts` of Keras's reduction of `values` (see `loss_parts`)."""
    values = ops.convert_to_tensor(values, dtype=dtype)
    if values.shape.rank == 0:
        if reduction == "sum":
            raise ValueError(
                "The loss returned one value for the whole batch, with "
                "reduction='sum': a sum over examples cannot be recovered "
                "from it. Return one value per example, or use a mean "
                'reduction such as "sum_over_batch_size".'
            )
        if sample_weight is not None and num_replicas() > 1:
            raise ValueError(
                "The loss returned one value for the whole batch, weighted by "
                "sample or class weights: under several replicas that value "
                "is each replica's own, and no per-example weighting of it "
                "adds up to one device's. Return one value per example from "
                "the loss's `call()` (Keras then weighs each example), or "
                "train without `sample_weight`/`class_weight`."
            )
        values = tf.fill([examples], values)
    total = original(values, sample_weight, mask, "sum", dtype)
    if reduction == "sum":
        return LossParts(total, None, None)
    weights = sample_weight if reduction == "mean_with_sample_weight" else None
    count = original(tf.ones_like(values), weights, mask, "sum", dtype)
    per_example = None
    if mask is None and weights is None:
        per_example = values.shape[1:].num_elements()
    return LossParts(total, count, per_example)


def _zero_unless(condition, value):
    if value is None:
        return None
    return tf.where(condition, value, tf.zeros_like(value))


def _install_exact_reduction():
    """Keras's loss reduction, exact across replicas inside our steps.

    `Loss.__call__` ends with `losses.loss.reduce_weighted_values`, which
    divides this replica's weighted sum by this replica's count and then by
    the replica count (`scale_loss_for_distribution`): a mean of
    per-replica means, which drifts when replicas hold different numbers of
    examples (or masked entries), and a step written the keras.io way
    (`loss = self.loss_fn(y, y_pred)`, `tracker.update_state(loss)`) logs
    1/R of it. Replaced, in two cases:

    - inside `loss_parts`, it records the sum and count of the outermost
      call (a loss that calls other losses reduces those locally, as Keras
      does on one replica);
    - in a replica step under several replicas, it all-reduces the sum and
      count together (one collective) and returns the global batch's loss,
      differentiable as this replica's share (the sum over the global
      count): the replicas' gradients sum to one device's.

    Elsewhere, and for `reduction=None`, it is Keras's. Checked on Keras
    3.12.0 and 3.15.1.
    """

    def replacement(original):
        def reduce_weighted_values(
            values,
            sample_weight=None,
            mask=None,
            reduction="sum_over_batch_size",
            dtype=None,
        ):
            reduction = _loss_module.standardize_reduction(reduction)
            capture = getattr(_in_step, "capture", None)
            exact = (
                getattr(_in_step, "active", False)
                and num_replicas() > 1
                and tf.distribute.get_replica_context() is not None
            )
            if reduction not in (*_MEAN_REDUCTIONS, "sum") or not (
                capture is not None or exact
            ):
                return original(values, sample_weight, mask, reduction, dtype)
            examples = capture["examples"] if capture else None
            if capture is None and ops.convert_to_tensor(values).shape.rank == 0:
                return original(values, sample_weight, mask, reduction, dtype)
            parts = _parts_of(
                original, values, sample_weight, mask, reduction, dtype, examples
            )
            if capture is not None:
                # The outermost call reduces last: its parts are kept. A
                # loss called inside it reduces as Keras does, locally.
                capture["parts"] = parts
                return original(values, sample_weight, mask, reduction, dtype)
            real = getattr(_in_step, "real_examples", None)
            if real is not None:
                # A replica padded with a placeholder example (see
                # `count_only_real_examples`) adds nothing, count included.
                parts = parts._replace(
                    total=_zero_unless(real > 0, parts.total),
                    count=_zero_unless(real > 0, parts.count),
                )
            if parts.count is None:
                return valued_as_global(parts.total)
            total, count = tf.unstack(
                all_reduce_sum(tf.stack([tf.stop_gradient(parts.total), parts.count]))
            )
            share = tf.math.divide_no_nan(parts.total, count)
            return valued_as_global(share, total=tf.math.divide_no_nan(total, count))

        return reduce_weighted_values

    _patch_once(_loss_module, "reduce_weighted_values", replacement)


def _install_exact_sync_moments():
    """`BatchNormalization(synchronized=True)` counts only real examples,
    in one collective.

    Keras's `_compute_moments_sync` (TensorFlow backend) all-reduces each
    replica's sum, sum of squares and count, in three collectives, counting
    every row of the batch: a replica's placeholder example (see
    `count_only_real_examples`) would enter the moments. Here the
    placeholder is left out and the three sums travel in one all-reduce.
    Checked on Keras 3.12.0 and 3.15.1.
    """

    def replacement(original):
        def compute_moments_sync(x, axes, keepdims):
            real = getattr(_in_step, "real_examples", None)
            if (
                not getattr(_in_step, "active", False)
                or tf.distribute.get_replica_context() is None
            ):
                return original(x, axes, keepdims)
            if real is not None and 0 in axes:
                x = x[:real]
            local_sum = tf.reduce_sum(x, axis=axes, keepdims=True)
            local_squares = tf.reduce_sum(tf.square(x), axis=axes, keepdims=True)
            local_count = tf.reduce_sum(tf.ones_like(x), axis=axes, keepdims=True)
            total, squares, count = tf.unstack(
                all_reduce_sum(tf.stack([local_sum, local_squares, local_count]))
            )
            mean = tf.math.divide_no_nan(total, count)
            variance = tf.maximum(
                tf.math.divide_no_nan(squares, count) - tf.square(mean), 0.0
            )
            if not keepdims:
                mean = tf.squeeze(mean, axes)
                variance = tf.squeeze(variance, axes)
            return mean, variance

        return compute_moments_sync

    _patch_once(_tf_nn, "_compute_moments_sync", replacement)


def _install_layers_of_empty_batches():
    """A layer called by a step of one's own on a replica without examples
    computes on one placeholder example of zeros, whose row it drops from
    its outputs: the caller gets the empty batch's outputs.

    The last global batch can leave a replica without examples, and a step
    of one's own gets that empty batch as it is. Many kernels fail on it or
    give it a wrong shape: TensorFlow's oneDNN CPU convolutions (wrong
    output channels, a failing gradient), `tf.pad(mode="REFLECT")`, Keras's
    LSTM cell (an `ops.add` taken for a bias). Only the outermost layer
    call pads (layers inside it see the placeholder); synchronized
    BatchNorm leaves the placeholder out (`real_examples`), and losses,
    metrics and gradients computed from the outputs see no example.
    The default steps pad their data themselves and are left alone.
    Patches `Layer.__call__` (checked on Keras 3.12.0 and 3.15.1).
    """

    def replacement(original):
        def call(self, *args, **kwargs):
            if (
                not getattr(_in_step, "active", False)
                or getattr(_in_step, "real_examples", None) is not None
                or num_replicas() == 1
            ):
                return original(self, *args, **kwargs)
            leaves = [t for t in tree.flatten((args, kwargs)) if _may_be_empty(t)]
            if not leaves:
                return original(self, *args, **kwargs)
            rows = tf.shape(leaves[0])[0]
            missing = tf.cast(tf.equal(rows, 0), tf.int32)
            args, kwargs = tree.map_structure(
                lambda t: _with_rows(t, missing) if _may_be_empty(t) else t,
                (args, kwargs),
            )
            _in_step.real_examples = rows
            try:
                outputs = original(self, *args, **kwargs)
            finally:
                _in_step.real_examples = None
            return tree.map_structure(lambda t: _without_rows(t, missing), outputs)

        return call

    _patch_once(keras.Layer, "__call__", replacement)


def _may_be_empty(value):
    """A tensor whose leading (batch) dimension may be 0: unknown in a
    trace, 0 when run eagerly (a GAN's first step)."""
    return tf.is_tensor(value) and value.shape.rank and value.shape[0] in (None, 0)


def _with_rows(tensor, missing):
    zeros = tf.zeros(tf.concat([[missing], tf.shape(tensor)[1:]], 0), tensor.dtype)
    return tf.concat([tensor, zeros], axis=0)


def _without_rows(tensor, missing):
    """`tensor` without the placeholder's row, when it has the batch's rows
    (a traced batch dimension; run eagerly, the placeholder's one row)."""
    if not (tf.is_tensor(tensor) and tensor.shape.rank):
        return tensor
    if tensor.shape[0] is not None and not (
        tf.executing_eagerly() and int(missing) == 1 and tensor.shape[0] == 1
    ):
        return tensor
    kept = tensor[: tf.shape(tensor)[0] - missing]
    mask = getattr(tensor, "_keras_mask", None)
    if mask is not None:
        kept._keras_mask = mask[: tf.shape(mask)[0] - missing]
    return kept


def micro_batch_iterations(optimizer):
    """The steps an optimizer with `gradient_accumulation_steps` has seen
    (`BaseOptimizer._iterations`; its public `iterations` counts updates)."""
    return optimizer._iterations


def keras_accumulators(optimizer):
    """Keras's accumulator of each variable (`BaseOptimizer.
    _accumulated_gradients`, created by `build()` when the optimizer has
    `gradient_accumulation_steps`)."""
    return optimizer._accumulated_gradients


def count_micro_batch(optimizer):
    """Counts a step that only accumulated, as Keras's `apply` does."""
    optimizer._iterations.assign_add(1)


@contextlib.contextmanager
def one_update_of_accumulated_steps(optimizer):
    """Within it (cross-replica context, around the replicas' step),
    `optimizer.apply` makes the update Keras's `apply` makes on every
    `gradient_accumulation_steps`-th step, with the gradients given (the
    accumulated mean), without Keras's `tf.cond` (`BaseOptimizer.
    _backend_apply_gradients`, replaced on this instance by its branch
    without accumulation: clipping, weight decay, `_backend_update_step`).
    `iterations` still counts updates and `_iterations` steps, as Keras's
    Adam and learning-rate schedules read them. Checked on Keras 3.12.0
    and 3.15.1.
    """

    def apply_once(grads, trainable_variables):
        grads = optimizer._clip_gradients(grads)
        optimizer._apply_weight_decay(trainable_variables)
        optimizer._backend_update_step(
            grads, trainable_variables, optimizer.learning_rate
        )

    optimizer._backend_apply_gradients = apply_once
    try:
        yield
    finally:
        del optimizer._backend_apply_gradients


def _install_summing_apply():
    """`optimizer.apply(grads)` called by a step of one's own sums the
    gradients across replicas first, then applies the sum as it is.

    Keras clips each replica's part of the gradient in `apply`, before its
    all-reduce (`BaseOptimizer.apply`, `LossScaleOptimizer.apply` and
    `MultiOptimizer.apply`, each its own method), and a loss scale decides
    on that part. Here the sum comes first (one collective, where Keras
    made it), so clipping, the loss scale's check and the EMA see one
    device's gradient, as in the default step. Checked on Keras 3.12.0 and 3.15.1.
    """
    classes = [_BaseOptimizer, keras.optimizers.LossScaleOptimizer]
    if hasattr(keras.optimizers, "MultiOptimizer"):  # Keras >= 3.15
        classes.append(keras.optimizers.MultiOptimizer)

    def replacement(original):
        def apply(self, grads, trainable_variables=None):
            if (
                not getattr(_in_step, "active", False)
                or id(self) in getattr(_in_step, "summed", ())
                or num_replicas() == 1
                or tf.distribute.get_replica_context() is None
            ):
                return original(self, grads, trainable_variables)
            summed, _ = sum_across_replicas(list(grads))
            with gradients_already_summed(self):
                return original(self, summed, trainable_variables)

        return apply

    for cls in classes:
        _patch_once(cls, "apply", replacement)


def _install_atomic_updates():
    """Under `ParameterServerStrategy`, `variable.assign_add(v)` and
    `assign_sub(v)` in a step are one atomic update on the parameter server.

    Keras implements them as `assign(self + v)` (`KerasVariable`): two
    workers that read the same value both write their own sum, and one
    update is lost (seen: 8 of 10 steps counted in `optimizer.iterations`,
    metrics short of examples). TensorFlow's own `assign_add` is one op on
    the variable's device. Checked on Keras 3.12.0 and 3.15.1.
    """

    def replacement(original, native):
        def update(self, value):
            if not getattr(_in_step, "active", False) or not isinstance(
                tf.distribute.get_strategy(), tf.distribute.ParameterServerStrategy
            ):
                return original(self, value)
            variable = self.value
            return getattr(variable, native)(tf.cast(value, variable.dtype))

        return update

    for name in ("assign_add", "assign_sub"):
        _patch_once(
            _TFVariable, name, lambda original, n=name: replacement(original, n)
        )


def gradients(tape, target, variables):
    """`tape.gradient(target, variables)`, for variables sharded across
    parameter servers too.

    A Keras variable gives the tape its TensorFlow variable's `handle`
    (`backend.tensorflow.core.Variable.handle`); a variable that a
    `variable_partitioner` split is a `ShardedVariable`, which has none. Its
    gradient is taken with respect to each shard and put back together
    (rows in shard order), so the optimizer updates the whole variable as
    Keras would (`ShardedVariable.assign_sub` and `scatter_sub` split the
    update again). Checked on Keras 3.12.0 and 3.15.1.
    """
    variables = list(variables)
    sources, shards = [], []
    for variable in variables:
        parts = _shards_of(variable)
        shards.append(parts)
        sources.extend(parts if parts else [variable])
    flat = iter(tape.gradient(target, sources))
    result = []
    for variable, parts in zip(variables, shards):
        if not parts:
            result.append(next(flat))
            continue
        result.append(_joined([next(flat) for _ in parts], parts, variable))
    return result


def _shards_of(variable):
    value = getattr(variable, "_value", None)  # a Keras variable's own
    if getattr(value, "is_sharded_variable", False):
        return list(value.variables)
    return []


def _joined(parts, shards, variable):
    """One gradient for a sharded variable from its shards' gradients."""
    if all(g is None for g in parts):
        return None
    parts = [
        tf.zeros_like(shard) if g is None else g for g, shard in zip(parts, shards)
    ]
    if not any(isinstance(g, tf.IndexedSlices) for g in parts):
        return tf.concat(parts, axis=0)
    values, indices, offset = [], [], 0
    for g, shard in zip(parts, shards):
        if isinstance(g, tf.IndexedSlices):
            values.append(g.values)
            indices.append(tf.cast(g.indices, tf.int64) + offset)
        else:
            values.append(g)
            indices.append(tf.range(shard.shape[0], dtype=tf.int64) + offset)
        offset += shard.shape[0]
    shape = tf.constant([int(d) for d in variable.shape], tf.int64)
    return tf.IndexedSlices(tf.concat(values, 0), tf.concat(indices, 0), shape)


def _install_sharded_updates():
    """The optimizer updates a variable sharded across parameter servers.

    `TFOptimizer._distributed_tf_update_step` wraps each update in
    `strategy.extended.update(variable, ...)`, which places it next to the
    variable and fails for a `ShardedVariable` ("doesn't support being used
    as a reference"). Its update runs as is instead: the `ShardedVariable`
    splits `assign_sub`/`scatter_sub` across its shards, each on its own
    server. Checked on Keras 3.12.0 and 3.15.1.
    """

    def replacement(original):
        def update_step(self, distribution, grads_and_vars, learning_rate):
            plain = []
            for grad, variable in grads_and_vars:
                if getattr(variable, "is_sharded_variable", False):
                    self.update_step(grad, variable, learning_rate)
                else:
                    plain.append((grad, variable))
            return original(self, distribution, plain, learning_rate)

        return update_step

    _patch_once(TFOptimizer, "_distributed_tf_update_step", replacement)


def install_sharded_reads():
    """A variable sharded across parameter servers reads as its whole value
    where Keras and TensorFlow read it: `np.asarray(variable)` (what
    `model.save()` and `get_weights()` use) and checkpoints.

    `KerasVariable.__array__` calls the TensorFlow variable's `__array__`,
    and `_serialize_to_tensors` its own or else the variable itself, as a
    tensor with a device: a `ShardedVariable` has neither. Its `numpy()` and
    its conversion to a tensor join the shards, so a checkpoint holds the
    variable as one tensor, which restores under any strategy (`assign`
    splits it again). Installed when a CTLModel is made under a
    `ParameterServerStrategy` (where sharded variables come from); other
    variables are read as Keras reads them. Checked on Keras 3.12.0 and
    3.15.1.
    """

    def sharded(variable):
        return getattr(variable._value, "is_sharded_variable", False)

    def array(original):
        def __array__(self, dtype=None):
            if sharded(self):
                return np.asarray(self._value.numpy(), dtype=dtype)
            return original(self, dtype)

        return __array__

    def tensors(original):
        def _serialize_to_tensors(self):
            if sharded(self):
                return {"VARIABLE_VALUE": tf.convert_to_tensor(self._value)}
            return original(self)

        return _serialize_to_tensors

    _patch_once(_TFVariable, "__array__", array)
    _patch_once(_TFVariable, "_serialize_to_tensors", tensors)
