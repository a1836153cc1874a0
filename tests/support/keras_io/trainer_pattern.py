"""keras_recipes/trainer_pattern.py: `MyTrainer(model)`, a wrapper with
its own `train_step` calling `self.compiled_loss(...,
regularization_losses=self.losses)` and `self.compiled_metrics`, shared by
a Sequential and a functional model.

Changed: sizes (8x8 inputs, smaller layers); `Dropout` rates are 0.0 in
parity mode (each replica draws its own mask).
"""

import keras
import numpy as np
import tensorflow as tf

import keras_io

SOURCE = "examples/keras_recipes/trainer_pattern.py"


def model_class(base):
    class MyTrainer(base):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self.model(x, training=True)  # Forward pass
                # Compute loss value
                loss = self.compiled_loss(y, y_pred, regularization_losses=self.losses)

            # Compute gradients
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)

            # Update weights
            self.optimizer.apply_gradients(zip(gradients, trainable_vars))

            # Update metrics configured in `compile()`
            self.compiled_metrics.update_state(y, y_pred)

            # Return a dict mapping metric names to current value.
            return {m.name: m.result() for m in self.metrics}

        def call(self, x):
            # Equivalent to `call()` of the wrapped keras.Model
            x = self.model(x)
            return x

    return MyTrainer


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    rate = 0.0 if parity else 0.2
    with strategy.scope():
        # A model defined using Sequential API
        model_a = keras.models.Sequential(
            [
                keras.Input((8, 8)),
                keras.layers.Flatten(),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dropout(rate),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
        # A model defined using Functional API
        func_input = keras.Input(shape=(8, 8, 1))
        x = keras.layers.Flatten()(func_input)
        x = keras.layers.Dense(12, activation="relu")(x)
        x = keras.layers.Dropout(rate * 2)(x)
        func_output = keras.layers.Dense(10, activation="softmax")(x)
        model_b = keras.Model(func_input, func_output)

        trainer_1 = model_class(base)(model_a)
        trainer_2 = model_class(base)(model_b)
        trainer_1.compile(
            keras.optimizers.SGD(),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        trainer_2.compile(
            keras.optimizers.Adam(),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
    rng = np.random.default_rng(3)
    x_train = rng.random((keras_io.SIZE, 8, 8)).astype(keras.config.floatx())
    y_train = rng.integers(0, 10, keras_io.SIZE)
    results = []
    for trainer, x in ((trainer_1, x_train), (trainer_2, x_train[..., None])):
        history = trainer.fit(
            x,
            y_train,
            epochs=keras_io.EPOCHS,
            batch_size=keras_io.BATCH,
            validation_data=(x[:9], y_train[:9]),
            shuffle=False,
            verbose=0,
        )
        results.append(keras_io.result(trainer, history))
    return {
        "weights": results[0]["weights"] + results[1]["weights"],
        "history": {
            f"{i}_{k}": v
            for i, r in enumerate(results)
            for k, v in r["history"].items()
        },
        "iterations": results[0]["iterations"] + results[1]["iterations"],
    }
