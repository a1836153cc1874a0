"""Plain accessors of Keras internals: the compiled loss and metrics, loss
trackers, the epoch counter, layers; each says why no public hook does it."""

import functools
from typing import Any
from typing import NoReturn

import keras
import tensorflow as tf
from keras import tree

from keras_ctl._keras import names
from keras_ctl._keras.state import record_write


def compile_loss(model: keras.Model) -> Any:
    """The model's `CompileLoss` built by `compile(loss=...)`, or `None`.

    Keras exposes only `model.compute_loss`, which reduces each output on its
    replica; the exact step needs the per-output losses, their paths, weights
    and names to divide each by a global count (`Trainer._compile_loss`).
    """
    return names.attribute(model, "_compile_loss")


def compile_loss_terms(compile_loss: Any) -> list[tuple[Any, ...]]:
    """`[(path, loss_fn, loss_weight, name)]`, one per output with a loss.

    `CompileLoss._flat_losses`, filled when the loss is built (see
    `pack_like_compile_loss`): a namedtuple `Loss(path, loss, loss_weights,
    name)` per output, read by position.
    """
    return [tuple(term) for term in names.attribute(compile_loss, "_flat_losses")]


def user_loss(compile_loss: Any) -> Any:
    """The `loss` given to `compile()`, as given (`CompileLoss._user_loss`):
    where it is `None` for an output, that output has no label."""
    return names.attribute(compile_loss, "_user_loss")


def pack_like_compile_loss(
    compile_loss: Any, y_true: Any, y_pred: Any
) -> tuple[Any, Any]:
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
        pack(names.attribute(compile_loss, "_y_true_build_structure"), y_true),
        pack(names.attribute(compile_loss, "_y_pred_build_structure"), y_pred),
    )


def per_output_loss_trackers(compile_loss: Any) -> list[keras.metrics.Metric]:
    """The `Mean` of each output's loss (`<output>_loss` in the logs), in the
    order of `compile_loss_terms`: `CompileLoss.metrics`."""
    return compile_loss.metrics


def loss_tracker(model: keras.Model) -> keras.metrics.Mean:
    """The `Mean` behind the logged `loss` (`Trainer._loss_tracker`).

    Keras creates it in `compile()` and lists it first in `model.metrics`,
    but has no public name for it.
    """
    return names.attribute(model, "_loss_tracker")


def add_to_mean(
    tracker: keras.metrics.Mean, total: tf.Tensor | float, count: tf.Tensor | float
) -> None:
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
    record_write(variable)
    variable.value.assign_add(value)


def compile_metrics(model: keras.Model) -> Any:
    """The `CompileMetrics` built by `compile(metrics=...)`, or `None`
    (`Trainer._compile_metrics`)."""
    return names.attribute(model, "_compile_metrics")


def add_metric_update(metric: keras.metrics.Metric, *args: Any) -> None:
    """Adds `metric`'s update on this replica's data to its variables.

    `stateless_update_state` gives the updated state without assigning it;
    its difference from the current state is added with `_add`, which
    stays right where Keras's `assign_add` counts a variable R times.
    """
    current = [variable.value for variable in metric.variables]
    updated = metric.stateless_update_state(current, *args)
    for variable, old, new in zip(metric.variables, current, updated):
        _add(variable, new - old)


def all_layers(model: keras.Model) -> list[keras.layers.Layer]:
    """Every layer inside `model`, nested ones too (`Layer._flatten_layers`,
    Keras 3.12-3.15: no public accessor walks a subclassed model's
    attributes)."""
    flatten = names.attribute(model, "_flatten_layers")
    return list(flatten(include_self=False, recursive=True))


def user_compute_loss(
    model: keras.Model, x: Any, y: Any, y_pred: Any, sample_weight: Any, training: bool
) -> tf.Tensor:
    """Calls a subclass's `compute_loss`, with `training` when it takes it.

    `Trainer._compute_loss`: the compatibility wrapper Keras's own steps use
    for overrides written before Keras 3.3 added `training`.
    """
    compute_loss = names.attribute(model, "_compute_loss")
    return compute_loss(x, y, y_pred, sample_weight, training=training)


def initial_epoch(model: keras.Model) -> int | None:
    """The epoch the next `fit()` starts at, when a restored backup set one
    (`Trainer._initial_epoch`), else `None`."""
    return names.attribute(model, "_initial_epoch", None)


def set_initial_epoch(model: keras.Model, epoch: int) -> None:
    """Makes the next `fit()` start at `epoch` (what Keras's own
    `BackupAndRestore` sets on restore: `Trainer._initial_epoch`)."""
    # Keras sets it only in `BackupAndRestore`; `fit()` reads it.
    model._initial_epoch = epoch


def end_epoch_early() -> NoReturn:
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


def strategy_of_variable(
    variable: keras.Variable,
) -> tf.distribute.Strategy | None:
    """The strategy a Keras variable was created under (`None`: none): its
    TensorFlow variable's `_distribute_strategy` (a `MirroredVariable` has
    a public `distribute_strategy`, a plain `tf.Variable` none)."""
    return names.attribute(variable.value, "_distribute_strategy", None)


def converts_with_autograph(function: object) -> bool:
    """Whether the `tf.function` `function` converts its Python function
    with AutoGraph (`Function._autograph`; `True` where it has none)."""
    return bool(names.attribute(function, "_autograph", True))


@functools.cache
def tensorflow_wrapper_modules() -> tuple[str, ...]:
    """The prefixes of the modules of TensorFlow's frames between a call and
    its caller: AutoGraph's `converted_call`, dispatch, traceback and
    decorator wrappers. Any other frame of TensorFlow's (a gradient
    function, a variable's update) is TensorFlow's own call."""
    autograph = names.module("tensorflow.python.autograph")
    util = names.module("tensorflow.python.util")
    return (f"{autograph.__name__}.", f"{util.__name__}.")
