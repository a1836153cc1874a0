"""The train, test and predict functions of a compiled model, built when
Keras asks for them (`make_train_function`, `make_test_function`,
`make_predict_function`).

What they run is read here once, from Keras's public model API and what
`CTLModel` hands over (its `optimizers_and_variables()`): the step plan,
the XLA pass, the accumulation, and the `StepParts` the step function is
handed. The engine calls nothing of `CTLModel`'s own. What it keeps
between calls is the model's `state.of(model)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import tree

from keras_ctl import _keras
from keras_ctl._engine import accumulation
from keras_ctl._engine import forward
from keras_ctl._engine import loop
from keras_ctl._engine import loss_mean
from keras_ctl._engine import random_draws
from keras_ctl._engine import state as engine_state
from keras_ctl._engine.accumulation import OptimizerPairs
from keras_ctl._engine.plan import StepPlan
from keras_ctl._engine.replica_step import StepParts
from keras_ctl._engine.step_function import StepFunction
from keras_ctl._own_code import is_keras_ctls
from keras_ctl._own_code import is_users_own
from keras_ctl._own_code import marked_in_shares


def optimizers_built_first(model: Any) -> bool:
    """Whether `model`'s optimizers are built before its first step: not
    when a step of the user's own has layers to build on first use (that
    step then builds the optimizers too, with every variable)."""
    return bool(model.built) and not _layers_built_by_its_step(model)


def train_function(
    model: Any, optimizers: OptimizerPairs, default_step: bool
) -> StepFunction:
    """The train function of `model` (a `CTLModel`), its accumulation and
    XLA pass set in its engine state. `optimizers`: its
    `optimizers_and_variables()`; `default_step`: whether its `train_step`
    is `CTLModel`'s."""
    engine = engine_state.of(model)
    engine.accumulation = accumulation.for_model(model, optimizers, default_step)
    engine.train_pass, function = _step_function(
        model, optimizers, model.train_step, True
    )
    return function


def test_function(model: Any, optimizers: OptimizerPairs) -> StepFunction:
    """The test function of `model`, its XLA pass set in its engine state."""
    engine = engine_state.of(model)
    engine.test_pass, function = _step_function(
        model, optimizers, model.test_step, False
    )
    return function


def predict_function(model: Any) -> Callable[[Any], Any]:
    """The predict function of `model`: the batches' predictions in the
    data's order under any strategy (`loop.predict`)."""
    plan = StepPlan.for_model(model, default_loss=False)
    predict_batches = loop.predict(model.distribute_strategy, model.predict_step, plan)
    engine = engine_state.attach(model)

    def function(batches: Any) -> Any:
        engine.predicted_batches += 1
        with _keras.in_effect():  # `predict_on_batch` calls it directly
            return predict_batches(batches)

    return function


def predictions_or_no_rows(model: Any, keras_predict: Callable[[], Any], x: Any) -> Any:
    """`keras_predict()`, Keras's `predict` of `x`; for data without any
    example, arrays of no rows shaped like the predictions (Keras 3.15
    raises `UnboundLocalError`)."""
    engine = engine_state.attach(model)
    engine.predicted_batches = 0
    try:
        return keras_predict()
    except UnboundLocalError:
        if engine.predicted_batches:
            raise
    inputs = _input_spec(x)
    if inputs is None:
        raise ValueError(
            "`predict()` received no example, from data whose shapes are not "
            f"known in advance. Received: x={x!r}. Check that `x` yields at "
            "least one batch."
        )
    outputs = model.compute_output_spec(inputs)
    return tree.map_structure(
        lambda t: np.zeros((0, *t.shape[1:]), dtype=t.dtype), outputs
    )


def _input_spec(x: Any) -> Any:
    """`KerasTensor`s shaped like `x`'s examples (arrays or a `tf.data`
    dataset), or `None` when `x` does not say (a generator)."""
    if isinstance(x, tf.data.Dataset):
        x = keras.utils.unpack_x_y_sample_weight(x.element_spec)[0]
    leaves = tree.flatten(x)
    if not leaves or not all(hasattr(leaf, "shape") for leaf in leaves):
        return None
    return tree.map_structure(
        lambda leaf: keras.KerasTensor(
            (None, *leaf.shape[1:]), dtype=keras.backend.standardize_dtype(leaf.dtype)
        ),
        x,
    )


