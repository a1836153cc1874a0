"""vision/barlow_twins.py's method: a `keras.losses.Loss` subclass whose
`call` returns one value for the whole batch (the cross-correlation of the
two views' embeddings, each normalized over the batch), called in a
`train_step` of one's own.

Written for these tests after the example's method, on tiny sizes (8x8
images, a one-convolution backbone, an 8-wide projector). The loss couples
the examples of the batch, and so does the projector's BatchNorm: as
written, under R replicas each replica correlates and normalizes its own
examples. Parity mode makes the two changes the docs' global-batch guide
names: the embeddings go through `keras_ctl.all_gather` before the loss,
of which each replica adds `1 / keras_ctl.num_replicas()`, and the
BatchNorm is `synchronized=True`.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_ctl
import keras_io

SOURCE = "examples/vision/barlow_twins.py"

WIDTH = 8


class CrossCorrelationLoss(keras.losses.Loss):
    """1s on the cross-correlation's diagonal, 0s elsewhere."""

    def __init__(self, batch_size, off_diagonal_weight=5e-3):
        super().__init__()
        self.batch_size = batch_size
        self.off_diagonal_weight = off_diagonal_weight

    def call(self, z_a, z_b):
        def normalized(z):
            return (z - tf.reduce_mean(z, axis=0)) / (
                tf.math.reduce_std(z, axis=0) + 1e-9
            )

        c = tf.transpose(normalized(z_a)) @ normalized(z_b) / self.batch_size
        on_diagonal = tf.reduce_sum(tf.square(tf.linalg.diag_part(c) - 1))
        off_diagonal = tf.reduce_sum(
            tf.square(tf.linalg.set_diag(c, tf.zeros(c.shape[-1], c.dtype)))
        )
        return on_diagonal + self.off_diagonal_weight * off_diagonal


def model_class(base, global_batch):
    class BarlowModel(base):
        def __init__(self, encoder):
            super().__init__()
            self.encoder = encoder
            self.loss_tracker = keras.metrics.Mean(name="loss")

        @property
        def metrics(self):
            return [self.loss_tracker]

        def call(self, images):
            return self.encoder(images)

        @keras_ctl.written_in_shares
        def train_step(self, data):
            view_a, view_b = data
            with tf.GradientTape() as tape:
                z_a, z_b = self(view_a, training=True), self(view_b, training=True)
                if global_batch:  # changed: every replica computes the
                    # global batch's loss, and adds its 1/R of it.
                    z_a, z_b = keras_ctl.all_gather(z_a), keras_ctl.all_gather(z_b)
                    loss = self.loss(z_a, z_b) / keras_ctl.num_replicas()
                else:
                    loss = self.loss(z_a, z_b)
            gradients = tape.gradient(loss, self.encoder.trainable_variables)
            self.optimizer.apply_gradients(
                zip(gradients, self.encoder.trainable_variables)
            )
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

    return BarlowModel


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        inputs = keras.Input((8, 8, 3))
        x = layers.Conv2D(4, 3, strides=2, padding="same", activation="relu")(inputs)
        x = layers.GlobalAveragePooling2D()(x)
        x = layers.Dense(WIDTH)(x)
        x = layers.BatchNormalization(synchronized=parity)(x)  # changed
        x = layers.ReLU()(x)
        outputs = layers.Dense(WIDTH)(x)
        encoder = keras.Model(inputs, outputs, name="encoder")
        model = model_class(base, global_batch=parity)(encoder)
        model.compile(
            optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
            loss=CrossCorrelationLoss(keras_io.BATCH),
        )
    images = np.random.default_rng(4).random((keras_io.SIZE, 8, 8, 3))
    views = (images[:, :, ::-1], np.clip(images * 1.2 - 0.1, 0, 1))
    floatx = keras.config.floatx()
    dataset = tf.data.Dataset.from_tensor_slices(
        tuple(v.astype(floatx) for v in views)
    ).batch(keras_io.BATCH)
    history = model.fit(dataset, epochs=keras_io.EPOCHS, verbose=0)
    return keras_io.result(model, history)
