"""Argument checks shared by the public classes and functions."""

from typing import Any

import tensorflow as tf

from keras_ctl.distribute import topology


def positive_int(name: str, value: object) -> int:
    """Raises `ValueError` unless `value` is an int >= 1, naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"Expected `{name}` to be an integer >= 1. Received: {name}={value!r}."
        )
    return value


def numeric_labels(y: Any, name: str = "y") -> None:
    """Raises `ValueError` if any array or tensor in `y` holds text.

    Keras fails on text labels with "Invalid dtype: str32" (arrays) or
    inside the loss (tensors); neither names the labels.
    """
    for value in _flat(y):
        dtype = getattr(value, "dtype", None)
        if dtype is None or not _is_text(dtype, value):
            continue
        raise ValueError(
            f"The labels `{name}` are text; losses need numbers. "
            f"Received: {name} of dtype {getattr(dtype, 'name', dtype)}. Map the "
            "labels to class indices first: `np.unique(y, return_inverse=True)[1]` "
            "for arrays, or `keras.layers.StringLookup(vocabulary=classes, "
            "num_oov_indices=0)` in a tf.data pipeline."
        )


def _flat(nest):
    if isinstance(nest, dict):
        nest = list(nest.values())
    if isinstance(nest, (list, tuple)):
        return [leaf for item in nest for leaf in _flat(item)]
    return [nest]


def _is_text(dtype, value):
    kind = getattr(dtype, "kind", None)  # NumPy
    if kind in ("U", "S"):
        return True
    if kind == "O":
        first = value.flat[0] if value.size else None
        return isinstance(first, (str, bytes))
    return getattr(dtype, "name", None) == "string"  # TensorFlow


def made_in_scope(model, created_under, strategy_of):
    """Raises `ValueError` when the model's weights and its optimizers were
    not all created in the scope of the strategy the model trains under
    (`created_under`: the strategy the model was created under, or `None`;
    `strategy_of(variable)`: the strategy a variable was created under).

    TensorFlow's own errors ("Mixing different tf.distribute.Strategy
    objects", "Need to be inside `with strategy.scope()`") name neither the
    object nor the fix.
    """
    if topology.of(model.distribute_strategy).parameter_servers:
        return  # its variables live on the parameter servers
    created = [("The model's weights were", "the model", model.weights)]
    compiled = model.optimizers_and_variables() if model.compiled else []
    for optimizer, _ in compiled:
        if optimizer is not None:
            what = f"The optimizer {optimizer.name!r} was"
            created.append((what, "the optimizer", optimizer.variables))
    # The model's strategy; a model created without one trains under its
    # optimizer's, or the strategy whose scope it is compiled or trained
    # in (Keras takes the current strategy then).
    strategy = created_under or next(
        (strategy_of(v) for v in created[-1][2] if strategy_of(v)), None
    )
    if strategy is None and model.compiled and tf.distribute.has_strategy():
        strategy = tf.distribute.get_strategy()
    if strategy is None:
        return
    current = tf.distribute.get_strategy()
    if tf.distribute.has_strategy() and current is not strategy:
        raise ValueError(
            f"The model is used inside the scope of a {type(current).__name__}, "
            f"but was created under a {type(strategy).__name__}. Call `fit()`, "
            "`evaluate()` and `predict()` outside that scope, or inside the "
            "scope of the strategy the model was created under."
        )
    for what, create, variables in created:
        if any(strategy_of(v) is not strategy for v in variables):
            raise ValueError(
                f"{what} created outside `strategy.scope()` of the "
                f"{type(strategy).__name__} the model trains under. Create "
                f"{create} inside `with strategy.scope():`, where the model "
                "(and every model inside it) is built and compiled, and its "
                "optimizer created."
            )


def batched(x, model):
    """Raises `ValueError` when `x` is a `tf.data.Dataset` of single
    examples (no `.batch()`): Keras fails later, in the model's call or in
    TensorFlow, without saying so."""
    if not isinstance(x, tf.data.Dataset):
        return
    specs = tf.nest.flatten(x.element_spec)
    ranks = [s.shape.rank for s in specs if isinstance(s, tf.TensorSpec)]
    inputs = tf.nest.flatten(getattr(model, "inputs", None) or [])
    single = any(rank == 0 for rank in ranks)
    if inputs and ranks and ranks[0] is not None:
        single = single or ranks[0] == len(inputs[0].shape) - 1
    if single:
        shapes = [tuple(s.shape) for s in specs if isinstance(s, tf.TensorSpec)]
        raise ValueError(
            "Expected `x` to be a batched tf.data.Dataset. Received: a dataset "
            f"of single examples (element shapes {shapes}). Batch it first: "
            "`dataset.batch(batch_size)`."
        )
