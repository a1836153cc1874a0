"""generative/conditional_gan.py: `ConditionalGAN`, its labels concatenated
with the latent vectors and, as channels, with the images.

Changed: sizes (8x8 images, 3 classes, latent 4, smaller layers); the two
latent draws of a step go through `self.latents(...)`, which in parity mode
takes them from the data.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_io

SOURCE = "examples/generative/conditional_gan.py"

batch_size = keras_io.BATCH
num_channels = 1
num_classes = 3
image_size = 8
latent_dim = 4


def model_class(base):
    class ConditionalGAN(base):
        def __init__(self, discriminator, generator, latent_dim):
            super(ConditionalGAN, self).__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim
            self.gen_loss_tracker = keras.metrics.Mean(name="generator_loss")
            self.disc_loss_tracker = keras.metrics.Mean(name="discriminator_loss")

        @property
        def metrics(self):
            return [self.gen_loss_tracker, self.disc_loss_tracker]

        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super(ConditionalGAN, self).compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.loss_fn = loss_fn

        def train_step(self, data):
            # Unpack the data.
            real_images, one_hot_labels = data

            # Add dummy dimensions to the labels so that they can be concatenated with
            # the images. This is for the discriminator.
            image_one_hot_labels = one_hot_labels[:, :, None, None]
            image_one_hot_labels = tf.repeat(
                image_one_hot_labels, repeats=[image_size * image_size]
            )
            image_one_hot_labels = tf.reshape(
                image_one_hot_labels, (-1, image_size, image_size, num_classes)
            )

            # Sample random points in the latent space and concatenate the labels.
            # This is for the generator.
            batch_size = tf.shape(real_images)[0]
            random_latent_vectors = self.latents(batch_size)  # changed
            random_vector_labels = tf.concat(
                [random_latent_vectors, one_hot_labels], axis=1
            )

            # Decode the noise (guided by labels) to fake images.
            generated_images = self.generator(random_vector_labels)

            # Combine them with real images. Note that we are concatenating the labels
            # with these images here.
            fake_image_and_labels = tf.concat(
                [generated_images, image_one_hot_labels], -1
            )
            real_image_and_labels = tf.concat([real_images, image_one_hot_labels], -1)
            combined_images = tf.concat(
                [fake_image_and_labels, real_image_and_labels], axis=0
            )

            # Assemble labels discriminating real from fake images.
            labels = tf.concat(
                [tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0
            )

            # Train the discriminator.
            with tf.GradientTape() as tape:
                predictions = self.discriminator(combined_images)
                d_loss = self.loss_fn(labels, predictions)
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply_gradients(
                zip(grads, self.discriminator.trainable_weights)
            )

            # Sample random points in the latent space.
            random_latent_vectors = self.latents(batch_size)  # changed
            random_vector_labels = tf.concat(
                [random_latent_vectors, one_hot_labels], axis=1
            )

            # Assemble labels that say "all real images".
            misleading_labels = tf.zeros((batch_size, 1))

            # Train the generator (note that we should *not* update the weights
            # of the discriminator)!
            with tf.GradientTape() as tape:
                fake_images = self.generator(random_vector_labels)
                fake_image_and_labels = tf.concat(
                    [fake_images, image_one_hot_labels], -1
                )
                predictions = self.discriminator(fake_image_and_labels)
                g_loss = self.loss_fn(misleading_labels, predictions)
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply_gradients(
                zip(grads, self.generator.trainable_weights)
            )

            # Monitor loss.
            self.gen_loss_tracker.update_state(g_loss)
            self.disc_loss_tracker.update_state(d_loss)
            return {
                "g_loss": self.gen_loss_tracker.result(),
                "d_loss": self.disc_loss_tracker.result(),
            }

    return ConditionalGAN


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    generator_in_channels = latent_dim + num_classes
    discriminator_in_channels = num_channels + num_classes
    draws = keras_io.DrawsFromData()

    class Trained(model_class(base)):
        def train_step(self, data):
            if not parity:
                return super().train_step(data)
            (images, *latents), labels = data
            draws.hold(latents)
            return super().train_step((images, labels))

        def latents(self, batch_size):
            if parity:
                return draws.next()
            return tf.random.normal(shape=(batch_size, self.latent_dim))

    with strategy.scope():
        discriminator = keras.Sequential(
            [
                keras.layers.InputLayer(
                    (image_size, image_size, discriminator_in_channels)
                ),
                layers.Conv2D(8, (3, 3), strides=(2, 2), padding="same"),
                layers.LeakyReLU(negative_slope=0.2),
                layers.Conv2D(8, (3, 3), strides=(2, 2), padding="same"),
                layers.LeakyReLU(negative_slope=0.2),
                layers.GlobalMaxPooling2D(),
                layers.Dense(1),
            ],
            name="discriminator",
        )
        generator = keras.Sequential(
            [
                keras.layers.InputLayer((generator_in_channels,)),
                layers.Dense(2 * 2 * generator_in_channels),
                layers.LeakyReLU(negative_slope=0.2),
                layers.Reshape((2, 2, generator_in_channels)),
                layers.Conv2DTranspose(8, (4, 4), strides=(2, 2), padding="same"),
                layers.LeakyReLU(negative_slope=0.2),
                layers.Conv2DTranspose(8, (4, 4), strides=(2, 2), padding="same"),
                layers.LeakyReLU(negative_slope=0.2),
                layers.Conv2D(1, (3, 3), padding="same", activation="sigmoid"),
            ],
            name="generator",
        )
        cond_gan = Trained(
            discriminator=discriminator, generator=generator, latent_dim=latent_dim
        )
        cond_gan.compile(
            d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
            g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
            loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
        )
    floatx = keras.config.floatx()
    rng = np.random.default_rng(0)
    images = rng.random((keras_io.SIZE, image_size, image_size, 1)).astype(floatx)
    labels = np.eye(num_classes, dtype=floatx)[
        rng.integers(0, num_classes, keras_io.SIZE)
    ]
    if parity:
        latents = rng.normal(size=(2, keras_io.SIZE, latent_dim)).astype(floatx)
        x = (images, latents[0], latents[1])
    else:
        x = images
    dataset = tf.data.Dataset.from_tensor_slices((x, labels)).batch(batch_size)
    history = cond_gan.fit(dataset, epochs=keras_io.EPOCHS, verbose=0)
    return keras_io.result(cond_gan, history)
