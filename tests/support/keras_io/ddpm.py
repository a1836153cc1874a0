"""generative/ddpm.py: `DiffusionModel(network, ema_network, timesteps,
gdf_util)`, whose `train_step` draws a timestep and a noise image for each
example, diffuses the images, takes the compiled `self.loss` (a mean
squared error: the replica's local mean) of the UNet's noise prediction,
applies the gradients, then moves each weight of the EMA network towards
the network's with `assign` inside the step, and logs the step's loss as a
value.

Its local mean is read as one device's (a step of one's own); the EMA
update reads weights that are the same on every replica. The UNet's
`GroupNormalization` normalizes each example by itself, so nothing couples
the batch's examples. Changed: sizes (8x8 images; one level of width 8, so
no down- or upsampling, with the middle block's attention; one residual
block a level; 8 first-convolution channels); the diffusion constants and the attention scale are in the
run's dtype (the example makes them float32); the step's random draws (the
timesteps and the noise) go through `self.draw_timesteps(...)` and
`self.draw_noise(...)`, which in parity mode take them from the data; the
example's `generate_images` and `plot_images` (sampling, matplotlib) and
`GaussianDiffusion`'s methods for sampling are left out, `fit()` never
calls them. The step's returned `{"loss": loss}` has the keys of the
model's metrics (the compiled loss tracker, never updated), so Keras 3's
`fit()` logs the tracker's result, 0, as the loss: as published.
"""

import math

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_io

SOURCE = "examples/generative/ddpm.py"

total_timesteps = 1000
norm_groups = 8  # Number of groups used in GroupNormalization layer
learning_rate = 2e-4

img_size = 8  # changed: 64 in the example
img_channels = 3
clip_min = -1.0
clip_max = 1.0

first_conv_channels = 8  # changed: 64
channel_multiplier = [1]  # changed: [1, 2, 4, 8]
widths = [first_conv_channels * mult for mult in channel_multiplier]
has_attention = [False]  # changed: [False, False, True, True]
num_res_blocks = 1  # changed: 2


