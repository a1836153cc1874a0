"""generative/vae.py: `VAE(encoder, decoder)`, two positional arguments of
its own, and a `train_step` whose losses are `tf.reduce_mean`s over the
replica's examples.

A step of one's own not declared in shares is read as one
device's code (docs/good-to-know.md, "A step of one's own is read as one
device's code"): its local means become the global batch's, so the
example equals one device with no change but its randomness. Changed:
sizes (8x8 images, smaller layers); `Sampling` draws with
`keras.random.normal` and a `SeedGenerator` of its own, as the example's
Keras 3 version does (the stored text's `tf.keras.backend.random_normal`
is Keras 2's); in parity mode its epsilon is taken from the data
(`Sampling.draws`, set by `train()` once the encoder is built).
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_io

SOURCE = "examples/generative/vae.py"

latent_dim = 2


class Sampling(layers.Layer):
    """Uses (z_mean, z_log_var) to sample z, the vector encoding a digit."""

    draws = None  # changed: the data's draws, in parity mode

    def __init__(self, **kwargs):  # changed
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        batch = tf.shape(z_mean)[0]
        dim = tf.shape(z_mean)[1]
        if self.draws is not None:  # changed: epsilon from the data
            epsilon = self.draws.next()
        else:
            epsilon = keras.random.normal(
                shape=(batch, dim), seed=self.seed_generator
            )  # changed
        return z_mean + tf.exp(0.5 * z_log_var) * epsilon


def model_class(base):
    class VAE(base):
        def __init__(self, encoder, decoder, **kwargs):
            super(VAE, self).__init__(**kwargs)
            self.encoder = encoder
            self.decoder = decoder
            self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
            self.reconstruction_loss_tracker = keras.metrics.Mean(
                name="reconstruction_loss"
            )
            self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

        @property
        def metrics(self):
            return [
                self.total_loss_tracker,
                self.reconstruction_loss_tracker,
                self.kl_loss_tracker,
            ]

        def train_step(self, data):
            with tf.GradientTape() as tape:
                z_mean, z_log_var, z = self.encoder(data)
                reconstruction = self.decoder(z)
                reconstruction_loss = tf.reduce_mean(
                    tf.reduce_sum(
                        keras.losses.binary_crossentropy(data, reconstruction),
                        axis=(1, 2),
                    )
                )
                kl_loss = -0.5 * (1 + z_log_var - tf.square(z_mean) - tf.exp(z_log_var))
                kl_loss = tf.reduce_mean(tf.reduce_sum(kl_loss, axis=1))
                total_loss = reconstruction_loss + kl_loss
            grads = tape.gradient(total_loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
            self.total_loss_tracker.update_state(total_loss)
            self.reconstruction_loss_tracker.update_state(reconstruction_loss)
            self.kl_loss_tracker.update_state(kl_loss)
            return {
                "loss": self.total_loss_tracker.result(),
                "reconstruction_loss": self.reconstruction_loss_tracker.result(),
                "kl_loss": self.kl_loss_tracker.result(),
            }

    return VAE


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    draws = keras_io.DrawsFromData()

    class Trained(model_class(base)):
        def train_step(self, data):
            if not parity:
                return super().train_step(data)
            images, epsilon = data
            draws.hold([epsilon])
            return super().train_step(images)

    with strategy.scope():
        encoder_inputs = keras.Input(shape=(8, 8, 1))
        x = layers.Conv2D(4, 3, activation="relu", strides=2, padding="same")(
            encoder_inputs
        )
        x = layers.Conv2D(8, 3, activation="relu", strides=2, padding="same")(x)
        x = layers.Flatten()(x)
        x = layers.Dense(16, activation="relu")(x)
        z_mean = layers.Dense(latent_dim, name="z_mean")(x)
        z_log_var = layers.Dense(latent_dim, name="z_log_var")(x)
        sampling = Sampling()
        z = sampling([z_mean, z_log_var])
        encoder = keras.Model(encoder_inputs, [z_mean, z_log_var, z], name="encoder")
        if parity:
            sampling.draws = draws

        latent_inputs = keras.Input(shape=(latent_dim,))
        x = layers.Dense(2 * 2 * 8, activation="relu")(latent_inputs)
        x = layers.Reshape((2, 2, 8))(x)
        x = layers.Conv2DTranspose(8, 3, activation="relu", strides=2, padding="same")(
            x
        )
        x = layers.Conv2DTranspose(4, 3, activation="relu", strides=2, padding="same")(
            x
        )
        decoder_outputs = layers.Conv2DTranspose(
            1, 3, activation="sigmoid", padding="same"
        )(x)
        decoder = keras.Model(latent_inputs, decoder_outputs, name="decoder")

        vae = Trained(encoder, decoder)
        vae.compile(optimizer=keras.optimizers.Adam())
    floatx = keras.config.floatx()
    rng = np.random.default_rng(2)
    digits = rng.random((keras_io.SIZE, 8, 8, 1)).astype(floatx)
    if parity:
        epsilon = rng.normal(size=(keras_io.SIZE, latent_dim)).astype(floatx)
        data = (digits, epsilon)
    else:
        data = digits
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(keras_io.BATCH)
    history = vae.fit(dataset, epochs=keras_io.EPOCHS, verbose=0)
    return keras_io.result(vae, history)
