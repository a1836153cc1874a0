"""Losses of the user's own given to `compile()`, written as users write
them, for `compiled_loss_reading_test.py` and its child on 3 replicas.

Each returns what its code says: the tutorial's recipe moved into a
`Loss` (`sum(per_example) / GLOBAL_BATCH`, TensorFlow#55321), one value
for the batch that is its sum (`reduction="sum"`) or its mean, a plain
function of one value an example, a `Loss` whose own `__call__` skips
Keras's reduction, and one that couples the batch's examples (the
variance of its predictions), which no reading of a replica's part makes
one device's.
"""

import configurations
import keras
import numpy as np
import tensorflow as tf

ROWS, BATCH = 21, 8  # the last batch (5 rows): 3 / 2 on 2 replicas, 2 / 2 / 1 on 3
GLOBAL_BATCH = BATCH


def per_example(y_true, y_pred):
    return keras.losses.sparse_categorical_crossentropy(
        y_true, y_pred, from_logits=True
    )


class Recipe(keras.losses.Loss):
    def call(self, y_true, y_pred):
        return tf.reduce_sum(per_example(y_true, y_pred)) / GLOBAL_BATCH


class BatchSum(keras.losses.Loss):
    def __init__(self):
        super().__init__(reduction="sum")

    def call(self, y_true, y_pred):
        return tf.reduce_sum(per_example(y_true, y_pred))


class BatchMean(keras.losses.Loss):
    def call(self, y_true, y_pred):
        return tf.reduce_mean(per_example(y_true, y_pred))


class OwnCall(keras.losses.Loss):
    def __call__(self, y_true, y_pred, sample_weight=None):
        return keras.ops.mean(per_example(y_true, y_pred))


class Coupled(keras.losses.Loss):
    def __init__(self, size=1.0):
        super().__init__()
        self.size = size

    def call(self, y_true, y_pred):
        variance = tf.math.reduce_variance(y_pred)
        return tf.reduce_mean(per_example(y_true, y_pred)) + self.size * variance


LOSSES = {
    "recipe": Recipe,
    "batch_sum": BatchSum,
    "batch_mean": BatchMean,
    "function": lambda: per_example,
    "own_call": OwnCall,
}
# What the first batch measures for each (`EngineState.loss_readings`).
READING = {"recipe": "share", "batch_sum": "share"}


def run(kind, model_class, strategy, evaluate_first=False, coupling=1.0):
    """Trains a small classifier with loss `kind` in float64 (`"coupled"`:
    the variance of the predictions times `coupling` added); returns its
    model and `{"weights", "history", "evaluate"}`."""
    with configurations.computing_in("float64"):
        rng = np.random.default_rng(5)
        x, y = rng.normal(size=(ROWS, 5)), rng.integers(0, 3, ROWS)
        keras.utils.set_random_seed(0)
        with strategy.scope():
            inputs = keras.Input((5,))
            hidden = keras.layers.Dense(4, activation="tanh")(inputs)
            model = model_class(inputs, keras.layers.Dense(3)(hidden))
            loss = Coupled(coupling) if kind == "coupled" else LOSSES[kind]()
            model.compile(keras.optimizers.SGD(0.1), loss)
        evaluated = []
        if evaluate_first:
            evaluated.append(model.evaluate(x, y, batch_size=BATCH, verbose=0))
        history = model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
        evaluated.append(model.evaluate(x, y, batch_size=BATCH, verbose=0))
        return model, {
            "weights": model.get_weights(),
            "history": history.history["loss"],
            "evaluate": evaluated,
        }


def largest_difference(expected, got):
    return max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for part in expected
        for a, b in zip(expected[part], got[part], strict=True)
    )
