"""generative/dcgan_overriding_train_step.py: `GAN`, trained on images
alone, with label noise and its loss trackers made in `compile()`.

Changed: sizes (8x8 images, latent 4, smaller layers); the step's random
draws (two latent batches, the label noise) go through `self.latents(...)`
and `self.label_noise(...)`, which in parity mode take them from the data;
the discriminator's `Dropout(0.2)` is `Dropout(0.0)` in parity mode (each
replica draws its own mask).
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_io

SOURCE = "examples/generative/dcgan_overriding_train_step.py"

latent_dim = 4


def model_class(base):
    class GAN(base):
        def __init__(self, discriminator, generator, latent_dim):
            super(GAN, self).__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim

        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super(GAN, self).compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.loss_fn = loss_fn
            self.d_loss_metric = keras.metrics.Mean(name="d_loss")
            self.g_loss_metric = keras.metrics.Mean(name="g_loss")

        @property
        def metrics(self):
            return [self.d_loss_metric, self.g_loss_metric]

        def train_step(self, real_images):
            # Sample random points in the latent space
            batch_size = tf.shape(real_images)[0]
            random_latent_vectors = self.latents(batch_size)  # changed

            # Decode them to fake images
            generated_images = self.generator(random_latent_vectors)

            # Combine them with real images
            combined_images = tf.concat([generated_images, real_images], axis=0)

            # Assemble labels discriminating real from fake images
            labels = tf.concat(
                [tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0
            )
            # Add random noise to the labels - important trick!
            labels += 0.05 * self.label_noise(tf.shape(labels))  # changed

            # Train the discriminator
            with tf.GradientTape() as tape:
                predictions = self.discriminator(combined_images)
                d_loss = self.loss_fn(labels, predictions)
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply_gradients(
                zip(grads, self.discriminator.trainable_weights)
            )

            # Sample random points in the latent space
            random_latent_vectors = self.latents(batch_size)  # changed

            # Assemble labels that say "all real images"
            misleading_labels = tf.zeros((batch_size, 1))

            # Train the generator (note that we should *not* update the weights
            # of the discriminator)!
            with tf.GradientTape() as tape:
                predictions = self.discriminator(self.generator(random_latent_vectors))
                g_loss = self.loss_fn(misleading_labels, predictions)
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply_gradients(
                zip(grads, self.generator.trainable_weights)
            )

            # Update metrics
            self.d_loss_metric.update_state(d_loss)
            self.g_loss_metric.update_state(g_loss)
            return {
                "d_loss": self.d_loss_metric.result(),
                "g_loss": self.g_loss_metric.result(),
            }

    return GAN


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    draws = keras_io.DrawsFromData()

    class Trained(model_class(base)):
        def train_step(self, data):
            if not parity:
                return super().train_step(data)
            images, draws_of_step = data
            draws.hold(draws_of_step)
            return super().train_step(images)

        def latents(self, batch_size):
            if parity:
                return draws.next()
            return tf.random.normal(shape=(batch_size, self.latent_dim))

        def label_noise(self, shape):
            if parity:  # fake and real halves, as the labels are stacked
                fake, real = draws.next(), draws.next()
                return tf.cast(tf.concat([fake, real], axis=0), tf.float32)
            return tf.random.uniform(shape)

    with strategy.scope():
        discriminator = keras.Sequential(
            [
                keras.Input(shape=(8, 8, 3)),
                layers.Conv2D(8, kernel_size=4, strides=2, padding="same"),
                layers.LeakyReLU(negative_slope=0.2),
                layers.Conv2D(8, kernel_size=4, strides=2, padding="same"),
                layers.LeakyReLU(negative_slope=0.2),
                layers.Flatten(),
                layers.Dropout(0.0 if parity else 0.2),  # changed in parity mode
                layers.Dense(1, activation="sigmoid"),
            ],
            name="discriminator",
        )
        generator = keras.Sequential(
            [
                keras.Input(shape=(latent_dim,)),
                layers.Dense(2 * 2 * 8),
                layers.Reshape((2, 2, 8)),
                layers.Conv2DTranspose(8, kernel_size=4, strides=2, padding="same"),
                layers.LeakyReLU(negative_slope=0.2),
                layers.Conv2DTranspose(8, kernel_size=4, strides=2, padding="same"),
                layers.LeakyReLU(negative_slope=0.2),
                layers.Conv2D(3, kernel_size=5, padding="same", activation="sigmoid"),
            ],
            name="generator",
        )
        gan = Trained(
            discriminator=discriminator, generator=generator, latent_dim=latent_dim
        )
        gan.compile(
            d_optimizer=keras.optimizers.Adam(learning_rate=0.0001),
            g_optimizer=keras.optimizers.Adam(learning_rate=0.0001),
            loss_fn=keras.losses.BinaryCrossentropy(),
        )
    floatx = keras.config.floatx()
    rng = np.random.default_rng(1)
    images = rng.random((keras_io.SIZE, 8, 8, 3)).astype(floatx)
    if parity:
        latents = rng.normal(size=(2, keras_io.SIZE, latent_dim)).astype(floatx)
        noise = rng.random((2, keras_io.SIZE, 1)).astype(floatx)
        data = (images, (latents[0], noise[0], noise[1], latents[1]))
    else:
        data = images
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(keras_io.BATCH)
    history = gan.fit(dataset, epochs=keras_io.EPOCHS, verbose=0)
    return keras_io.result(gan, history)
