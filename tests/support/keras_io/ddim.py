"""generative/ddim.py: `DiffusionModel(image_size, widths, block_depth)`,
whose `train_step` normalizes the images (an adapted `Normalization`),
draws a noise image and a diffusion time for each example, mixes them by
the cosine schedule, has the residual U-Net predict the noise, takes the
compiled loss, `keras.losses.mean_absolute_error` (a function: a value
per pixel, the mean over the channels only), of the noises and of the
images, applies the gradient of the noise loss, updates two `Mean`
trackers and moves the EMA network's weights towards the network's.

`tape.gradient` of the per-pixel loss sums it over the batch's examples
and pixels: a sum over examples, not a mean. Read as one device's code,
each replica's gradient would be weighed by its part; the first batch's
measurement finds the sum and runs the step in shares, where each
replica's sum is its share of the global batch's. Its plain
`BatchNormalization` layers normalize each replica's examples: parity
mode compiles the `CTLModel` with `batch_statistics="global"`; as written
they keep each replica's, warned of. As written, the step draws its noises
with the example's global `batch_size` (here 8), which a replica's part of
the batch does not have: on 2 replicas the first batch's measurement
stops on TensorFlow's "Incompatible shapes: [8,1,1,1] vs. [2,8,8,3]" (the
published pipeline drops the last batch, so on one device every batch has
that size). In parity mode the step equals one device on 2 and 3
replicas (float64: 1.6e-15 and 2.0e-15; float32 on 3: 2.7e-7).

Changed: sizes (8x8 images; widths `[8, 8]`, block depth 1, 8 embedding
dimensions; the published batch size is the corpus's, 8, and the last
batch is kept, not dropped); the step's random draws (the noises and the
diffusion times) go through `self.draw_noises(images)` and
`self.draw_times(images)`, which in parity mode take them from the data;
`KID` is a `Mean` named "kid" (the example's needs InceptionV3's ImageNet
weights, a download; only `test_step` updates it, which `fit()` without
validation data never calls), and sampling, plotting and the checkpoint
callback are left out; `keras.optimizers.experimental.AdamW` is
`keras.optimizers.AdamW`; the schedule's constants are in the run's dtype.
"""

import math

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_io

SOURCE = "examples/generative/ddim.py"

image_size = 8  # changed: 64

# sampling
min_signal_rate = 0.02
max_signal_rate = 0.95

# architecture
embedding_dims = 8  # changed: 32
embedding_max_frequency = 1000.0
widths = [8, 8]  # changed: [32, 64, 96, 128]
block_depth = 1  # changed: 2

# optimization
batch_size = keras_io.BATCH  # changed: 64
ema = 0.999
learning_rate = 1e-3
weight_decay = 1e-4


# changed: registered, for `clone_model` to find it (Keras 3)
@keras.saving.register_keras_serializable(package="keras_io_ddim")
def sinusoidal_embedding(x):
    embedding_min_frequency = 1.0
    frequencies = tf.exp(
        tf.linspace(
            tf.math.log(tf.cast(embedding_min_frequency, x.dtype)),  # changed
            tf.math.log(tf.cast(embedding_max_frequency, x.dtype)),  # changed
            embedding_dims // 2,
        )
    )
    angular_speeds = 2.0 * math.pi * frequencies
    embeddings = tf.concat(
        [tf.sin(angular_speeds * x), tf.cos(angular_speeds * x)], axis=3
    )
    return embeddings


def ResidualBlock(width):
    def apply(x):
        input_width = x.shape[3]
        if input_width == width:
            residual = x
        else:
            residual = layers.Conv2D(width, kernel_size=1)(x)
        x = layers.BatchNormalization(center=False, scale=False)(x)
        x = layers.Conv2D(
            width, kernel_size=3, padding="same", activation=keras.activations.swish
        )(x)
        x = layers.Conv2D(width, kernel_size=3, padding="same")(x)
        x = layers.Add()([x, residual])
        return x

    return apply


def DownBlock(width, block_depth):
    def apply(x):
        x, skips = x
        for _ in range(block_depth):
            x = ResidualBlock(width)(x)
            skips.append(x)
        x = layers.AveragePooling2D(pool_size=2)(x)
        return x

    return apply


def UpBlock(width, block_depth):
    def apply(x):
        x, skips = x
        x = layers.UpSampling2D(size=2, interpolation="bilinear")(x)
        for _ in range(block_depth):
            x = layers.Concatenate()([x, skips.pop()])
            x = ResidualBlock(width)(x)
        return x

    return apply


def get_network(image_size, widths, block_depth):
    noisy_images = keras.Input(shape=(image_size, image_size, 3))
    noise_variances = keras.Input(shape=(1, 1, 1))

    e = layers.Lambda(sinusoidal_embedding)(noise_variances)
    e = layers.UpSampling2D(size=image_size, interpolation="nearest")(e)

    x = layers.Conv2D(widths[0], kernel_size=1)(noisy_images)
    x = layers.Concatenate()([x, e])

    skips = []
    for width in widths[:-1]:
        x = DownBlock(width, block_depth)([x, skips])

    for _ in range(block_depth):
        x = ResidualBlock(widths[-1])(x)

    for width in reversed(widths[:-1]):
        x = UpBlock(width, block_depth)([x, skips])

    x = layers.Conv2D(3, kernel_size=1, kernel_initializer="zeros")(x)

    return keras.Model([noisy_images, noise_variances], x, name="residual_unet")


