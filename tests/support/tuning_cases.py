"""The classifier hypermodels of the tuning tests, shared with the child
processes of the distributed search."""

import keras
import numpy as np
import tensorflow as tf

import keras_ctl


def classifier_data(n=120):
    rng = np.random.default_rng(0)
    x = rng.random((n, 6), dtype=np.float32)
    y = (x[:, :2].sum(axis=1) > 1.0).astype("int32")
    return (x[:96], y[:96]), (x[96:], y[96:])


class RegularizedStep(keras_ctl.CTLModel):
    """A custom step whose L2 weight comes from the trial's hyperparameters."""

    @keras_ctl.written_in_shares
    def train_step(self, data):
        x, y = data
        reg = self.hyperparameters["reg"]
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            per_example = keras.losses.sparse_categorical_crossentropy(
                y, y_pred, from_logits=True
            )
            penalty = tf.add_n([tf.reduce_sum(w**2) for w in self.trainable_weights])
            loss = (
                keras_ctl.global_mean(per_example)
                + reg * penalty / keras_ctl.num_replicas()
            )
        keras_ctl.minimize(loss, self.trainable_weights, self.optimizer, tape)
        self.compute_metrics(x, y, y_pred)
        return {m.name: m.result() for m in self.metrics if m.name != "loss"}


class Classifier(keras_ctl.CTLHyperModel):
    def __init__(self, model_class=keras_ctl.CTLModel, **kwargs):
        super().__init__(**kwargs)
        self.model_class = model_class

    def build(self, hp):
        inputs = keras.Input((6,))
        h = keras.layers.Dense(hp.Choice("units", [4, 8, 16]), activation="relu")(
            inputs
        )
        model = self.model_class(inputs, keras.layers.Dense(2)(h))
        if self.model_class is RegularizedStep:
            hp.Float("reg", 0.0, 0.01)
        model.compile(
            optimizer=keras.optimizers.Adam(hp.Choice("lr", [1e-3, 1e-2])),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        return model
