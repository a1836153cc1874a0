"""generative/wgan_gp.py: `WGAN`, a critic trained `discriminator_extra_steps`
times a step with a gradient penalty (a tape inside the tape), then the
generator; its losses are `tf.reduce_mean`s of the replica's logits, and
it logs the last `d_loss` and `g_loss` as values.

Its local means are read as one device's (a step of one's own). The
generator's `BatchNormalization` layers are `synchronized=True` in parity
mode: normalizing each replica's examples by themselves is 1.8e-2
relative off one device on 2 replicas (float64, draws from the data), the
difference docs/good-to-know.md names. So changed, it equals one device
on 2 and 3 replicas (float64, 6.0e-16 on 3: replicas of 3, 3 and 2
examples, whose moments' gradient is one device's,
`_replicas.sum_read_as_one_device`). As written it runs too: its two
optimizers are built on first use, inside the step, and its critic
applies updates several times a step, with replica threads sharing each
optimizer (this once crashed with "Values to regroup had different
lengths").

Changed: sizes (12x12 images, padded to 16 by the critic and cropped from
16 by the generator as the example's 28 and 32 are; latent 4; filters 2 to
8). The step's random draws (a latent batch and the penalty's `alpha` for
each critic step, a latent batch for the generator) go through
`self.latents(...)` and `self.alphas(...)`, which in parity mode take them
from the data; the critic's `Dropout` rates are 0.0 in parity mode.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_io

SOURCE = "examples/generative/wgan_gp.py"

IMG_SHAPE = (12, 12, 1)
noise_dim = 4
D_STEPS = 3


def conv_block(
    x,
    filters,
    activation,
    kernel_size=(3, 3),
    strides=(1, 1),
    padding="same",
    use_bias=True,
    use_bn=False,
    use_dropout=False,
    drop_value=0.5,
):
    x = layers.Conv2D(
        filters, kernel_size, strides=strides, padding=padding, use_bias=use_bias
    )(x)
    if use_bn:
        x = layers.BatchNormalization()(x)
    x = activation(x)
    if use_dropout:
        x = layers.Dropout(drop_value)(x)
    return x


def get_discriminator_model(parity):
    drop = 0.0 if parity else 0.3  # changed in parity mode
    img_input = layers.Input(shape=IMG_SHAPE)
    # Zero pad the input to make the input images size to (16, 16, 1).
    x = layers.ZeroPadding2D((2, 2))(img_input)
    x = conv_block(
        x,
        2,
        kernel_size=(5, 5),
        strides=(2, 2),
        use_bn=False,
        use_bias=True,
        activation=layers.LeakyReLU(0.2),
        use_dropout=False,
        drop_value=drop,
    )
    x = conv_block(
        x,
        4,
        kernel_size=(5, 5),
        strides=(2, 2),
        use_bn=False,
        activation=layers.LeakyReLU(0.2),
        use_bias=True,
        use_dropout=True,
        drop_value=drop,
    )
    x = conv_block(
        x,
        4,
        kernel_size=(5, 5),
        strides=(2, 2),
        use_bn=False,
        activation=layers.LeakyReLU(0.2),
        use_bias=True,
        use_dropout=True,
        drop_value=drop,
    )
    x = conv_block(
        x,
        8,
        kernel_size=(5, 5),
        strides=(2, 2),
        use_bn=False,
        activation=layers.LeakyReLU(0.2),
        use_bias=True,
        use_dropout=False,
        drop_value=drop,
    )

    x = layers.Flatten()(x)
    x = layers.Dropout(0.0 if parity else 0.2)(x)  # changed in parity mode
    x = layers.Dense(1)(x)

    d_model = keras.models.Model(img_input, x, name="discriminator")
    return d_model


def upsample_block(
    x,
    filters,
    activation,
    kernel_size=(3, 3),
    strides=(1, 1),
    up_size=(2, 2),
    padding="same",
    use_bn=False,
    use_bias=True,
    use_dropout=False,
    drop_value=0.3,
    synchronized=False,  # changed: synchronized BatchNorm in parity mode
):
    x = layers.UpSampling2D(up_size)(x)
    x = layers.Conv2D(
        filters, kernel_size, strides=strides, padding=padding, use_bias=use_bias
    )(x)

    if use_bn:
        x = layers.BatchNormalization(synchronized=synchronized)(x)  # changed

    if activation:
        x = activation(x)
    if use_dropout:
        x = layers.Dropout(drop_value)(x)
    return x


def get_generator_model(parity):
    synchronized = parity  # changed in parity mode
    noise = layers.Input(shape=(noise_dim,))
    x = layers.Dense(2 * 2 * 8, use_bias=False)(noise)
    x = layers.BatchNormalization(synchronized=synchronized)(x)  # changed
    x = layers.LeakyReLU(0.2)(x)

    x = layers.Reshape((2, 2, 8))(x)
    x = upsample_block(
        x,
        8,
        layers.LeakyReLU(0.2),
        strides=(1, 1),
        use_bias=False,
        use_bn=True,
        padding="same",
        use_dropout=False,
        synchronized=synchronized,  # changed
    )
    x = upsample_block(
        x,
        4,
        layers.LeakyReLU(0.2),
        strides=(1, 1),
        use_bias=False,
        use_bn=True,
        padding="same",
        use_dropout=False,
        synchronized=synchronized,  # changed
    )
    x = upsample_block(
        x,
        1,
        layers.Activation("tanh"),
        strides=(1, 1),
        use_bias=False,
        use_bn=True,
        synchronized=synchronized,  # changed
    )
    # At this point, we have an output which has the shape (16, 16, 1).
    # We will use a Cropping2D layer to make it (12, 12, 1).
    x = layers.Cropping2D((2, 2))(x)

    g_model = keras.models.Model(noise, x, name="generator")
    return g_model


def model_class(base):
    class WGAN(base):
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
            """Calculates the gradient penalty.

            This loss is calculated on an interpolated image
            and added to the discriminator loss.
            """
            # Get the interpolated image
            alpha = self.alphas([batch_size, 1, 1, 1])  # changed
            diff = fake_images - real_images
            interpolated = real_images + alpha * diff

            with tf.GradientTape() as gp_tape:
                gp_tape.watch(interpolated)
                # 1. Get the discriminator output for this interpolated image.
                pred = self.discriminator(interpolated, training=True)

            # 2. Calculate the gradients w.r.t to this interpolated image.
            grads = gp_tape.gradient(pred, [interpolated])[0]
            # 3. Calculate the norm of the gradients.
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
                random_latent_vectors = self.latents(
                    shape=(batch_size, self.latent_dim)
                )  # changed
                with tf.GradientTape() as tape:
                    # Generate fake images from the latent vector
                    fake_images = self.generator(random_latent_vectors, training=True)
                    # Get the logits for the fake images
                    fake_logits = self.discriminator(fake_images, training=True)
                    # Get the logits for the real images
                    real_logits = self.discriminator(real_images, training=True)

                    # Calculate the discriminator loss using the fake and real
                    # image logits
                    d_cost = self.d_loss_fn(real_img=real_logits, fake_img=fake_logits)
                    # Calculate the gradient penalty
                    gp = self.gradient_penalty(batch_size, real_images, fake_images)
                    # Add the gradient penalty to the original discriminator loss
                    d_loss = d_cost + gp * self.gp_weight

                # Get the gradients w.r.t the discriminator loss
                d_gradient = tape.gradient(
                    d_loss, self.discriminator.trainable_variables
                )
                # Update the weights of the discriminator using the
                # discriminator optimizer
                self.d_optimizer.apply_gradients(
                    zip(d_gradient, self.discriminator.trainable_variables)
                )

            # Train the generator
            # Get the latent vector
            random_latent_vectors = self.latents(
                shape=(batch_size, self.latent_dim)
            )  # changed
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

    return WGAN


def discriminator_loss(real_img, fake_img):
    real_loss = tf.reduce_mean(real_img)
    fake_loss = tf.reduce_mean(fake_img)
    return fake_loss - real_loss


def generator_loss(fake_img):
    return -tf.reduce_mean(fake_img)


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

        def latents(self, shape):
            if parity:
                return draws.next()
            return tf.random.normal(shape=shape)

        def alphas(self, shape):
            if parity:
                return draws.next()
            return tf.random.normal(shape, 0.0, 1.0)

    with strategy.scope():
        wgan = Trained(
            discriminator=get_discriminator_model(parity),
            generator=get_generator_model(parity),
            latent_dim=noise_dim,
            discriminator_extra_steps=D_STEPS,
        )
        wgan.compile(
            d_optimizer=keras.optimizers.Adam(
                learning_rate=0.0002, beta_1=0.5, beta_2=0.9
            ),
            g_optimizer=keras.optimizers.Adam(
                learning_rate=0.0002, beta_1=0.5, beta_2=0.9
            ),
            g_loss_fn=generator_loss,
            d_loss_fn=discriminator_loss,
        )
    floatx = keras.config.floatx()
    rng = np.random.default_rng(10)
    train_images = (2 * rng.random((keras_io.SIZE, *IMG_SHAPE)) - 1).astype(floatx)
    if parity:  # in the step's order: (latent, alpha) per critic step, latent
        step_draws = []
        for _ in range(D_STEPS):
            step_draws.append(rng.normal(size=(keras_io.SIZE, noise_dim)))
            step_draws.append(rng.normal(size=(keras_io.SIZE, 1, 1, 1)))
        step_draws.append(rng.normal(size=(keras_io.SIZE, noise_dim)))
        data = (train_images, tuple(d.astype(floatx) for d in step_draws))
    else:
        data = train_images
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(keras_io.BATCH)
    history = wgan.fit(dataset, epochs=keras_io.EPOCHS, verbose=0)
    return keras_io.result(wgan, history)
