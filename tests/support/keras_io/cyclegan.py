"""generative/cyclegan.py: `CycleGan`, four models and four optimizers
updated from one persistent tape, losses from Keras `Loss` objects
(`MeanAbsoluteError`, `MeanSquaredError`), raw loss tensors returned as
logs.

Changed: sizes (8x8 images; generators with one downsampling, one
residual and one upsampling block, discriminators with two downsampling
blocks); `tfa.layers.InstanceNormalization` is `GroupNormalization(groups=-1)`,
as in the example's Keras 3 version; its module-level `MeanSquaredError`
is made per run (a Keras `Loss` keeps the dtype it was made in). The step
has no random draws.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_io

SOURCE = "examples/generative/cyclegan.py"

input_img_size = (8, 8, 3)
kernel_init = keras.initializers.RandomNormal(mean=0.0, stddev=0.02)
gamma_init = keras.initializers.RandomNormal(mean=0.0, stddev=0.02)


def instance_normalization(gamma_initializer):  # changed: Keras 3's layer
    return layers.GroupNormalization(groups=-1, gamma_initializer=gamma_initializer)


class ReflectionPadding2D(layers.Layer):
    """Implements Reflection Padding as a layer."""

    def __init__(self, padding=(1, 1), **kwargs):
        self.padding = tuple(padding)
        super(ReflectionPadding2D, self).__init__(**kwargs)

    def call(self, input_tensor, mask=None):
        padding_width, padding_height = self.padding
        padding_tensor = [
            [0, 0],
            [padding_height, padding_height],
            [padding_width, padding_width],
            [0, 0],
        ]
        return tf.pad(input_tensor, padding_tensor, mode="REFLECT")


def residual_block(
    x,
    activation,
    kernel_initializer=kernel_init,
    kernel_size=(3, 3),
    strides=(1, 1),
    padding="valid",
    gamma_initializer=gamma_init,
    use_bias=False,
):
    dim = x.shape[-1]
    input_tensor = x

    x = ReflectionPadding2D()(input_tensor)
    x = layers.Conv2D(
        dim,
        kernel_size,
        strides=strides,
        kernel_initializer=kernel_initializer,
        padding=padding,
        use_bias=use_bias,
    )(x)
    x = instance_normalization(gamma_initializer)(x)
    x = activation(x)

    x = ReflectionPadding2D()(x)
    x = layers.Conv2D(
        dim,
        kernel_size,
        strides=strides,
        kernel_initializer=kernel_initializer,
        padding=padding,
        use_bias=use_bias,
    )(x)
    x = instance_normalization(gamma_initializer)(x)
    x = layers.add([input_tensor, x])
    return x


def downsample(
    x,
    filters,
    activation,
    kernel_initializer=kernel_init,
    kernel_size=(3, 3),
    strides=(2, 2),
    padding="same",
    gamma_initializer=gamma_init,
    use_bias=False,
):
    x = layers.Conv2D(
        filters,
        kernel_size,
        strides=strides,
        kernel_initializer=kernel_initializer,
        padding=padding,
        use_bias=use_bias,
    )(x)
    x = instance_normalization(gamma_initializer)(x)
    if activation:
        x = activation(x)
    return x


def upsample(
    x,
    filters,
    activation,
    kernel_size=(3, 3),
    strides=(2, 2),
    padding="same",
    kernel_initializer=kernel_init,
    gamma_initializer=gamma_init,
    use_bias=False,
):
    x = layers.Conv2DTranspose(
        filters,
        kernel_size,
        strides=strides,
        padding=padding,
        kernel_initializer=kernel_initializer,
        use_bias=use_bias,
    )(x)
    x = instance_normalization(gamma_initializer)(x)
    if activation:
        x = activation(x)
    return x


def get_resnet_generator(
    filters=4,
    num_downsampling_blocks=1,
    num_residual_blocks=1,
    num_upsample_blocks=1,
    gamma_initializer=gamma_init,
    name=None,
):
    img_input = layers.Input(shape=input_img_size, name=name + "_img_input")
    x = ReflectionPadding2D(padding=(3, 3))(img_input)
    x = layers.Conv2D(filters, (7, 7), kernel_initializer=kernel_init, use_bias=False)(
        x
    )
    x = instance_normalization(gamma_initializer)(x)
    x = layers.Activation("relu")(x)

    # Downsampling
    for _ in range(num_downsampling_blocks):
        filters *= 2
        x = downsample(x, filters=filters, activation=layers.Activation("relu"))

    # Residual blocks
    for _ in range(num_residual_blocks):
        x = residual_block(x, activation=layers.Activation("relu"))

    # Upsampling
    for _ in range(num_upsample_blocks):
        filters //= 2
        x = upsample(x, filters, activation=layers.Activation("relu"))

    # Final block
    x = ReflectionPadding2D(padding=(3, 3))(x)
    x = layers.Conv2D(3, (7, 7), padding="valid")(x)
    x = layers.Activation("tanh")(x)

    model = keras.models.Model(img_input, x, name=name)
    return model


def get_discriminator(
    filters=4, kernel_initializer=kernel_init, num_downsampling=2, name=None
):
    img_input = layers.Input(shape=input_img_size, name=name + "_img_input")
    x = layers.Conv2D(
        filters,
        (4, 4),
        strides=(2, 2),
        padding="same",
        kernel_initializer=kernel_initializer,
    )(img_input)
    x = layers.LeakyReLU(0.2)(x)

    num_filters = filters
    for num_downsample_block in range(num_downsampling):
        num_filters *= 2
        if num_downsample_block < num_downsampling - 1:  # changed: was `< 2`
            x = downsample(
                x,
                filters=num_filters,
                activation=layers.LeakyReLU(0.2),
                kernel_size=(4, 4),
                strides=(2, 2),
            )
        else:
            x = downsample(
                x,
                filters=num_filters,
                activation=layers.LeakyReLU(0.2),
                kernel_size=(4, 4),
                strides=(1, 1),
            )

    x = layers.Conv2D(
        1, (4, 4), strides=(1, 1), padding="same", kernel_initializer=kernel_initializer
    )(x)

    model = keras.models.Model(inputs=img_input, outputs=x, name=name)
    return model


def model_class(base):
    class CycleGan(base):
        def __init__(
            self,
            generator_G,
            generator_F,
            discriminator_X,
            discriminator_Y,
            lambda_cycle=10.0,
            lambda_identity=0.5,
        ):
            super(CycleGan, self).__init__()
            self.gen_G = generator_G
            self.gen_F = generator_F
            self.disc_X = discriminator_X
            self.disc_Y = discriminator_Y
            self.lambda_cycle = lambda_cycle
            self.lambda_identity = lambda_identity

        def call(self, inputs):
            return (
                self.disc_X(inputs),
                self.disc_Y(inputs),
                self.gen_G(inputs),
                self.gen_F(inputs),
            )

        def compile(
            self,
            gen_G_optimizer,
            gen_F_optimizer,
            disc_X_optimizer,
            disc_Y_optimizer,
            gen_loss_fn,
            disc_loss_fn,
        ):
            super(CycleGan, self).compile()
            self.gen_G_optimizer = gen_G_optimizer
            self.gen_F_optimizer = gen_F_optimizer
            self.disc_X_optimizer = disc_X_optimizer
            self.disc_Y_optimizer = disc_Y_optimizer
            self.generator_loss_fn = gen_loss_fn
            self.discriminator_loss_fn = disc_loss_fn
            self.cycle_loss_fn = keras.losses.MeanAbsoluteError()
            self.identity_loss_fn = keras.losses.MeanAbsoluteError()

        def train_step(self, batch_data):
            # x is Horse and y is zebra
            real_x, real_y = batch_data

            with tf.GradientTape(persistent=True) as tape:
                # Horse to fake zebra
                fake_y = self.gen_G(real_x, training=True)
                # Zebra to fake horse -> y2x
                fake_x = self.gen_F(real_y, training=True)

                # Cycle (Horse to fake zebra to fake horse): x -> y -> x
                cycled_x = self.gen_F(fake_y, training=True)
                # Cycle (Zebra to fake horse to fake zebra) y -> x -> y
                cycled_y = self.gen_G(fake_x, training=True)

                # Identity mapping
                same_x = self.gen_F(real_x, training=True)
                same_y = self.gen_G(real_y, training=True)

                # Discriminator output
                disc_real_x = self.disc_X(real_x, training=True)
                disc_fake_x = self.disc_X(fake_x, training=True)

                disc_real_y = self.disc_Y(real_y, training=True)
                disc_fake_y = self.disc_Y(fake_y, training=True)

                # Generator adverserial loss
                gen_G_loss = self.generator_loss_fn(disc_fake_y)
                gen_F_loss = self.generator_loss_fn(disc_fake_x)

                # Generator cycle loss
                cycle_loss_G = self.cycle_loss_fn(real_y, cycled_y) * self.lambda_cycle
                cycle_loss_F = self.cycle_loss_fn(real_x, cycled_x) * self.lambda_cycle

                # Generator identity loss
                id_loss_G = (
                    self.identity_loss_fn(real_y, same_y)
                    * self.lambda_cycle
                    * self.lambda_identity
                )
                id_loss_F = (
                    self.identity_loss_fn(real_x, same_x)
                    * self.lambda_cycle
                    * self.lambda_identity
                )

                # Total generator loss
                total_loss_G = gen_G_loss + cycle_loss_G + id_loss_G
                total_loss_F = gen_F_loss + cycle_loss_F + id_loss_F

                # Discriminator loss
                disc_X_loss = self.discriminator_loss_fn(disc_real_x, disc_fake_x)
                disc_Y_loss = self.discriminator_loss_fn(disc_real_y, disc_fake_y)

            # Get the gradients for the generators
            grads_G = tape.gradient(total_loss_G, self.gen_G.trainable_variables)
            grads_F = tape.gradient(total_loss_F, self.gen_F.trainable_variables)

            # Get the gradients for the discriminators
            disc_X_grads = tape.gradient(disc_X_loss, self.disc_X.trainable_variables)
            disc_Y_grads = tape.gradient(disc_Y_loss, self.disc_Y.trainable_variables)

            # Update the weights of the generators
            self.gen_G_optimizer.apply_gradients(
                zip(grads_G, self.gen_G.trainable_variables)
            )
            self.gen_F_optimizer.apply_gradients(
                zip(grads_F, self.gen_F.trainable_variables)
            )

            # Update the weights of the discriminators
            self.disc_X_optimizer.apply_gradients(
                zip(disc_X_grads, self.disc_X.trainable_variables)
            )
            self.disc_Y_optimizer.apply_gradients(
                zip(disc_Y_grads, self.disc_Y.trainable_variables)
            )

            return {
                "G_loss": total_loss_G,
                "F_loss": total_loss_F,
                "D_X_loss": disc_X_loss,
                "D_Y_loss": disc_Y_loss,
            }

    return CycleGan


def loss_functions():  # changed: made per run, in the run's dtype
    # Loss function for evaluating adversarial loss
    adv_loss_fn = keras.losses.MeanSquaredError()

    # Define the loss function for the generators
    def generator_loss_fn(fake):
        fake_loss = adv_loss_fn(tf.ones_like(fake), fake)
        return fake_loss

    # Define the loss function for the discriminators
    def discriminator_loss_fn(real, fake):
        real_loss = adv_loss_fn(tf.ones_like(real), real)
        fake_loss = adv_loss_fn(tf.zeros_like(fake), fake)
        return (real_loss + fake_loss) * 0.5

    return generator_loss_fn, discriminator_loss_fn


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    generator_loss_fn, discriminator_loss_fn = loss_functions()
    with strategy.scope():
        gen_G = get_resnet_generator(name="generator_G")
        gen_F = get_resnet_generator(name="generator_F")
        disc_X = get_discriminator(name="discriminator_X")
        disc_Y = get_discriminator(name="discriminator_Y")
        cycle_gan_model = model_class(base)(
            generator_G=gen_G,
            generator_F=gen_F,
            discriminator_X=disc_X,
            discriminator_Y=disc_Y,
        )
        cycle_gan_model.compile(
            gen_G_optimizer=keras.optimizers.Adam(learning_rate=2e-4, beta_1=0.5),
            gen_F_optimizer=keras.optimizers.Adam(learning_rate=2e-4, beta_1=0.5),
            disc_X_optimizer=keras.optimizers.Adam(learning_rate=2e-4, beta_1=0.5),
            disc_Y_optimizer=keras.optimizers.Adam(learning_rate=2e-4, beta_1=0.5),
            gen_loss_fn=generator_loss_fn,
            disc_loss_fn=discriminator_loss_fn,
        )
    rng = np.random.default_rng(4)
    horses, zebras = (
        tf.data.Dataset.from_tensor_slices(
            rng.uniform(-1, 1, (keras_io.SIZE, *input_img_size)).astype(
                keras.config.floatx()
            )
        ).batch(keras_io.BATCH)
        for _ in range(2)
    )
    history = cycle_gan_model.fit(
        tf.data.Dataset.zip((horses, zebras)), epochs=keras_io.EPOCHS, verbose=0
    )
    return keras_io.result(cycle_gan_model, history)
