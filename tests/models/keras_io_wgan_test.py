"""The keras.io WGAN-GP (examples/generative/wgan_gp.py), its model code
copied as written with `keras_ctl.CTLModel` as its base, trains under a
strategy.

Its two optimizers are built on first use, inside the step, and its
discriminator applies updates several times a step: replica threads share
each optimizer, so one replica enters its next `apply` while another is
still inside the previous one (this crashed with "Values to regroup had
different lengths"). Its losses are `tf.reduce_mean`s over each replica's
examples, read as one device's (a step of one's own); the corpus compares
it with one device (`tests/support/keras_io/wgan_gp.py`).
"""

import devices
import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_ctl

LATENT_DIM = 4
D_STEPS = 2


class WGAN(keras_ctl.CTLModel):  # keras.io: `class WGAN(keras.Model)`
    def __init__(
        self,
        discriminator,
        generator,
        latent_dim,
        discriminator_extra_steps=3,
        gp_weight=10.0,
    ):
        super(WGAN, self).__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.d_steps = discriminator_extra_steps
        self.gp_weight = gp_weight

    def compile(self, d_optimizer, g_optimizer, d_loss_fn, g_loss_fn):
        super(WGAN, self).compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.d_loss_fn = d_loss_fn
        self.g_loss_fn = g_loss_fn

    def gradient_penalty(self, batch_size, real_images, fake_images):
        # get the interplated image
        alpha = tf.random.normal([batch_size, 1, 1, 1], 0.0, 1.0)
        diff = fake_images - real_images
        interpolated = real_images + alpha * diff

        with tf.GradientTape() as gp_tape:
            gp_tape.watch(interpolated)
            # 1. Get the discriminator output for this interpolated image.
            pred = self.discriminator(interpolated, training=True)

        # 2. Calculate the gradients w.r.t to this interpolated image.
        grads = gp_tape.gradient(pred, [interpolated])[0]
        # 3. Calcuate the norm of the gradients
        norm = tf.sqrt(tf.reduce_sum(tf.square(grads), axis=[1, 2, 3]))
        gp = tf.reduce_mean((norm - 1.0) ** 2)
        return gp

    def train_step(self, real_images):
        if isinstance(real_images, tuple):
            real_images = real_images[0]

        # Get the batch size
        batch_size = tf.shape(real_images)[0]

        for i in range(self.d_steps):  # noqa: B007 (as written)
            # Get the latent vector
            random_latent_vectors = tf.random.normal(
                shape=(batch_size, self.latent_dim)
            )
            with tf.GradientTape() as tape:
                # Generate fake images from the latent vector
                fake_images = self.generator(random_latent_vectors, training=True)
                # Get the logits for the fake images
                fake_logits = self.discriminator(fake_images, training=True)
                # Get the logits for real images
                real_logits = self.discriminator(real_images, training=True)

                # Calculate discriminator loss using fake and real logits
                d_cost = self.d_loss_fn(real_img=real_logits, fake_img=fake_logits)
                # Calculate the gradient penalty
                gp = self.gradient_penalty(batch_size, real_images, fake_images)
                # Add the gradient penalty to the original discriminator loss
                d_loss = d_cost + gp * self.gp_weight

            # Get the gradients w.r.t the discriminator loss
            d_gradient = tape.gradient(d_loss, self.discriminator.trainable_variables)
            # Update the weights of the discriminator using the discriminator optimizer
            self.d_optimizer.apply_gradients(
                zip(d_gradient, self.discriminator.trainable_variables)
            )

        # Train the generator now.
        # Get the latent vector
        random_latent_vectors = tf.random.normal(shape=(batch_size, self.latent_dim))
        with tf.GradientTape() as tape:
            # Generate fake images using the generator
            generated_images = self.generator(random_latent_vectors, training=True)
            # Get the discriminator logits for fake images
            gen_img_logits = self.discriminator(generated_images, training=True)
            # Calculate the generator loss
            g_loss = self.g_loss_fn(gen_img_logits)

        # Get the gradients w.r.t the generator loss
        gen_gradient = tape.gradient(g_loss, self.generator.trainable_variables)
        # Update the weights of the generator using the generator optimizer
        self.g_optimizer.apply_gradients(
            zip(gen_gradient, self.generator.trainable_variables)
        )
        return {"d_loss": d_loss, "g_loss": g_loss}


def discriminator_loss(real_img, fake_img):
    real_loss = tf.reduce_mean(real_img)
    fake_loss = tf.reduce_mean(fake_img)
    return fake_loss - real_loss


def generator_loss(fake_img):
    return -tf.reduce_mean(fake_img)


def test_the_wgan_gp_trains_under_a_strategy():
    with devices.get("mirrored").scope():
        discriminator = keras.Sequential(
            [keras.Input((4, 4, 1)), layers.Flatten(), layers.Dense(1)]
        )
        generator = keras.Sequential(
            [keras.Input((LATENT_DIM,)), layers.Dense(16), layers.Reshape((4, 4, 1))]
        )
        wgan = WGAN(discriminator, generator, LATENT_DIM, D_STEPS)
        wgan.compile(
            d_optimizer=keras.optimizers.Adam(0.0002, beta_1=0.5, beta_2=0.9),
            g_optimizer=keras.optimizers.Adam(0.0002, beta_1=0.5, beta_2=0.9),
            g_loss_fn=generator_loss,
            d_loss_fn=discriminator_loss,
        )
    kernels = [discriminator.layers[-1].kernel, generator.layers[0].kernel]
    before = [np.array(k) for k in kernels]
    images = np.random.default_rng(0).random((24, 4, 4, 1), dtype=np.float32)
    history = wgan.fit(images, batch_size=8, epochs=2, verbose=0).history
    # 3 batches an epoch, each replica's update applied once.
    assert int(wgan.d_optimizer.iterations.numpy()) == 2 * 3 * D_STEPS
    assert int(wgan.g_optimizer.iterations.numpy()) == 2 * 3
    assert all(np.isfinite(w).all() for w in wgan.get_weights())
    # Both models trained (the critic's bias has no gradient: its loss is
    # a difference of means).
    for kernel, old in zip(kernels, before, strict=True):
        assert np.abs(np.array(kernel) - old).max() > 1e-5
    assert len(history["d_loss"]) == 2 and np.isfinite(history["d_loss"]).all()