class GaussianDiffusion:
    """Gaussian diffusion utility.

    Args:
        beta_start: Start value of the scheduled variance
        beta_end: End value of the scheduled variance
        timesteps: Number of time steps in the forward process
    """

    def __init__(
        self,
        beta_start=1e-4,
        beta_end=0.02,
        timesteps=1000,
        clip_min=-1.0,
        clip_max=1.0,
    ):
        self.beta_start = beta_start
        self.beta_end = beta_end
        self.timesteps = timesteps
        self.clip_min = clip_min
        self.clip_max = clip_max

        # Define the linear variance schedule
        self.betas = betas = np.linspace(
            beta_start,
            beta_end,
            timesteps,
            dtype=np.float64,  # Using float64 for better precision
        )
        self.num_timesteps = int(timesteps)

        alphas = 1.0 - betas
        alphas_cumprod = np.cumprod(alphas, axis=0)
        alphas_cumprod_prev = np.append(1.0, alphas_cumprod[:-1])

        dtype = keras.config.floatx()  # changed: the run's dtype, not float32
        self.betas = tf.constant(betas, dtype=dtype)  # changed
        self.alphas_cumprod = tf.constant(alphas_cumprod, dtype=dtype)  # changed
        self.alphas_cumprod_prev = tf.constant(
            alphas_cumprod_prev, dtype=dtype
        )  # changed

        # Calculations for diffusion q(x_t | x_{t-1}) and others
        self.sqrt_alphas_cumprod = tf.constant(
            np.sqrt(alphas_cumprod), dtype=dtype
        )  # changed

        self.sqrt_one_minus_alphas_cumprod = tf.constant(
            np.sqrt(1.0 - alphas_cumprod), dtype=dtype
        )  # changed

        self.log_one_minus_alphas_cumprod = tf.constant(
            np.log(1.0 - alphas_cumprod), dtype=dtype
        )  # changed

        self.sqrt_recip_alphas_cumprod = tf.constant(
            np.sqrt(1.0 / alphas_cumprod), dtype=dtype
        )  # changed
        self.sqrt_recipm1_alphas_cumprod = tf.constant(
            np.sqrt(1.0 / alphas_cumprod - 1), dtype=dtype
        )  # changed

        # Calculations for posterior q(x_{t-1} | x_t, x_0)
        posterior_variance = (
            betas * (1.0 - alphas_cumprod_prev) / (1.0 - alphas_cumprod)
        )
        self.posterior_variance = tf.constant(
            posterior_variance, dtype=dtype
        )  # changed

        # Log calculation clipped because the posterior variance is 0 at the beginning
        # of the diffusion chain
        self.posterior_log_variance_clipped = tf.constant(
            np.log(np.maximum(posterior_variance, 1e-20)), dtype=dtype
        )  # changed

        self.posterior_mean_coef1 = tf.constant(
            betas * np.sqrt(alphas_cumprod_prev) / (1.0 - alphas_cumprod),
            dtype=dtype,  # changed
        )

        self.posterior_mean_coef2 = tf.constant(
            (1.0 - alphas_cumprod_prev) * np.sqrt(alphas) / (1.0 - alphas_cumprod),
            dtype=dtype,  # changed
        )

    def _extract(self, a, t, x_shape):
        """Extract some coefficients at specified timesteps,
        then reshape to [batch_size, 1, 1, 1, 1, ...] for broadcasting purposes.

        Args:
            a: Tensor to extract from
            t: Timestep for which the coefficients are to be extracted
            x_shape: Shape of the current batched samples
        """
        batch_size = x_shape[0]
        out = tf.gather(a, t)
        return tf.reshape(out, [batch_size, 1, 1, 1])

    def q_sample(self, x_start, t, noise):
        """Diffuse the data.

        Args:
            x_start: Initial sample (before the first diffusion step)
            t: Current timestep
            noise: Gaussian noise to be added at the current timestep
        Returns:
            Diffused samples at timestep `t`
        """
        x_start_shape = tf.shape(x_start)
        return (
            self._extract(self.sqrt_alphas_cumprod, t, tf.shape(x_start)) * x_start
            + self._extract(self.sqrt_one_minus_alphas_cumprod, t, x_start_shape)
            * noise
        )


# Kernel initializer to use
def kernel_init(scale):
    scale = max(scale, 1e-10)
    return keras.initializers.VarianceScaling(
        scale, mode="fan_avg", distribution="uniform"
    )


class AttentionBlock(layers.Layer):
    """Applies self-attention.

    Args:
        units: Number of units in the dense layers
        groups: Number of groups to be used for GroupNormalization layer
    """

    def __init__(self, units, groups=8, **kwargs):
        self.units = units
        self.groups = groups
        super().__init__(**kwargs)

        self.norm = layers.GroupNormalization(groups=groups)
        self.query = layers.Dense(units, kernel_initializer=kernel_init(1.0))
        self.key = layers.Dense(units, kernel_initializer=kernel_init(1.0))
        self.value = layers.Dense(units, kernel_initializer=kernel_init(1.0))
        self.proj = layers.Dense(units, kernel_initializer=kernel_init(0.0))

    def call(self, inputs):
        batch_size = tf.shape(inputs)[0]
        height = tf.shape(inputs)[1]
        width = tf.shape(inputs)[2]
        scale = tf.cast(self.units, self.compute_dtype) ** (-0.5)  # changed

        inputs = self.norm(inputs)
        q = self.query(inputs)
        k = self.key(inputs)
        v = self.value(inputs)

        attn_score = tf.einsum("bhwc, bHWc->bhwHW", q, k) * scale
        attn_score = tf.reshape(attn_score, [batch_size, height, width, height * width])

        attn_score = tf.nn.softmax(attn_score, -1)
        attn_score = tf.reshape(attn_score, [batch_size, height, width, height, width])

        proj = tf.einsum("bhwHW,bHWc->bhwc", attn_score, v)
        proj = self.proj(proj)
        return inputs + proj