def model_class(base):
    class DiffusionModel(base):
        def __init__(self, image_size, widths, block_depth):
            super().__init__()

            self.normalizer = layers.Normalization()
            self.network = get_network(image_size, widths, block_depth)
            self.ema_network = keras.models.clone_model(self.network)

        def compile(self, **kwargs):
            super().compile(**kwargs)

            self.noise_loss_tracker = keras.metrics.Mean(name="n_loss")
            self.image_loss_tracker = keras.metrics.Mean(name="i_loss")
            self.kid = keras.metrics.Mean(name="kid")  # changed: KID(name="kid")

        @property
        def metrics(self):
            return [self.noise_loss_tracker, self.image_loss_tracker, self.kid]

        def diffusion_schedule(self, diffusion_times):
            # diffusion times -> angles
            dtype = diffusion_times.dtype  # changed: the run's dtype
            start_angle = tf.acos(tf.constant(max_signal_rate, dtype))  # changed
            end_angle = tf.acos(tf.constant(min_signal_rate, dtype))  # changed

            diffusion_angles = start_angle + diffusion_times * (end_angle - start_angle)

            # angles -> signal and noise rates
            signal_rates = tf.cos(diffusion_angles)
            noise_rates = tf.sin(diffusion_angles)
            # note that their squared sum is always: sin^2(x) + cos^2(x) = 1

            return noise_rates, signal_rates

        def denoise(self, noisy_images, noise_rates, signal_rates, training):
            # the exponential moving average weights are used at evaluation
            if training:
                network = self.network
            else:
                network = self.ema_network

            # predict noise component and calculate the image component using it
            pred_noises = network([noisy_images, noise_rates**2], training=training)
            pred_images = (noisy_images - noise_rates * pred_noises) / signal_rates

            return pred_noises, pred_images

        def train_step(self, images):
            # normalize images to have standard deviation of 1, like the noises
            images = self.normalizer(images, training=True)
            noises = self.draw_noises(images)  # changed

            # sample uniform random diffusion times
            diffusion_times = self.draw_times(images)  # changed
            noise_rates, signal_rates = self.diffusion_schedule(diffusion_times)
            # mix the images with noises accordingly
            noisy_images = signal_rates * images + noise_rates * noises

            with tf.GradientTape() as tape:
                # train the network to separate noisy images to their components
                pred_noises, pred_images = self.denoise(
                    noisy_images, noise_rates, signal_rates, training=True
                )

                noise_loss = self.loss(noises, pred_noises)  # used for training
                image_loss = self.loss(images, pred_images)  # only used as metric

            gradients = tape.gradient(noise_loss, self.network.trainable_weights)
            self.optimizer.apply_gradients(
                zip(gradients, self.network.trainable_weights)
            )

            self.noise_loss_tracker.update_state(noise_loss)
            self.image_loss_tracker.update_state(image_loss)

            # track the exponential moving averages of weights
            for weight, ema_weight in zip(
                self.network.weights, self.ema_network.weights
            ):
                ema_weight.assign(ema * ema_weight + (1 - ema) * weight)

            # KID is not measured during the training phase for computational efficiency
            return {m.name: m.result() for m in self.metrics[:-1]}

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

        def draw_noises(self, images):
            if parity:
                return draws.next()
            return tf.random.normal(shape=(batch_size, image_size, image_size, 3))

        def draw_times(self, images):
            if parity:
                return draws.next()
            return tf.random.uniform(
                shape=(batch_size, 1, 1, 1), minval=0.0, maxval=1.0
            )

    floatx = keras.config.floatx()
    rng = np.random.default_rng(3)
    shape = (keras_io.SIZE, image_size, image_size, 3)
    images = rng.random(shape).astype(floatx)
    with strategy.scope():
        model = Trained(image_size, widths, block_depth)
        options = {}
        if parity and base is not keras.Model:  # changed: synchronized moments
            options["batch_statistics"] = "global"
        model.compile(
            optimizer=keras.optimizers.AdamW(
                learning_rate=learning_rate, weight_decay=weight_decay
            ),
            loss=keras.losses.mean_absolute_error,
            **options,
        )
        # calculate mean and variance of training dataset for normalization
        model.normalizer.adapt(images)
    if parity:  # in the step's order: noises, diffusion times
        noises = rng.normal(size=shape).astype(floatx)
        times = rng.random((keras_io.SIZE, 1, 1, 1)).astype(floatx)
        data = (images, (noises, times))
    else:
        data = images
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(keras_io.BATCH)
    history = model.fit(dataset, epochs=keras_io.EPOCHS, verbose=0)
    return keras_io.result(model, history)