def _step_function(
    model: Any,
    optimizers: OptimizerPairs,
    step: Callable[[Any], Any],
    training: bool,
) -> tuple[forward.CompiledPass | None, StepFunction]:
    engine = engine_state.of(model)
    # Only the compiled loss has collectives known before tracing, so only
    # it can be compiled per replica.
    compilable = (
        is_keras_ctls(model, "compute_loss")
        and _keras.compile_loss(model) is not None
        and not (training and engine.accumulation)
    )
    plan = StepPlan.for_model(model, compilable)
    if training and model.jit_compile:
        random_draws.check_with_xla(model)
        _check_global_statistics_with_xla(model)
    compiled_pass = None
    if plan.xla == "per_replica_pass":
        compiled_pass = forward.CompiledPass(model, training=training)
    parts = StepParts(
        strategy=model.distribute_strategy,
        state=engine,
        optimizers=[o for o, _ in optimizers if o is not None],
        metrics=lambda: model.metrics,
        builds_on_first_use=lambda: _builds_state_on_first_use(model),
        reads_as_one_device=_reads_as_one_device(
            model, "train_step" if training else "test_step"
        ),
        random_as_one_device=training and random_draws.as_one_device(model),
        warns_of_replica_draws=training and random_draws.warns_of_replica_draws(model),
        weights=lambda: model.weights,
        step_name=f"{type(model).__name__}.{'train_step' if training else 'test_step'}",
        measurement=loss_mean.check_for(model, training),
    )
    return compiled_pass, StepFunction(parts, step, plan, training=training)


def _reads_as_one_device(model: Any, method: str) -> bool:
    """Whether the model's step is the user's own, read as one device's
    code until it declares itself in shares as it runs
    (`_own_code.declare_in_shares`); a step that is the function
    `written_in_shares` returned runs in shares from its first line."""
    return is_users_own(model, method) and not marked_in_shares(model, method)


def _check_global_statistics_with_xla(model: Any) -> None:
    """Global batch statistics are an all-reduce inside the forward pass,
    which XLA compiles apart on each replica (the collectives stay
    outside it)."""
    replicas = model.distribute_strategy.num_replicas_in_sync
    if engine_state.of(model).batch_statistics != "global" or replicas == 1:
        return
    raise ValueError(
        'compile(batch_statistics="global") sums each BatchNormalization\'s '
        "moments across replicas inside the forward pass, which XLA compiles "
        f"on each replica apart. Received: jit_compile=True under {replicas} "
        "replicas. Pass jit_compile=False for the global batch's statistics, "
        'or batch_statistics="per_replica" to keep XLA with each replica\'s.'
    )


def _builds_state_on_first_use(model: Any) -> bool:
    """Whether a multi-replica step would build state on first use: the
    optimizers that `optimizers_and_variables()` does not list (so were not
    built before the first step), the compiled loss and metrics (left to a
    step of one's own to build, `_keras.SymbolicBuildFromFirstReplica`), or
    the layers only a step of one's own calls."""
    if model.distribute_strategy.num_replicas_in_sync == 1:
        return False
    compiled = (_keras.compile_loss(model), _keras.compile_metrics(model))
    return (
        any(
            isinstance(value, keras.optimizers.Optimizer) and not value.built
            for value in vars(model).values()
        )
        or any(value is not None and not value.built for value in compiled)
        or _layers_built_by_its_step(model)
    )


def _layers_built_by_its_step(model: Any) -> bool:
    """Whether a step of the user's own has layers to build on first use (a
    head only the step calls): its optimizers are then built by that first
    step too, with every variable."""
    return is_users_own(model, "train_step") and any(
        not layer.built for layer in _keras.all_layers(model)
    )