class TimeEmbedding(layers.Layer):
    def __init__(self, dim, **kwargs):
        super().__init__(**kwargs)
        self.dim = dim
        self.half_dim = dim // 2
        self.emb = math.log(10000) / (self.half_dim - 1)
        self.emb = tf.exp(tf.range(self.half_dim, dtype=tf.float32) * -self.emb)

    def call(self, inputs):
        inputs = tf.cast(inputs, dtype=tf.float32)
        emb = inputs[:, None] * self.emb[None, :]
        emb = tf.concat([tf.sin(emb), tf.cos(emb)], axis=-1)
        return emb


def ResidualBlock(width, groups=8, activation_fn=keras.activations.swish):
    def apply(inputs):
        x, t = inputs
        input_width = x.shape[3]

        if input_width == width:
            residual = x
        else:
            residual = layers.Conv2D(
                width, kernel_size=1, kernel_initializer=kernel_init(1.0)
            )(x)

        temb = activation_fn(t)
        temb = layers.Dense(width, kernel_initializer=kernel_init(1.0))(temb)[
            :, None, None, :
        ]

        x = layers.GroupNormalization(groups=groups)(x)
        x = activation_fn(x)
        x = layers.Conv2D(
            width, kernel_size=3, padding="same", kernel_initializer=kernel_init(1.0)
        )(x)

        x = layers.Add()([x, temb])
        x = layers.GroupNormalization(groups=groups)(x)
        x = activation_fn(x)

        x = layers.Conv2D(
            width, kernel_size=3, padding="same", kernel_initializer=kernel_init(0.0)
        )(x)
        x = layers.Add()([x, residual])
        return x

    return apply


def DownSample(width):
    def apply(x):
        x = layers.Conv2D(
            width,
            kernel_size=3,
            strides=2,
            padding="same",
            kernel_initializer=kernel_init(1.0),
        )(x)
        return x

    return apply


def UpSample(width, interpolation="nearest"):
    def apply(x):
        x = layers.UpSampling2D(size=2, interpolation=interpolation)(x)
        x = layers.Conv2D(
            width, kernel_size=3, padding="same", kernel_initializer=kernel_init(1.0)
        )(x)
        return x

    return apply


def TimeMLP(units, activation_fn=keras.activations.swish):
    def apply(inputs):
        temb = layers.Dense(
            units, activation=activation_fn, kernel_initializer=kernel_init(1.0)
        )(inputs)
        temb = layers.Dense(units, kernel_initializer=kernel_init(1.0))(temb)
        return temb

    return apply


def build_model(
    img_size,
    img_channels,
    widths,
    has_attention,
    num_res_blocks=2,
    norm_groups=8,
    interpolation="nearest",
    activation_fn=keras.activations.swish,
):
    image_input = layers.Input(
        shape=(img_size, img_size, img_channels), name="image_input"
    )
    time_input = keras.Input(shape=(), dtype=tf.int64, name="time_input")

    x = layers.Conv2D(
        first_conv_channels,
        kernel_size=(3, 3),
        padding="same",
        kernel_initializer=kernel_init(1.0),
    )(image_input)

    temb = TimeEmbedding(dim=first_conv_channels * 4)(time_input)
    temb = TimeMLP(units=first_conv_channels * 4, activation_fn=activation_fn)(temb)

    skips = [x]

    # DownBlock
    for i in range(len(widths)):
        for _ in range(num_res_blocks):
            x = ResidualBlock(
                widths[i], groups=norm_groups, activation_fn=activation_fn
            )([x, temb])
            if has_attention[i]:
                x = AttentionBlock(widths[i], groups=norm_groups)(x)
            skips.append(x)

        if widths[i] != widths[-1]:
            x = DownSample(widths[i])(x)
            skips.append(x)

    # MiddleBlock
    x = ResidualBlock(widths[-1], groups=norm_groups, activation_fn=activation_fn)(
        [x, temb]
    )
    x = AttentionBlock(widths[-1], groups=norm_groups)(x)
    x = ResidualBlock(widths[-1], groups=norm_groups, activation_fn=activation_fn)(
        [x, temb]
    )

    # UpBlock
    for i in reversed(range(len(widths))):
        for _ in range(num_res_blocks + 1):
            x = layers.Concatenate(axis=-1)([x, skips.pop()])
            x = ResidualBlock(
                widths[i], groups=norm_groups, activation_fn=activation_fn
            )([x, temb])
            if has_attention[i]:
                x = AttentionBlock(widths[i], groups=norm_groups)(x)

        if i != 0:
            x = UpSample(widths[i], interpolation=interpolation)(x)

    # End block
    x = layers.GroupNormalization(groups=norm_groups)(x)
    x = activation_fn(x)
    x = layers.Conv2D(3, (3, 3), padding="same", kernel_initializer=kernel_init(0.0))(x)
    return keras.Model([image_input, time_input], x, name="unet")


