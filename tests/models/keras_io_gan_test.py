"""The keras.io guide's GAN ("Customizing what happens in fit()"), copied as
written with `keras_ctl.CTLModel` as its base, runs under a strategy.

Its optimizers are built on first use, inside the step: the first step then
runs eagerly (a traced multi-replica step cannot create them). Its Keras
losses give the global batch's loss (see `_keras.replica_step`), so
weights and logs equal one device's on uneven batches. For a comparison
with one device its random draws come from the data (latent vectors) and
its label noise is off; otherwise the code is the guide's.
"""

import devices
import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_ctl

LATENT_DIM = 8


def guide_gan(base):
    class GAN(base):
        def __init__(self, discriminator, generator, latent_dim):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim
            self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
            self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

        @property
        def metrics(self):
            return [self.d_loss_tracker, self.g_loss_tracker]

        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super().compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.loss_fn = loss_fn

        def train_step(self, data):
            real_images, random_latent_vectors = data  # from the data here
            batch_size = tf.shape(real_images)[0]

            # Decode them to fake images
            generated_images = self.generator(random_latent_vectors)

            # Combine them with real images
            combined_images = tf.concat([generated_images, real_images], axis=0)

            # Assemble labels discriminating real from fake images
            labels = tf.concat(
                [tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0
            )

            # Train the discriminator
            with tf.GradientTape() as tape:
                predictions = self.discriminator(combined_images)
                d_loss = self.loss_fn(labels, predictions)
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply(grads, self.discriminator.trainable_weights)

            # Assemble labels that say "all real images"
            misleading_labels = tf.zeros((batch_size, 1))

            # Train the generator (note that we should *not* update the weights
            # of the discriminator)!
            with tf.GradientTape() as tape:
                predictions = self.discriminator(self.generator(random_latent_vectors))
                g_loss = self.loss_fn(misleading_labels, predictions)
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply(grads, self.generator.trainable_weights)

            # Update metrics and return their value.
            self.d_loss_tracker.update_state(d_loss)
            self.g_loss_tracker.update_state(g_loss)
            return {
                "d_loss": self.d_loss_tracker.result(),
                "g_loss": self.g_loss_tracker.result(),
            }

    return GAN


def train(where, base):
    init = keras.initializers.GlorotUniform
    with devices.get(where).scope():
        discriminator = keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                layers.Flatten(),
                layers.Dense(1, kernel_initializer=init(1)),
            ]
        )
        generator = keras.Sequential(
            [
                keras.Input((LATENT_DIM,)),
                layers.Dense(64, activation="sigmoid", kernel_initializer=init(2)),
                layers.Reshape((8, 8, 1)),
            ]
        )
        gan = guide_gan(base)(discriminator, generator, LATENT_DIM)
        gan.compile(
            d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
            g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
            loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
        )
    rng = np.random.default_rng(0)
    images = rng.random((101, 8, 8, 1), dtype=np.float32)  # the last batch 5
    latents = rng.normal(size=(101, LATENT_DIM)).astype("float32")
    history = gan.fit(
        images, latents, batch_size=16, epochs=2, shuffle=False, verbose=0
    )
    return gan, history.history


def test_the_guide_gan_trains_under_a_strategy_like_one_device():
    expected, expected_history = train("default", keras.Model)
    got, history = train("mirrored", keras_ctl.CTLModel)
    for g, e in zip(got.get_weights(), expected.get_weights(), strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5, rtol=0)
    assert int(got.d_optimizer.iterations.numpy()) == 14
    assert int(got.g_optimizer.iterations.numpy()) == 14
    # Its Keras losses (`self.loss_fn(...)`) give the global batch's loss.
    for name in ("d_loss", "g_loss"):
        np.testing.assert_allclose(history[name], expected_history[name], atol=1e-5)
