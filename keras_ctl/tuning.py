"""keras-tuner hook: search the hyperparameters a custom step uses.

Imported lazily (`keras_ctl.CTLHyperModel`), so `import keras_ctl` works
without keras-tuner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

try:
    import keras_tuner
except ImportError as error:  # pragma: no cover - depends on the install
    raise ImportError(
        "keras_ctl.CTLHyperModel needs keras-tuner, which is not installed. "
        "Install it with `pip install 'keras-ctl[tune]'`."
    ) from error


class CTLHyperModel(keras_tuner.HyperModel):  # type: ignore[misc]  # untyped base
    """A `keras_tuner.HyperModel` for `CTLModel` and `GAN`.

    Implement `build(hp)` to return a compiled `keras_ctl.CTLModel` or
    `keras_ctl.GAN` (build a GAN's `d_steps` and `label_noise`, or any
    regularization weight, from `hp`). On top of keras-tuner's own hook this
    class:

    - tunes the batch size **per replica**: `fit()` gets
      `batch_size = per_replica * replicas` of the strategy the model was
      built under (the tuner's `distribution_strategy`), so a search on 2
      GPUs and one on 8 explore the same per-device batches;
    - sets `model.hyperparameters` to the trial's values before `fit()`, so
      a custom `train_step` can read them (`self.hyperparameters["reg"]`).

    Use `keras_ctl.tuning.objective("g_loss")` for objectives that
    keras-tuner cannot infer the direction of.

    Args:
        batch_sizes_per_replica: A list of per-replica batch sizes to search
            (`hp.Choice("batch_size_per_replica", ...)`), one fixed int, or
            `None` to leave `fit()`'s `batch_size` alone. Defaults to `None`.
        name: Optional name of the hypermodel.
        tunable: Whether the hyperparameters defined here are tunable.
            Defaults to `True`.

    Example:

    ```python
    class Classifier(keras_ctl.CTLHyperModel):
        def build(self, hp):
            inputs = keras.Input((8, 8, 1))
            outputs = keras.layers.Dense(10)(keras.layers.Flatten()(inputs))
            model = keras_ctl.CTLModel(inputs, outputs)
            lr = hp.Float("lr", 1e-4, 1e-2, sampling="log")
            model.compile(optimizer=keras.optimizers.Adam(lr), metrics=["accuracy"],
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            return model

    tuner = keras_tuner.RandomSearch(
        Classifier(batch_sizes_per_replica=[16, 32]), objective="val_accuracy",
        max_trials=2, distribution_strategy=strategy)
    tuner.search(x, y, epochs=1, validation_data=(x_test, y_test))
    print(tuner.get_best_hyperparameters()[0].values)
    ```
    """

    def __init__(
        self,
        batch_sizes_per_replica: int | Sequence[int] | None = None,
        name: str | None = None,
        tunable: bool = True,
    ) -> None:
        super().__init__(name=name, tunable=tunable)
        choices = batch_sizes_per_replica
        if choices is not None:
            values = [choices] if isinstance(choices, int) else list(choices)
            bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int)]
            if not values or bad or min(values) < 1:
                raise ValueError(
                    "Expected `batch_sizes_per_replica` to be a positive int or "
                    "a non-empty list of them. Received: "
                    f"batch_sizes_per_replica={batch_sizes_per_replica!r}."
                )
        self.batch_sizes_per_replica = choices

    def fit(
        self,
        hp: keras_tuner.HyperParameters,
        model: keras.Model,
        *args: Any,
        **kwargs: Any,
    ) -> keras.callbacks.History:
        """Trains `model` for one trial, with the trial's batch size.

        keras-tuner calls it; `fit()` gets `batch_size = per replica ×
        replicas` of the tuner's strategy, and `model.hyperparameters` the
        trial's values, for a custom `train_step` to read.

        Args:
            hp: The trial's `keras_tuner.HyperParameters`.
            model: The model `build(hp)` returned.
            *args: `model.fit()` arguments, in its order.
            **kwargs: `model.fit()` arguments, by name.

        Returns:
            The `keras.callbacks.History` of the trial.

        Example:

        ```python
        hypermodel = keras_ctl.CTLHyperModel(batch_sizes_per_replica=[16, 32])
        hp = keras_tuner.HyperParameters()  # a trial's, with its first choices
        history = hypermodel.fit(hp, model, x, y, epochs=1)  # what the tuner calls
        print(model.hyperparameters)  # {'batch_size_per_replica': 16}: batches of 32
        ```
        """
        per_replica = self.batch_size_per_replica(hp)
        model.hyperparameters = dict(hp.values)
        if per_replica is not None:
            kwargs["batch_size"] = (
                per_replica * model.distribute_strategy.num_replicas_in_sync
            )
        return model.fit(*args, **kwargs)

    def batch_size_per_replica(self, hp: keras_tuner.HyperParameters) -> int | None:
        """The trial's per-replica batch size, or `None` when not tuned.

        Args:
            hp: The trial's `keras_tuner.HyperParameters`.

        Returns:
            The `batch_size_per_replica` choice (a fixed `int` when one size
            was given), or `None` without `batch_sizes_per_replica`.

        Example:

        ```python
        hypermodel = keras_ctl.CTLHyperModel(batch_sizes_per_replica=[16, 32])
        hp = keras_tuner.HyperParameters()
        print(hypermodel.batch_size_per_replica(hp))  # 16, the first choice
        ```
        """
        choices = self.batch_sizes_per_replica
        if choices is None:
            return None
        if isinstance(choices, int):
            return choices
        choice: int = hp.Choice("batch_size_per_replica", list(choices))
        return choice


def objective(name: str, direction: str | None = None) -> keras_tuner.Objective:
    """Returns a `keras_tuner.Objective` for a value in `history`.

    Args:
        name: The logged name, e.g. `"g_loss"` or `"val_accuracy"`.
        direction: `"min"` or `"max"`. Defaults to `"min"` for names that
            contain "loss" and `"max"` otherwise.

    Returns:
        A `keras_tuner.Objective`.

    Example:

    ```python
    objective = keras_ctl.tuning.objective("g_loss")
    print(objective.name, objective.direction)  # g_loss min
    ```
    """
    if direction is None:
        direction = "min" if "loss" in name else "max"
    if direction not in ("min", "max"):
        raise ValueError(
            f"Expected `direction` 'min' or 'max'. Received: direction={direction!r}."
        )
    return keras_tuner.Objective(name, direction)
