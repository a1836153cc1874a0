"""guides/custom_train_step_in_tensorflow.py: the guide "Customizing what
happens in `fit()` with TensorFlow", its four models that override a step,
one class each:

- `CustomModel`, the first simple step: `self.compute_loss(y=y,
  y_pred=y_pred)`, `self.optimizer.apply(...)`, the compiled metrics
  updated in a loop over `self.metrics` (the `loss` tracker given the loss);
- `LowLevelModel` ("Going lower-level"): its own `loss_tracker` and
  `mae_metric` listed in `metrics`, its own `MeanSquaredError` called in
  the step, `compile()` given only the optimizer;
- `SampleWeightModel` ("Supporting `sample_weight` & `class_weight`"):
  the data's sample weights passed to `compute_loss` and to the metrics;
- `TestStepModel` ("Providing your own evaluation step"): a `test_step` of
  its own (trained with the default step, validated with its own).

No random draws: the steps are the same in both modes. Each is read as one
device's code (its loss and trackers are the global batch's). `train`
trains the four in turn and returns one result: their weights one after
the other, their histories' keys prefixed with `simple_`, `low_level_`,
`sample_weight_` and `test_step_`, and every optimizer's update count.

Changed: the guide's classes all take the name `CustomModel`; here each
has its own (the bodies as published). Sizes (17 examples of 8 features
instead of 1,000 of 32); the guide fits arrays (shuffled) for 3 or 5
epochs and only evaluates the last model: here every model fits the
corpus's batched dataset (unshuffled) for 2 epochs, and the last one fits
with validation data, so its `test_step` runs after each epoch (its
`compile()` has no optimizer, as published: Keras's default, RMSprop).
The guide's GAN is left out (the corpus has the DCGAN).
"""

import keras
import numpy as np
import tensorflow as tf

import keras_io

SOURCE = "guides/custom_train_step_in_tensorflow.py"

FEATURES = 8


def custom_model(base):
    class CustomModel(base):
        def train_step(self, data):
            # Unpack the data. Its structure depends on your model and
            # on what you pass to `fit()`.
            x, y = data

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)  # Forward pass
                # Compute the loss value
                # (the loss function is configured in `compile()`)
                loss = self.compute_loss(y=y, y_pred=y_pred)

            # Compute gradients
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)

            # Update weights
            self.optimizer.apply(gradients, trainable_vars)

            # Update metrics (includes the metric that tracks the loss)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)

            # Return a dict mapping metric names to current value
            return {m.name: m.result() for m in self.metrics}

    return CustomModel


def low_level_model(base):
    class LowLevelModel(base):  # changed: the guide's `CustomModel`
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
            self.loss_fn = keras.losses.MeanSquaredError()

        def train_step(self, data):
            x, y = data

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)  # Forward pass
                # Compute our own loss
                loss = self.loss_fn(y, y_pred)

            # Compute gradients
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)

            # Update weights
            self.optimizer.apply(gradients, trainable_vars)

            # Compute our own metrics
            self.loss_tracker.update_state(loss)
            self.mae_metric.update_state(y, y_pred)
            return {
                "loss": self.loss_tracker.result(),
                "mae": self.mae_metric.result(),
            }

        @property
        def metrics(self):
            # We list our `Metric` objects here so that `reset_states()` can be
            # called automatically at the start of each epoch
            # or at the start of `evaluate()`.
            return [self.loss_tracker, self.mae_metric]

    return LowLevelModel


def sample_weight_model(base):
    class SampleWeightModel(base):  # changed: the guide's `CustomModel`
        def train_step(self, data):
            # Unpack the data. Its structure depends on your model and
            # on what you pass to `fit()`.
            if len(data) == 3:
                x, y, sample_weight = data
            else:
                sample_weight = None
                x, y = data

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)  # Forward pass
                # Compute the loss value.
                # The loss function is configured in `compile()`.
                loss = self.compute_loss(
                    y=y,
                    y_pred=y_pred,
                    sample_weight=sample_weight,
                )

            # Compute gradients
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)

            # Update weights
            self.optimizer.apply(gradients, trainable_vars)

            # Update the metrics.
            # Metrics are configured in `compile()`.
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred, sample_weight=sample_weight)

            # Return a dict mapping metric names to current value.
            # Note that it will include the loss (tracked in self.metrics).
            return {m.name: m.result() for m in self.metrics}

    return SampleWeightModel


def test_step_model(base):
    class TestStepModel(base):  # changed: the guide's `CustomModel`
        def test_step(self, data):
            # Unpack the data
            x, y = data
            # Compute predictions
            y_pred = self(x, training=False)
            # Updates the metrics tracking the loss
            loss = self.compute_loss(y=y, y_pred=y_pred)
            # Update the metrics.
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            # Return a dict mapping metric names to current value.
            # Note that it will include the loss (tracked in self.metrics).
            return {m.name: m.result() for m in self.metrics}

    return TestStepModel


def model_class(base):
    """The guide's first model class (`CustomModel`); the others are
    `low_level_model`, `sample_weight_model` and `test_step_model`."""
    return custom_model(base)


def _build(model_type):
    inputs = keras.Input(shape=(FEATURES,))
    outputs = keras.layers.Dense(1)(inputs)
    return model_type(inputs, outputs)


def merged(results):
    """One result of several models' `{prefix: result}`."""
    return {
        "weights": [w for result in results.values() for w in result["weights"]],
        "history": {
            f"{prefix}_{key}": values
            for prefix, result in results.items()
            for key, values in result["history"].items()
        },
        "iterations": sorted(
            count for result in results.values() for count in result["iterations"]
        ),
    }


def train(base, strategy, parity=True):
    del parity  # no random draws: the same steps in both modes
    keras.utils.set_random_seed(0)
    floatx = keras.config.floatx()
    rng = np.random.default_rng(3)
    x = rng.random((keras_io.SIZE, FEATURES)).astype(floatx)
    y = rng.random((keras_io.SIZE, 1)).astype(floatx)
    sw = rng.random((keras_io.SIZE, 1)).astype(floatx)
    x_val = rng.random((9, FEATURES)).astype(floatx)
    y_val = rng.random((9, 1)).astype(floatx)

    def batched(*arrays):
        return tf.data.Dataset.from_tensor_slices(arrays).batch(keras_io.BATCH)

    results = {}
    with strategy.scope():
        model = _build(custom_model(base))
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    history = model.fit(batched(x, y), epochs=keras_io.EPOCHS, verbose=0)
    results["simple"] = keras_io.result(model, history)

    with strategy.scope():
        model = _build(low_level_model(base))
        # We don't pass a loss or metrics here.
        model.compile(optimizer="adam")
    history = model.fit(batched(x, y), epochs=keras_io.EPOCHS, verbose=0)
    results["low_level"] = keras_io.result(model, history)

    with strategy.scope():
        model = _build(sample_weight_model(base))
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    history = model.fit(batched(x, y, sw), epochs=keras_io.EPOCHS, verbose=0)
    results["sample_weight"] = keras_io.result(model, history)

    with strategy.scope():
        model = _build(test_step_model(base))
        model.compile(loss="mse", metrics=["mae"])
    history = model.fit(
        batched(x, y),
        validation_data=batched(x_val, y_val),
        epochs=keras_io.EPOCHS,
        verbose=0,
    )
    results["test_step"] = keras_io.result(model, history)
    return merged(results)
