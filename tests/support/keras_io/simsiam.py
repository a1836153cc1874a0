"""vision/simsiam.py's method: a `train_step` of one's own on two views of
each image, a stop-gradient, a symmetrized negative cosine similarity and
BatchNormalization in the projection and prediction heads.

Written for these tests after the example's method, on tiny sizes (8x8
images, a one-convolution backbone, 8-wide heads). Its loss,
`-tf.reduce_mean(...)` over the replica's examples, is read as one
device's (a step of one's own); the heads' BatchNormalization normalizes
each replica's examples by themselves, so `parity=True` makes it
`synchronized=True`, the change docs/good-to-know.md names.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_io

SOURCE = "examples/vision/simsiam.py"

WIDTH = 8


def negative_cosine(p, z):
    z = tf.stop_gradient(z)
    p = tf.math.l2_normalize(p, axis=1)
    z = tf.math.l2_normalize(z, axis=1)
    return -tf.reduce_mean(tf.reduce_sum(p * z, axis=1))


def model_class(base, parity):
    class SimSiam(base):
        def __init__(self, encoder, predictor):
            super().__init__()
            self.encoder = encoder
            self.predictor = predictor
            self.loss_tracker = keras.metrics.Mean(name="loss")

        @property
        def metrics(self):
            return [self.loss_tracker]

        def train_step(self, data):
            view_one, view_two = data
            with tf.GradientTape() as tape:
                z1, z2 = self.encoder(view_one), self.encoder(view_two)
                p1, p2 = self.predictor(z1), self.predictor(z2)
                loss = negative_cosine(p1, z2) / 2 + negative_cosine(p2, z1) / 2
            weights = (
                self.encoder.trainable_variables + self.predictor.trainable_variables
            )
            gradients = tape.gradient(loss, weights)
            self.optimizer.apply_gradients(zip(gradients, weights))
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

    return SimSiam


def heads_normalization(parity):
    return layers.BatchNormalization(synchronized=parity)  # changed in parity mode


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        inputs = keras.Input((8, 8, 3))
        x = layers.Rescaling(scale=1.0 / 127.5, offset=-1)(inputs)
        x = layers.Conv2D(4, 3, strides=2, padding="same", activation="relu")(x)
        x = layers.GlobalAveragePooling2D(name="backbone_pool")(x)
        x = layers.Dense(WIDTH, use_bias=False)(x)
        x = heads_normalization(parity)(x)
        x = layers.ReLU()(x)
        x = layers.Dense(WIDTH, use_bias=False)(x)
        outputs = heads_normalization(parity)(x)
        encoder = keras.Model(inputs, outputs, name="encoder")
        predictor = keras.Sequential(
            [
                keras.Input((WIDTH,)),
                layers.Dense(WIDTH // 2, use_bias=False),
                layers.ReLU(),
                heads_normalization(parity),
                layers.Dense(WIDTH),
            ],
            name="predictor",
        )
        steps = keras_io.EPOCHS * -(-keras_io.SIZE // keras_io.BATCH)
        schedule = keras.optimizers.schedules.CosineDecay(0.03, decay_steps=steps)
        simsiam = model_class(base, parity)(encoder, predictor)
        simsiam.compile(optimizer=keras.optimizers.SGD(schedule, momentum=0.6))
    rng = np.random.default_rng(3)
    images = rng.uniform(0, 255, (keras_io.SIZE, 8, 8, 3))
    # The two augmented views, made in the data as the example does.
    views = (images[:, :, ::-1], images * 0.8 + 20)
    floatx = keras.config.floatx()
    dataset = tf.data.Dataset.from_tensor_slices(
        tuple(v.astype(floatx) for v in views)
    ).batch(keras_io.BATCH)
    history = simsiam.fit(dataset, epochs=keras_io.EPOCHS, verbose=0)
    return keras_io.result(simsiam, history)
