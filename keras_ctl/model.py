"""`CTLModel`: a `keras.Model` whose steps are exact under any strategy."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import tree

from keras_ctl import _checks
from keras_ctl import _conversion
from keras_ctl import _keras
from keras_ctl import _replaced
from keras_ctl import _signature
from keras_ctl import blocks
from keras_ctl import strategies
from keras_ctl._engine import accumulation
from keras_ctl._engine import build
from keras_ctl._engine import forward
from keras_ctl._engine import metric_updates
from keras_ctl._engine import parameter_servers
from keras_ctl._engine import positions
from keras_ctl._engine import random_draws as random_draws_module
from keras_ctl._engine import state as engine_state
from keras_ctl._engine import update
from keras_ctl._engine.batch_statistics import MODES as BATCH_STATISTICS
from keras_ctl._engine.padding import pad_empty_batch
from keras_ctl._own_code import is_keras_ctls
from keras_ctl._own_code import is_users_own
from keras_ctl._replicas import written_in_shares
from keras_ctl.callbacks import BackupAndRestore
from keras_ctl.distribute import chief_writes
from keras_ctl.distribute import topology


def _in_effect(method):
    """Runs `method` with keras_ctl's replacements of Keras in place
    (`_keras.in_effect`): they are Keras's own again when it returns or
    raises."""

    @functools.wraps(method)
    def call(*args, **kwargs):
        with _keras.in_effect():
            return method(*args, **kwargs)

    return call


@keras.saving.register_keras_serializable(package="keras_ctl")
class CTLModel(_keras.SymbolicBuildFromFirstReplica, keras.Model):
    """A `keras.Model` whose training is exact under any `tf.distribute` strategy.

    Use it where you would use `keras.Model`, functionally
    (`CTLModel(inputs, outputs)`) or as a base class with your own `call()`,
    and keep calling `compile()`, `fit()`, `evaluate()`, `predict()` and
    `save()`. Under a strategy with R replicas, every step follows the
    custom-training-loop recipe of the TensorFlow distributed-training
    tutorial, with the global count all-reduced every step:

    - each output's loss is summed on its replica and divided by the *global*
      number of loss elements (or weight sum, per Keras's `reduction`), so
      uneven last batches and replicas without examples stay exact;
    - `model.losses` (weight regularizers, `add_loss`) count once per global
      batch: each replica adds `1 / R` of them, since gradients are summed;
    - the loss is scaled by the optimizer (`LossScaleOptimizer` under mixed
      precision), gradients are summed across replicas and applied;
    - logged values (`history`, `evaluate()`) are reduced once, exactly.

    For a model without per-replica randomness, `fit()` under any strategy
    gives the weights, `history` and `evaluate()` of one device.

    A custom `train_step` can use the same building blocks the default step
    uses: `keras_ctl.global_mean`, `keras_ctl.scaled_regularization_loss`,
    `keras_ctl.minimize` and the output types `keras_ctl.ReplicaSum`,
    `keras_ctl.ExampleMean`, `keras_ctl.Synchronized`. A step that returns
    `{m.name: m.result() for m in self.metrics}` (the keras.io way) gets the
    exact cross-replica value of each metric.

    Example:

    ```python
    with strategy.scope():  # e.g. keras_ctl.strategies.local_mirrored_strategy(2)
        inputs = keras.Input((8, 8, 1))
        outputs = keras.layers.Dense(10)(keras.layers.Flatten()(inputs))
        model = keras_ctl.CTLModel(inputs, outputs)
        model.compile(
            optimizer="sgd",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    history = model.fit(x, y, batch_size=64, epochs=2)
    print(history.history["accuracy"])  # one device's, on any number of replicas
    ```
    """

    # What `help(CTLModel)` shows. Not on `__init__`: Keras reads its
    # arguments from `__init__`'s own signature (`Operation.__new__`).
    __signature__ = _signature.ConstructorSignature(_signature.MODEL_CONSTRUCTOR)

    def __new__(cls, *args, **kwargs):
        return super().__new__(_conversion.class_to_make(cls, CTLModel, args, kwargs))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _conversion.make_functional_if_asked(self, args, kwargs)
        _read_sharded_variables_whole()
        super().__init__(*args, **kwargs)

    @classmethod
    def from_model(cls, model: keras.Model) -> CTLModel:
        """Makes `model` a `CTLModel`, in place, and returns it.

        The same for functional, `keras.Sequential` and subclassed models:
        the model's class gains `cls` as a base, after its own classes, so
        the model's own methods (`call`, `get_config`, a custom
        `train_step`) still come first. Nothing is copied: the returned
        model *is* `model`, with the same layers and weights, and weight
        files load across the conversion. Saved, a converted model loads
        converted again: a `CTLModel` for a functional one, its own class
        with `cls` for a Sequential or subclassed one (whose class must be
        registered, e.g. `@keras.saving.register_keras_serializable()`, to
        load as usual).

        Args:
            model: A `keras.Model`.

        Returns:
            `model`, now an instance of `cls`.

        Raises:
            TypeError: if `model` is not a `keras.Model`.

        Example:

        ```python
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        ctl = keras_ctl.CTLModel.from_model(model)
        ctl.compile(optimizer="sgd", loss="mse")
        print(ctl is model, isinstance(model, keras_ctl.CTLModel))  # True True
        ```
        """
        model = _conversion.convert(model, cls)
        _read_sharded_variables_whole()
        return model

    def optimizers_and_variables(
        self,
    ) -> list[tuple[keras.optimizers.Optimizer, list[keras.Variable]]]:
        """Lists each optimizer with the variables it updates.

        The step engine builds these optimizers before the first step, and
        `keras_ctl.callbacks.BackupAndRestore` before it restores a backup.
        Override it when a model trains with several optimizers
        (`keras_ctl.GAN` does).

        Returns:
            A list of `(optimizer, variables)` pairs.

        Example:

        ```python
        class TwoOptimizers(keras_ctl.CTLModel):
            def __init__(self):
                super().__init__()
                self.body = keras.Sequential(
                    [keras.layers.Flatten(), keras.layers.Dense(32, activation="relu")])
                self.head = keras.layers.Dense(10)
                self.head_optimizer = keras.optimizers.Adam(1e-3)

            def call(self, x):
                return self.head(self.body(x))

            def optimizers_and_variables(self):
                return [(self.optimizer, self.body.trainable_variables),
                        (self.head_optimizer, self.head.trainable_variables)]

            def train_step(self, data):
                x, y = data
                for optimizer, variables in self.optimizers_and_variables():
                    with tf.GradientTape() as tape:
                        per_example = keras.losses.sparse_categorical_crossentropy(
                            y, self(x, training=True), from_logits=True)
                        loss = keras_ctl.global_mean(per_example)
                    keras_ctl.minimize(loss, variables, optimizer, tape)
                return {"batch_loss": keras_ctl.ReplicaSum(loss)}

        with strategy.scope():
            model = TwoOptimizers()
            model.compile(optimizer=keras.optimizers.SGD(0.1))
        history = model.fit(x, y, batch_size=64, epochs=1)
        ```
        """
        return [(self.optimizer, self.trainable_variables)]

    def build_optimizers(self) -> None:
        """Creates every optimizer's variables now, in the strategy's scope.

        Keras optimizers create their variables on first use, which fails
        inside a distributed `tf.function`, and a backup can only load into
        variables that exist.
        """
        self._check_made_in_scope()
        for optimizer, variables in self.optimizers_and_variables():
            variables = list(variables)
            if optimizer is not None and not optimizer.built and variables:
                with self.distribute_strategy.scope():
                    optimizer.build(variables)

    @written_in_shares
    def train_step(self, data: Any) -> dict[str, Any]:
        """One exact training step on this replica's part of the batch.

        The arithmetic of the public blocks (`keras_ctl.global_mean` for
        each compiled loss, regularization once per global batch,
        `keras_ctl.minimize`), in one collective when every loss divides by
        a fixed count per example: each replica differentiates its loss
        times its number of examples, and the gradients and that number are
        summed together and divided after the sum. Gradients are summed
        before the optimizer clips them.

        Args:
            data: This replica's part of the batch, `(x, y)` or
                `(x, y, sample_weight)`.

        Returns:
            A dict of logs; metric results are reduced across replicas by
            the step engine.
        """
        data, batch_size = pad_empty_batch(data)
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        engine = self._engine
        step = engine.train_pass(data, batch_size) if engine.train_pass else None
        accumulating = engine.accumulation
        logs = metric_updates.RidingLogs(self, x, y, sample_weight)
        if step is None:
            step = forward.exact_gradients(
                self,
                x,
                y,
                sample_weight,
                batch_size,
                not accumulating,
                before_sum=None if accumulating else logs.before_sum,
            )
        if accumulating:
            accumulating.apply(
                step.gradients,
                step.shares.global_batch_size,
                step.shares.local_batch_size,
            )
        else:
            update.apply_summed(self.optimizer, step.gradients, self.trainable_weights)
        return logs.logs(step)

    @written_in_shares
    def test_step(self, data: Any) -> dict[str, Any]:
        """One exact evaluation step on this replica's part of the batch.

        Args:
            data: This replica's part of the batch, `(x, y)` or
                `(x, y, sample_weight)`.

        Returns:
            A dict of logs; metric results are reduced across replicas by
            the step engine.
        """
        data, batch_size = pad_empty_batch(data)
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        test_pass = self._engine.test_pass
        step = test_pass(data, batch_size) if test_pass else None
        if step is None:
            if is_keras_ctls(self, "compute_loss"):
                # Without gradients, the loss tracker can often do without
                # the count's collective (the logs' one collective gives it
                # exactly).
                step = forward.evaluation_pass(
                    self, y, self(x, training=False), sample_weight, batch_size
                )
            else:
                step = forward.forward_and_loss(
                    self, x, y, sample_weight, batch_size, training=False
                )
        return metric_updates.update(self, x, y, sample_weight, step)

    def compute_loss(
        self,
        x: Any = None,
        y: Any = None,
        y_pred: Any = None,
        sample_weight: Any = None,
        training: bool = True,
    ) -> tf.Tensor:
        """Keras's `compute_loss`, valued as the global batch's loss and
        differentiable as this replica's share.

        The compiled loss is Keras's own `CompileLoss`: its per-output
        losses, `loss_weights` and per-output trackers (`<output>_loss` in
        the logs) are Keras's. Inside a step under several replicas, each
        `Loss` divides by the global batch's count (empty and uneven
        replicas included) and the layer losses (`model.losses`) count once
        per global batch. So the value is the one one device computes, the
        same on every replica, and the replicas' gradients sum to one
        device's, as `optimizer.apply` sums them. Elsewhere (one replica,
        or outside `strategy.run`) it is Keras's `compute_loss` as it is.
        An override may call it any number of times and add terms of its
        own.

        Args:
            x: The inputs.
            y: The targets.
            y_pred: The model's predictions on `x`.
            sample_weight: Optional weights of the examples.
            training: Whether the model is training, as in Keras.

        Returns:
            A scalar tensor: the global batch's loss, whose gradient is this
            replica's share.

        Example:

        ```python
        class CustomModel(keras_ctl.CTLModel):
            def train_step(self, data):  # the keras.io way, exact as written
                x, y = data
                with tf.GradientTape() as tape:
                    y_pred = self(x, training=True)
                    loss = self.compute_loss(y=y, y_pred=y_pred)
                gradients = tape.gradient(loss, self.trainable_variables)
                self.optimizer.apply(gradients, self.trainable_variables)
                for metric in self.metrics:
                    if metric.name == "loss":
                        metric.update_state(loss)
                    else:
                        metric.update_state(y, y_pred)
                return {m.name: m.result() for m in self.metrics}

        with strategy.scope():
            model = CustomModel(inputs, outputs)
            model.compile(optimizer="sgd", metrics=["accuracy"],
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(x, y, batch_size=64, epochs=1)
        ```
        """
        compile_loss = _keras.compile_loss(self)
        # Layer losses are read before the compiled loss's collectives:
        # replica threads share the layers.
        losses = self.losses
        if (
            blocks.num_replicas() == 1
            or tf.distribute.get_replica_context() is None
            or (compile_loss is None and not losses)  # Keras's error says so
        ):
            return super().compute_loss(x, y, y_pred, sample_weight, training=training)
        batch_size = _keras.real_examples()
        if batch_size is None:
            batch_size = tf.shape(tree.flatten(y_pred if x is None else x)[0])[0]
        compiled = None
        if compile_loss is not None:
            with _replaced.losses.examples_of_batch(batch_size):
                compiled = compile_loss(y, y_pred, sample_weight)
        return forward.with_layer_losses(compiled, losses, batch_size)

    @_signature.keras_signature(
        keras.Model.compile,
        gradient_accumulation=(str, "micro_batches"),
        compute_loss_over=(str | None, None),
        random_draws=(str | None, None),
        batch_statistics=(str | None, None),
    )
    def compile(
        self,
        *args: Any,
        gradient_accumulation: str = "micro_batches",
        compute_loss_over: str | None = None,
        random_draws: str | None = None,
        batch_statistics: str | None = None,
        **kwargs: Any,
    ) -> None:
        """`keras.Model.compile`, with four more options.

        Every other argument is `keras.Model.compile()`'s, with its default.

        Args:
            gradient_accumulation: What an optimizer's
                `gradient_accumulation_steps=k` averages: `"micro_batches"`
                (default, Keras's): each update applies the mean of the k
                steps' mean gradients; `"examples"`: the mean gradient over
                every example of the k steps, as one step on their union
                would (the two differ when the k batches differ in size,
                e.g. at the end of an epoch). Either way the gradients
                cross replicas once per update.
            compute_loss_over: What a `compute_loss` of the model's own
                sees under several replicas: `"replica_batch"`: each
                replica's part of the batch, its loss weighed by that
                part's share of the global batch (one device's loss for a
                mean over examples); `None` (default): the same, but the
                first batch of the first `fit()` or `evaluate()` is
                measured before any step (the gradient the replicas'
                weighed losses sum to against one device's on the whole
                batch, with `training=False`), and a loss that is not a
                mean over examples (a sum, a loss coupling the batch's
                examples) is refused with a `ValueError` naming the
                numbers and the choices. A `train_step` of the model's own
                read as one device's code is measured the same way at
                the first batch of the first `fit()` (the gradients it
                applies, captured, not applied) unless a choice is given
                (taken as given: `"replica_batch"` runs it as written);
                `"global_batch"`: every
                replica's rows of `x`, `y`, `y_pred` and `sample_weight`
                (`keras_ctl.all_gather`), for a loss that couples the
                examples of the batch (in-batch negatives, a contrastive
                similarity matrix, a normalizer counted over the batch), at
                the cost of the gather and of every replica computing the
                whole loss. Keras's own `compute_loss` is exact either way;
                with `None`, a loss of one's own given to `compile()` (a
                `Loss` subclass, a function) is measured on the first batch
                too, on one device on the whole batch and its halves: a
                mean is read as each replica's mean, a sum (the tutorial's
                `sum(per_example) / GLOBAL_BATCH` in a `Loss`) as each
                replica's share summed as it is, and any other value is
                refused naming the numbers.
            random_draws: What the random numbers of a training step are
                under several replicas: `"as_one_device"`: each example
                gets the numbers one device draws for it (`Dropout`,
                `GaussianNoise`, random augmentation layers, and
                `keras.random.normal`, `uniform`, `truncated_normal`,
                `randint`, `gamma`, `binomial`, `beta` and `categorical`
                with a `SeedGenerator` seed, whose first dimension is the
                batch), so a seeded run equals one device on any replica
                count, and resumes on any. A draw whose first dimension is
                not the replica's batch is one draw for the batch, the one
                device draws; `keras.random.shuffle` of the replica's rows
                is refused with a `ValueError`. Costs draws of up to the
                global batch's rows; where each replica's examples sit
                comes with `fit()`'s batches (other data: one all-gather
                of the batch sizes a step). Refused with
                `jit_compile=True` under several replicas (XLA draws other
                numbers than TensorFlow's kernels, and one device with XLA
                draws XLA's). `"per_replica"`: each replica draws its own,
                as Keras. `None` (default): `"as_one_device"`, except with
                `jit_compile=True` under several replicas: each replica's
                own there, with a warning at the first training step that
                draws, once.
            batch_statistics: What the statistics of a batch that a
                training step keeps in the model's variables are under
                several replicas (`BatchNormalization`'s moving statistics,
                an EMA of the batch): `"global"`: the global batch's, as on
                one device: the moments of every `BatchNormalization` are
                synchronized (as `synchronized=True` does, counting only
                real examples: one all-reduce a layer and step); a value
                computed from the replica's examples alone and assigned to
                a weight (a layer's own running mean) is refused with a
                `ValueError` that names it. `"per_replica"`: each
                replica's own, as Keras computes them. `None` (default):
                each replica's own, with a warning that names the
                variables and both choices, once. Which values are batch
                statistics is read from the traced step. `"global"` is
                refused with `jit_compile=True` under several replicas
                (XLA compiles each replica's forward pass apart).

        Returns:
            `None`.

        Example:

        ```python
        with strategy.scope():
            model.compile(
                optimizer=keras.optimizers.SGD(0.1, gradient_accumulation_steps=4),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                gradient_accumulation="examples",
            )
        model.fit(x, y, batch_size=64, epochs=1)  # an update every 4 batches
        ```
        """
        for name, value, choices in (
            ("gradient_accumulation", gradient_accumulation, accumulation.MODES),
            ("compute_loss_over", compute_loss_over, forward.COMPUTE_LOSS_OVER),
            ("random_draws", random_draws, random_draws_module.MODES),
            ("batch_statistics", batch_statistics, BATCH_STATISTICS),
        ):
            if value not in choices:
                raise ValueError(
                    f"Expected `{name}` in {choices}. Received: {name}={value!r}."
                )
        engine = self._engine
        engine.gradient_accumulation = gradient_accumulation
        engine.compute_loss_over = compute_loss_over
        engine.random_draws = random_draws
        engine.random_draws_warned = False
        engine.batch_statistics = batch_statistics
        engine.batch_statistics_warned = False
        engine.logged_metric_names = None
        engine.loss_readings = {}
        super().compile(*args, **kwargs)

    def _with_positions(
        self, dataset: tf.data.Dataset, strategy: tf.distribute.Strategy
    ) -> Any:
        # A training step drawing one device's numbers reads where its
        # examples sit in the global batch from its data: no collective.
        own = self.distribute_strategy
        if (
            random_draws_module.as_one_device(self)
            and own.num_replicas_in_sync > 1
            and not topology.of(own).parameter_servers
        ):
            return positions.with_positions(dataset, strategy)
        return None

    def _steps_are_its_own(self) -> bool:
        return any(is_users_own(self, name) for name in ("train_step", "test_step"))

    def get_compile_config(self) -> dict[str, Any] | None:
        config = super().get_compile_config()
        engine = self._engine
        for name, default in (
            ("gradient_accumulation", "micro_batches"),
            ("compute_loss_over", None),
            ("random_draws", None),
            ("batch_statistics", None),
        ):
            if config and getattr(engine, name) != default:
                config[name] = getattr(engine, name)
        return config

    def compile_from_config(self, config: dict[str, Any]) -> None:
        if type(self).compile is not CTLModel.compile:
            # A subclass's own `compile()`: Keras warns and leaves it to the
            # user, as for a `keras.Model` subclass.
            return super().compile_from_config(config)
        # Keras skips `compile()` on load when a class overrides it.
        self.compile(**keras.saving.deserialize_keras_object(config))
        if getattr(self, "optimizer", None) is not None and self.built:
            self.optimizer.build(self.trainable_variables)

    @_signature.keras_signature(keras.Model.fit)
    @_in_effect
    def fit(
        self, x: Any = None, y: Any = None, *args: Any, **kwargs: Any
    ) -> keras.callbacks.History:
        """`keras.Model.fit`, exact under the model's strategy.

        Under `ParameterServerStrategy` the steps are scheduled on the
        workers, and `x` may also be a function `dataset_fn(input_context)`
        returning a `tf.data.Dataset`. Under several workers only the chief
        prints the progress bar unless `verbose` is given.

        Args:
            x: Input data, as for `keras.Model.fit`.
            y: Target data, as for `keras.Model.fit`.

        Returns:
            A `keras.callbacks.History`: each epoch's loss and metrics, equal
            to one device's.

        Raises:
            ValueError: naming the argument, for text labels, a dataset of
                single examples, or a model or optimizer created outside the
                strategy's scope.

        Example:

        ```python
        with strategy.scope():
            model = keras_ctl.CTLModel(inputs, outputs)
            model.compile(optimizer="adam",
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(x, y, batch_size=64, epochs=2)
        print(history.history["loss"])  # one device's, on any number of replicas
        ```
        """
        _checks.numeric_labels(y)
        _checks.batched(x, self)
        validation_data = kwargs.get("validation_data")
        if isinstance(validation_data, tuple) and len(validation_data) > 1:
            _checks.numeric_labels(validation_data[1], "validation_data")
        strategy = self.distribute_strategy
        if strategies.is_parameter_server(strategy):
            return parameter_servers.fit(self, x, y, *args, **kwargs)
        self._check_made_in_scope()
        # Under several workers only the chief writes the user's files and,
        # unless `verbose` is given, prints the progress bar.
        if chief_writes.writes_aside(strategy) and len(args) < 3:
            kwargs.setdefault("verbose", 0)
        self._engine.calls += 1  # its first step is measured
        callbacks = kwargs.get("callbacks")
        if callbacks is not None:
            kwargs["callbacks"] = chief_writes.with_chief_only_backups(
                callbacks, strategy, BackupAndRestore
            )
        with chief_writes.callbacks_write_aside(callbacks, strategy):
            return super().fit(x, y, *args, **kwargs)

    @_signature.keras_signature(keras.Model.save)
    @_in_effect
    def save(self, filepath: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        """`keras.Model.save`; under several workers every worker saves
        and only the chief's file stays at `filepath` (the others write
        theirs into a temporary folder, removed after).

        Args:
            filepath: Where the `.keras` file goes.

        Returns:
            `None`.

        Example:

        ```python
        model.save("model.keras")  # every worker calls it; the chief writes
        restored = keras.models.load_model("model.keras")
        print(isinstance(restored, keras_ctl.CTLModel))  # True
        ```
        """
        with chief_writes.path_for_this_worker(
            filepath, self.distribute_strategy
        ) as path:
            return super().save(path, *args, **kwargs)

    @_signature.keras_signature(keras.Model.save_weights)
    @_in_effect
    def save_weights(
        self, filepath: str | os.PathLike, *args: Any, **kwargs: Any
    ) -> None:
        """`keras.Model.save_weights`, writing as `save()` does under
        several workers.

        Args:
            filepath: Where the `.weights.h5` file goes.

        Returns:
            `None`.

        Example:

        ```python
        model.save_weights("model.weights.h5")
        ```
        """
        with chief_writes.path_for_this_worker(
            filepath, self.distribute_strategy
        ) as path:
            return super().save_weights(path, *args, **kwargs)

    @_in_effect
    def get_weights(self) -> list[np.ndarray]:
        """`keras.Model.get_weights`, reading a variable sharded across
        parameter servers as its whole value.

        Returns:
            The weights, as NumPy arrays.

        Example:

        ```python
        weights = model.get_weights()
        ```
        """
        return super().get_weights()

    @_signature.keras_signature(keras.Model.evaluate)
    @_in_effect
    def evaluate(
        self, x: Any = None, y: Any = None, *args: Any, **kwargs: Any
    ) -> float | list[float] | dict[str, float]:
        """`keras.Model.evaluate`, exact under the model's strategy.

        Args:
            x: Input data, as for `keras.Model.evaluate`.
            y: Target data, as for `keras.Model.evaluate`.

        Returns:
            The loss and metrics of the whole data, as one device computes
            them (a dict with `return_dict=True`).

        Example:

        ```python
        results = model.evaluate(x_test, y_test, return_dict=True)
        print(results)  # {'accuracy': ..., 'loss': ...}
        ```
        """
        _checks.numeric_labels(y)
        _checks.batched(x, self)
        if strategies.is_parameter_server(self.distribute_strategy):
            return parameter_servers.evaluate(self, x, y, *args, **kwargs)
        self._check_made_in_scope()
        if not kwargs.get("_use_cached_eval_dataset"):  # not fit()'s validation
            self._engine.calls += 1  # its first step is measured
        return super().evaluate(x, y, *args, **kwargs)

    @_signature.keras_signature(keras.Model.predict)
    @_in_effect
    def predict(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        """`keras.Model.predict`, in the order of the data under any strategy.

        Args:
            x: Input data, as for `keras.Model.predict`.

        Returns:
            The predictions, as NumPy arrays. Data without any example gives
            arrays with no rows (Keras 3.15 raises `UnboundLocalError`).

        Example:

        ```python
        logits = model.predict(x_test, batch_size=256)
        print(logits.shape)  # (359, 10): one row per example, in order
        ```
        """
        if strategies.is_parameter_server(self.distribute_strategy):
            return parameter_servers.predict(self, x, *args, **kwargs)
        _checks.batched(x, self)
        self._check_made_in_scope()
        keras_predict = functools.partial(super().predict, x, *args, **kwargs)
        return build.predictions_or_no_rows(self, keras_predict, x)

    def make_train_function(self, force: bool = False) -> Callable[..., Any]:
        if self.train_function is None or force:
            if build.optimizers_built_first(self):
                self.build_optimizers()
            default_step = type(self).train_step is CTLModel.train_step
            self.train_function = build.train_function(
                self, self.optimizers_and_variables(), default_step
            )
        return self.train_function

    def make_test_function(self, force: bool = False) -> Callable[..., Any]:
        if self.test_function is None or force:
            self.test_function = build.test_function(
                self, self.optimizers_and_variables()
            )
        return self.test_function

    def make_predict_function(self, force: bool = False) -> Callable[..., Any]:
        if self.predict_function is None or force:
            self.predict_function = build.predict_function(self)
        return self.predict_function

    @property
    def _engine(self):
        """What the step engine keeps for this model between calls."""
        return engine_state.attach(self)

    def _check_made_in_scope(self):
        _checks.made_in_scope(
            self, _keras.strategy_created_under(self), _keras.strategy_of_variable
        )


def _read_sharded_variables_whole():
    # Sharded variables come from a ParameterServerStrategy's partitioner.
    if strategies.is_parameter_server():
        _keras.keep_sharded_reads()


# Legacy `.h5` files name a model's class only ("CTLModel"), not its
# registered name: the bare name loads too, as `keras.Model` does.
keras.saving.get_custom_objects().setdefault("CTLModel", CTLModel)
