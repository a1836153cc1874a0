"""generative/gan_ada.py: `GAN_ADA()`, a DCGAN (BatchNorm in both networks,
the discriminator's applied to the real and the generated images
separately) whose `compile()` takes two optimizers and makes five
trackers and a KID metric, whose `train_step` augments the real and the
generated images with `AdaptiveAugmenter` (Keras's random flip,
translation, rotation and zoom, each image augmented when a uniform draw
is below `probability`, a non-trainable variable), updates both networks
from one persistent tape, then sets `probability` from the discriminator's
accuracy on the batch's real images (`ops.mean` of their signs) and moves
an EMA copy of the generator's weights; its `test_step` measures the KID
(kernel means over the pairs of the batch's examples) of the EMA
generator's images.

Under replicas, as written, the BatchNorm statistics, the accuracy that
sets `probability` and the KID are each the replica's examples'. The
accuracy is NaN on a replica without examples, and `probability` (a
`keras.Variable`, aggregation NONE) keeps each replica's own copy: after
2 epochs on 2 replicas its copies are 0.255 and NaN, and `aug_p` logs NaN
from the second epoch on, so it does not run as written. Parity mode takes
every random draw from the data (the latent vectors; each augmentation layer's
uniform draws, through `DrawnBackend`; the augmentation choice), sets the
dropout rate to 0.0, makes the BatchNorms `synchronized=True`, and
gathers the real logits (`keras_ctl.all_gather`) before the accuracy that
sets `probability`, and the KID's features before its kernels, so every
replica computes the global batch's values (without the first gather, 2
replicas differ from one device by 5.9e-2 in float64: `aug_p`, whose
second replica's copy is again NaN). On 3 replicas float64 differs by
1e-10 (on 2, 1e-15): the generator's weights, where Adam normalizes
gradients that are round-off (its first BatchNorm makes the Dense
kernel's gradient 0 on the batch of one example).

Changed:

- the step's `batch_size` is the batch's (`ops.shape(...)[0]`), where the
  published step reads the global hyperparameter `batch_size` (its batches
  are all full, `drop_remainder=True`): in `AdaptiveAugmenter.call`, in
  the two calls of `generate` and in `adversarial_loss` (the labels made
  like the logits);
- the KID's pretrained InceptionV3 (at 75x75) is one frozen random
  convolution at 12x12 (`kid_image_size`); its feature count and batch
  size are cast to the run's dtype, not float32;
- sizes: 16x16 images, `depth` 2, `width` 4, `noise_size` 4 (published
  64x64, 4, 128, 64); `target_accuracy` 0.2 and `integration_steps` 10
  (published 0.85 and 1000), so that `probability` moves, and images are
  augmented, within 6 steps;
- in parity mode `DrawnBackend` also converts Python floats to tensors
  of the run's dtype: Keras 3.15's `RandomRotation` fails in float64 (its
  angles, of the run's dtype, times a float32 `math.pi / 180`);
- the Caltech Birds data (tensorflow_datasets) are random images, the
  validation set 16 of them (two full batches: the KID divides by
  `batch_size * (batch_size - 1)`); the summaries, the plotting callback
  and the checkpoint are left out.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers
from keras import ops

import keras_ctl
import keras_io

SOURCE = "examples/generative/gan_ada.py"

# data
image_size = 16  # changed: 64
# resolution of Kernel Inception Distance measurement, see related section
kid_image_size = 12  # changed: 75

# adaptive discriminator augmentation
max_translation = 0.125
max_rotation = 0.125
max_zoom = 0.25
target_accuracy = 0.2  # changed: 0.85
integration_steps = 10  # changed: 1000

# architecture
noise_size = 4  # changed: 64
depth = 2  # changed: 4
width = 4  # changed: 128
leaky_relu_slope = 0.2
dropout_rate = 0.4

# optimization
learning_rate = 2e-4
beta_1 = 0.5  # not using the default value of 0.9 is important
ema = 0.99

# changed: set by train(), parity mode's settings
settings = {"dropout_rate": dropout_rate, "synchronized": False}


class KID(keras.metrics.Metric):
    gather = False  # changed: the global batch's features, in parity mode

    def __init__(self, name="kid", **kwargs):
        super().__init__(name=name, **kwargs)

        # KID is estimated per batch and is averaged across batches
        self.kid_tracker = keras.metrics.Mean()

        # changed: one frozen random convolution for the pretrained InceptionV3
        self.encoder = keras.Sequential(
            [
                layers.InputLayer(input_shape=(image_size, image_size, 3)),
                layers.Rescaling(255.0),
                layers.Resizing(height=kid_image_size, width=kid_image_size),
                layers.Lambda(keras.applications.inception_v3.preprocess_input),
                layers.Conv2D(8, 3, strides=2, activation="relu", trainable=False),
                layers.GlobalAveragePooling2D(),
            ],
            name="inception_encoder",
        )

    def polynomial_kernel(self, features_1, features_2):
        feature_dimensions = ops.cast(
            ops.shape(features_1)[1], features_1.dtype
        )  # changed: the run's dtype
        return (
            features_1 @ ops.transpose(features_2) / feature_dimensions + 1.0
        ) ** 3.0

    def update_state(self, real_images, generated_images, sample_weight=None):
        real_features = self.encoder(real_images, training=False)
        generated_features = self.encoder(generated_images, training=False)
        if self.gather:  # changed: the global batch's features
            real_features = keras_ctl.all_gather(real_features)
            generated_features = keras_ctl.all_gather(generated_features)

        # compute polynomial kernels using the two sets of features
        kernel_real = self.polynomial_kernel(real_features, real_features)
        kernel_generated = self.polynomial_kernel(
            generated_features, generated_features
        )
        kernel_cross = self.polynomial_kernel(real_features, generated_features)

        # estimate the squared maximum mean discrepancy using the average kernel values
        batch_size = ops.shape(real_features)[0]
        batch_size_f = ops.cast(batch_size, real_features.dtype)  # changed
        mean_kernel_real = ops.sum(kernel_real * (1.0 - ops.eye(batch_size))) / (
            batch_size_f * (batch_size_f - 1.0)
        )
        mean_kernel_generated = ops.sum(
            kernel_generated * (1.0 - ops.eye(batch_size))
        ) / (batch_size_f * (batch_size_f - 1.0))
        mean_kernel_cross = ops.mean(kernel_cross)
        kid = mean_kernel_real + mean_kernel_generated - 2.0 * mean_kernel_cross

        # update the average KID estimate
        self.kid_tracker.update_state(kid)

    def result(self):
        return self.kid_tracker.result()

    def reset_state(self):
        self.kid_tracker.reset_state()


# "hard sigmoid", useful for binary accuracy calculation from logits
def step(values):
    # negative values -> 0.0, positive values -> 1.0
    return 0.5 * (1.0 + ops.sign(values))


# augments images with a probability that is dynamically updated during training
class AdaptiveAugmenter(keras.Model):
    draws = None  # changed: the data's draws, in parity mode

    def __init__(self):
        super().__init__()

        # stores the current probability of an image being augmented
        self.probability = keras.Variable(0.0)
        self.seed_generator = keras.random.SeedGenerator(42)

        # the corresponding augmentation names from the paper are shown above each layer
        # the authors show (see figure 4), that the blitting and geometric augmentations
        # are the most helpful in the low-data regime
        self.augmenter = keras.Sequential(
            [
                layers.InputLayer(input_shape=(image_size, image_size, 3)),
                # blitting/x-flip:
                layers.RandomFlip("horizontal"),
                # blitting/integer translation:
                layers.RandomTranslation(
                    height_factor=max_translation,
                    width_factor=max_translation,
                    interpolation="nearest",
                ),
                # geometric/rotation:
                layers.RandomRotation(factor=max_rotation),
                # geometric/isotropic and anisotropic scaling:
                layers.RandomZoom(
                    height_factor=(-max_zoom, 0.0), width_factor=(-max_zoom, 0.0)
                ),
            ],
            name="adaptive_augmenter",
        )

    def call(self, images, training):
        if training:
            augmented_images = self.augmenter(images, training=training)

            # during training either the original or the augmented images are selected
            # based on self.probability
            augmentation_values = self.uniform(
                shape=(ops.shape(images)[0], 1, 1, 1)
            )  # changed
            augmentation_bools = ops.less(augmentation_values, self.probability)

            images = ops.where(augmentation_bools, augmented_images, images)
        return images

    def uniform(self, shape):  # changed: the draw from the data in parity mode
        if self.draws is not None:
            return drawn_uniform(self.draws, shape)
        return keras.random.uniform(shape=shape, seed=self.seed_generator)

    def update(self, real_logits):
        if self.draws is not None:  # changed: the global batch's logits
            real_logits = keras_ctl.all_gather(real_logits)
        current_accuracy = ops.mean(step(real_logits))

        # the augmentation probability is updated based on the discriminator's
        # accuracy on real images
        accuracy_error = current_accuracy - target_accuracy
        self.probability.assign(
            ops.clip(self.probability + accuracy_error / integration_steps, 0.0, 1.0)
        )


def drawn_uniform(draws, shape, minval=0.0, maxval=1.0, dtype=None):
    """The next of the data's uniform draws (one per example), shaped
    `shape` (batch first) and scaled to `[minval, maxval)`. A replica
    without examples holds none, and its layers a placeholder example:
    its draw is 0."""
    values = ops.reshape(draws.next(), (-1,))
    count = shape[0]
    values = ops.concatenate([values, ops.zeros((count,), values.dtype)])[:count]
    values = ops.reshape(values, shape)
    values = minval + values * (maxval - minval)
    return ops.cast(values, dtype or keras.config.floatx())


class DrawnBackend:
    """A Keras preprocessing layer's `backend` in parity mode: its uniform
    draws (`self.backend.random.uniform`, the only random function of
    `RandomFlip`, `RandomTranslation`, `RandomRotation` and `RandomZoom`)
    taken from the data, the rest the layer's own backend (but for Python
    floats converted to tensors, below)."""

    def __init__(self, backend, draws):
        self._wrapped = backend
        self._draws = draws

    def __getattr__(self, name):
        if name == "random":
            return self
        return getattr(self._wrapped, name)

    def set_backend(self, backend):
        self._wrapped.set_backend(backend)

    def reset(self):
        self._wrapped.reset()

    def uniform(self, shape, minval=0.0, maxval=1.0, dtype=None, seed=None):
        del seed
        return drawn_uniform(self._draws, shape, minval, maxval, dtype)

    def convert_to_tensor(self, x, dtype=None, **kwargs):
        # `RandomRotation` multiplies its angles (of the run's dtype) by
        # `convert_to_tensor(math.pi / 180.0)`, a float32 tensor: in float64
        # Keras 3.15's layer fails. A Python float here is of the run's dtype.
        if dtype is None and isinstance(x, float):
            dtype = keras.config.floatx()
        return self._wrapped.convert_to_tensor(x, dtype=dtype, **kwargs)


# DCGAN generator
def get_generator():
    sync = settings["synchronized"]  # changed: True in parity mode
    noise_input = keras.Input(shape=(noise_size,))
    x = layers.Dense(4 * 4 * width, use_bias=False)(noise_input)
    x = layers.BatchNormalization(scale=False, synchronized=sync)(x)  # changed
    x = layers.ReLU()(x)
    x = layers.Reshape(target_shape=(4, 4, width))(x)
    for _ in range(depth - 1):
        x = layers.Conv2DTranspose(
            width,
            kernel_size=4,
            strides=2,
            padding="same",
            use_bias=False,
        )(x)
        x = layers.BatchNormalization(scale=False, synchronized=sync)(x)  # changed
        x = layers.ReLU()(x)
    image_output = layers.Conv2DTranspose(
        3,
        kernel_size=4,
        strides=2,
        padding="same",
        activation="sigmoid",
    )(x)

    return keras.Model(noise_input, image_output, name="generator")


# DCGAN discriminator
def get_discriminator():
    sync = settings["synchronized"]  # changed: True in parity mode
    image_input = keras.Input(shape=(image_size, image_size, 3))
    x = image_input
    for _ in range(depth):
        x = layers.Conv2D(
            width,
            kernel_size=4,
            strides=2,
            padding="same",
            use_bias=False,
        )(x)
        x = layers.BatchNormalization(scale=False, synchronized=sync)(x)  # changed
        x = layers.LeakyReLU(alpha=leaky_relu_slope)(x)
    x = layers.Flatten()(x)
    x = layers.Dropout(settings["dropout_rate"])(x)  # changed in parity mode: 0.0
    output_score = layers.Dense(1)(x)

    return keras.Model(image_input, output_score, name="discriminator")


def model_class(base):
    class GAN_ADA(base):
        def __init__(self):
            super().__init__()

            self.seed_generator = keras.random.SeedGenerator(seed=42)
            self.augmenter = AdaptiveAugmenter()
            self.generator = get_generator()
            self.ema_generator = keras.models.clone_model(self.generator)
            self.discriminator = get_discriminator()

            # changed: the summaries left out
            # we have created all layers at this point, so we can mark the model
            # as having been built
            self.built = True

        def compile(self, generator_optimizer, discriminator_optimizer, **kwargs):
            super().compile(**kwargs)

            # separate optimizers for the two networks
            self.generator_optimizer = generator_optimizer
            self.discriminator_optimizer = discriminator_optimizer

            self.generator_loss_tracker = keras.metrics.Mean(name="g_loss")
            self.discriminator_loss_tracker = keras.metrics.Mean(name="d_loss")
            self.real_accuracy = keras.metrics.BinaryAccuracy(name="real_acc")
            self.generated_accuracy = keras.metrics.BinaryAccuracy(name="gen_acc")
            self.augmentation_probability_tracker = keras.metrics.Mean(name="aug_p")
            self.kid = KID()

        @property
        def metrics(self):
            return [
                self.generator_loss_tracker,
                self.discriminator_loss_tracker,
                self.real_accuracy,
                self.generated_accuracy,
                self.augmentation_probability_tracker,
                self.kid,
            ]

        def generate(self, batch_size, training):
            latent_samples = self.latents(batch_size)  # changed
            # use ema_generator during inference
            if training:
                generated_images = self.generator(latent_samples, training=training)
            else:
                generated_images = self.ema_generator(latent_samples, training=training)
            return generated_images

        def latents(self, batch_size):  # changed: the draw, a hook for parity mode
            return keras.random.normal(
                shape=(batch_size, noise_size), seed=self.seed_generator
            )

        def adversarial_loss(self, real_logits, generated_logits):
            # this is usually called the non-saturating GAN loss

            real_labels = ops.ones_like(real_logits)  # changed: the batch's size
            generated_labels = ops.zeros_like(generated_logits)  # changed

            # the generator tries to produce images that the discriminator considers as real
            generator_loss = keras.losses.binary_crossentropy(
                real_labels, generated_logits, from_logits=True
            )
            # the discriminator tries to determine if images are real or generated
            discriminator_loss = keras.losses.binary_crossentropy(
                ops.concatenate([real_labels, generated_labels], axis=0),
                ops.concatenate([real_logits, generated_logits], axis=0),
                from_logits=True,
            )

            return ops.mean(generator_loss), ops.mean(discriminator_loss)

        def train_step(self, real_images):
            real_images = self.augmenter(real_images, training=True)

            # use persistent gradient tape because gradients will be calculated twice
            with tf.GradientTape(persistent=True) as tape:
                generated_images = self.generate(
                    ops.shape(real_images)[0], training=True
                )  # changed: the batch's size
                # gradient is calculated through the image augmentation
                generated_images = self.augmenter(generated_images, training=True)

                # separate forward passes for the real and generated images, meaning
                # that batch normalization is applied separately
                real_logits = self.discriminator(real_images, training=True)
                generated_logits = self.discriminator(generated_images, training=True)

                generator_loss, discriminator_loss = self.adversarial_loss(
                    real_logits, generated_logits
                )

            # calculate gradients and update weights
            generator_gradients = tape.gradient(
                generator_loss, self.generator.trainable_weights
            )
            discriminator_gradients = tape.gradient(
                discriminator_loss, self.discriminator.trainable_weights
            )
            self.generator_optimizer.apply_gradients(
                zip(generator_gradients, self.generator.trainable_weights)
            )
            self.discriminator_optimizer.apply_gradients(
                zip(discriminator_gradients, self.discriminator.trainable_weights)
            )

            # update the augmentation probability based on the discriminator's performance
            self.augmenter.update(real_logits)

            self.generator_loss_tracker.update_state(generator_loss)
            self.discriminator_loss_tracker.update_state(discriminator_loss)
            self.real_accuracy.update_state(1.0, step(real_logits))
            self.generated_accuracy.update_state(0.0, step(generated_logits))
            self.augmentation_probability_tracker.update_state(
                self.augmenter.probability
            )

            # track the exponential moving average of the generator's weights to decrease
            # variance in the generation quality
            for weight, ema_weight in zip(
                self.generator.weights, self.ema_generator.weights
            ):
                ema_weight.assign(ema * ema_weight + (1 - ema) * weight)

            # KID is not measured during the training phase for computational efficiency
            return {m.name: m.result() for m in self.metrics[:-1]}

        def test_step(self, real_images):
            generated_images = self.generate(
                ops.shape(real_images)[0], training=False
            )  # changed: the batch's size

            self.kid.update_state(real_images, generated_images)

            # only KID is measured during the evaluation phase for computational efficiency
            return {self.kid.name: self.kid.result()}

    return GAN_ADA


# The parity mode's draws of one step: the real images' augmentation (the
# six uniform draws of the four layers, then the choice), the latent
# vectors, the generated images' augmentation.
AUGMENTATION_DRAWS = 7


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    draws = keras_io.DrawsFromData()
    settings["dropout_rate"] = 0.0 if parity else dropout_rate
    settings["synchronized"] = parity

    class Trained(model_class(base)):
        def train_step(self, data):
            if not parity:
                return super().train_step(data)
            images, draws_of_step = data
            draws.hold(draws_of_step)
            return super().train_step(images)

        def test_step(self, data):
            if not parity:
                return super().test_step(data)
            images, latents = data
            draws.hold([latents])
            return super().test_step(images)

        def latents(self, batch_size):
            if parity:
                return draws.next()
            return super().latents(batch_size)

    with strategy.scope():
        model = Trained()
        model.compile(
            generator_optimizer=keras.optimizers.Adam(learning_rate, beta_1),
            discriminator_optimizer=keras.optimizers.Adam(learning_rate, beta_1),
        )
    if parity:
        model.augmenter.draws = draws
        model.kid.gather = True
        for layer in model.augmenter.augmenter.layers:
            layer.backend = DrawnBackend(layer.backend, draws)

    floatx = keras.config.floatx()
    rng = np.random.default_rng(10)
    images = rng.random((keras_io.SIZE, image_size, image_size, 3)).astype(floatx)
    val_images = rng.random((16, image_size, image_size, 3)).astype(floatx)
    if parity:

        def augmentation():
            return [
                rng.random(keras_io.SIZE).astype(floatx)
                for _ in range(AUGMENTATION_DRAWS)
            ]

        latents = rng.normal(size=(keras_io.SIZE, noise_size)).astype(floatx)
        data = (images, (*augmentation(), latents, *augmentation()))
        val_latents = rng.normal(size=(16, noise_size)).astype(floatx)
        val_data = (val_images, val_latents)
    else:
        data, val_data = images, val_images
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(keras_io.BATCH)
    validation = tf.data.Dataset.from_tensor_slices(val_data).batch(keras_io.BATCH)
    history = model.fit(
        dataset, epochs=keras_io.EPOCHS, validation_data=validation, verbose=0
    )
    return keras_io.result(model, history)