def model_class(base):
    class DiffusionModel(base):
        def __init__(self, network, ema_network, timesteps, gdf_util, ema=0.999):
            super().__init__()
            self.network = network
            self.ema_network = ema_network
            self.timesteps = timesteps
            self.gdf_util = gdf_util
            self.ema = ema

        def train_step(self, images):
            # 1. Get the batch size
            batch_size = tf.shape(images)[0]

            # 2. Sample timesteps uniformly
            t = self.draw_timesteps(batch_size)  # changed

            with tf.GradientTape() as tape:
                # 3. Sample random noise to be added to the images in the batch
                noise = self.draw_noise(images)  # changed

                # 4. Diffuse the images with noise
                images_t = self.gdf_util.q_sample(images, t, noise)

                # 5. Pass the diffused images and time steps to the network
                pred_noise = self.network([images_t, t], training=True)

                # 6. Calculate the loss
                loss = self.loss(noise, pred_noise)

            # 7. Get the gradients
            gradients = tape.gradient(loss, self.network.trainable_weights)

            # 8. Update the weights of the network
            self.optimizer.apply_gradients(
                zip(gradients, self.network.trainable_weights)
            )

            # 9. Updates the weight values for the network with EMA weights
            for weight, ema_weight in zip(
                self.network.weights, self.ema_network.weights
            ):
                ema_weight.assign(self.ema * ema_weight + (1 - self.ema) * weight)

            # 10. Return loss values
            return {"loss": loss}

    return DiffusionModel


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

        def draw_timesteps(self, batch_size):
            if parity:
                return draws.next()
            return tf.random.uniform(
                minval=0, maxval=self.timesteps, shape=(batch_size,), dtype=tf.int64
            )

        def draw_noise(self, images):
            if parity:
                return draws.next()
            return tf.random.normal(shape=tf.shape(images), dtype=images.dtype)

    def unet():
        return build_model(
            img_size=img_size,
            img_channels=img_channels,
            widths=widths,
            has_attention=has_attention,
            num_res_blocks=num_res_blocks,
            norm_groups=norm_groups,
            activation_fn=keras.activations.swish,
        )

    with strategy.scope():
        network = unet()
        ema_network = unet()
        ema_network.set_weights(network.get_weights())
        gdf_util = GaussianDiffusion(timesteps=total_timesteps)
        model = Trained(
            network=network,
            ema_network=ema_network,
            gdf_util=gdf_util,
            timesteps=total_timesteps,
        )
        model.compile(
            loss=keras.losses.MeanSquaredError(),
            optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        )
    floatx = keras.config.floatx()
    rng = np.random.default_rng(3)
    shape = (keras_io.SIZE, img_size, img_size, img_channels)
    images = rng.uniform(clip_min, clip_max, size=shape).astype(floatx)
    if parity:  # in the step's order: timesteps, noise
        t = rng.integers(0, total_timesteps, size=keras_io.SIZE, dtype=np.int64)
        noise = rng.normal(size=shape).astype(floatx)
        data = (images, (t, noise))
    else:
        data = images
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(keras_io.BATCH)
    history = model.fit(dataset, epochs=keras_io.EPOCHS, verbose=0)
    return keras_io.result(model, history)
