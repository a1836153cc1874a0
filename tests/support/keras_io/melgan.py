"""audio/melgan_spectrogram_inversion.py: `MelGAN(generator,
discriminator)`, whose `compile()` takes two optimizers (Adam with
`clipnorm=1`) and three loss functions and makes two loss trackers, and
whose `train_step` runs the generator (a dB mel spectrogram layer, then
weight-normalized convolutions) and the three-scale discriminator under
two tapes at once: the generator's loss (a mean of `MeanSquaredError`s of
the discriminator's scores) plus 10 times the feature matching loss (a
mean of `MeanAbsoluteError`s of every feature map), and the
discriminator's loss, each a mean of Keras `Loss` objects' values, each
applied by its own optimizer.

The step has no random draws and is read as one device's code. But
`MelSpec` floors the batch's dB values at 80 dB below the largest of the
whole batch (`ops.amax` over every axis): under replicas, as written, the
largest of the replica's examples. The data mix loud and quiet examples
(per-example gains from 1e-3 to 1e2; the batches' dB values span -58.9 to
37.5, -57.0 to 29.9 and -45.5 to -25.8), so the floor binds, and as
written 2 replicas differ from one device by 8.5e-3 (float64). Parity
mode gathers the dB values (`keras_ctl.all_gather`) before their largest,
so every replica floors at the global batch's. A replica without examples
gives `MelSpec` a placeholder of zeros, whose mel energies are 0 (the
`ops.maximum(mel, 1e-6)` keeps the log finite; the version before Keras 3
took `tfio.audio.dbscale`, singular at 0); `all_gather` leaves its row
out.

The example's Keras 3 version (its own `WeightNormalization` layer).
Changed:

- the step calls `self.generator` and `self.discriminator`, where the
  published step calls the script's global `generator` and
  `discriminator` (the same models there);
- `WeightNormalization` runs a wrapped `Conv1DTranspose` with
  `tf.nn.conv1d_transpose`: as published it runs every wrapped layer with
  `tf.nn.conv1d`, which takes a transposed kernel `(16, filters, inputs)`
  as a strided grouped convolution, so the generator downsamples instead
  of upsampling (its output one sample long, compared with the audio by
  broadcasting) and, grouped, has no gradient on CPU ("Gradients for
  grouped convolutions are not supported on CPU");
- the discriminator's convolutions are not grouped (`groups=1`), for that
  same missing gradient;
- sizes: audio of 256 samples (one STFT frame of the published 1024 and
  hop 256, which the generator upsamples back into 256 samples); 16
  filters for the first convolution, then two blocks upsampling 16 times
  each, of 8 and 4 filters (published 512, then four blocks upsampling 8,
  8, 2 and 2 times, of 256, 128, 64 and 32 filters: tracing the step takes
  about half as long with two); discriminator maps of 4 and 8 filters
  (published 16 to 1024);
- `MelSpec` divides by `ops.log(10.0)` cast to the run's dtype (a float32
  tensor, which a float64 tensor does not divide by);
- learning rates 1e-3 (published 1e-5 and 1e-6), so that 6 steps move the
  weights;
- the LJSpeech download and its `tf.data` generator are random
  audio (uniform noise, each example with its own gain); the summaries
  and the inference demo are left out.

As published, `WeightNormalization` leaves out the wrapped layer's
activation (the last layer's `tanh`) and bias (every wrapped layer has
`use_bias=False`).
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers
from keras import ops

import keras_ctl
import keras_io

SOURCE = "examples/audio/melgan_spectrogram_inversion.py"

DESIRED_SAMPLES = 256  # changed: 8192
LEARNING_RATE_GEN = 1e-3  # changed: 1e-5
LEARNING_RATE_DISC = 1e-3  # changed: 1e-6

mse = keras.losses.MeanSquaredError()
mae = keras.losses.MeanAbsoluteError()


class MelSpec(layers.Layer):
    gather = False  # changed: set in parity mode

    def __init__(
        self,
        frame_length=1024,
        frame_step=256,
        fft_length=None,
        sampling_rate=22050,
        num_mel_channels=80,
        freq_min=125,
        freq_max=7600,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.frame_length = frame_length
        self.frame_step = frame_step
        self.fft_length = fft_length
        self.sampling_rate = sampling_rate
        self.num_mel_channels = num_mel_channels
        self.freq_min = freq_min
        self.freq_max = freq_max
        # Defining mel filter. This filter will be multiplied with the STFT
        self.mel_filterbank = tf.signal.linear_to_mel_weight_matrix(
            num_mel_bins=self.num_mel_channels,
            num_spectrogram_bins=self.frame_length // 2 + 1,
            sample_rate=self.sampling_rate,
            lower_edge_hertz=self.freq_min,
            upper_edge_hertz=self.freq_max,
        )

    def call(self, audio, training=True):
        # We will only perform the transformation during training.
        if training:
            # Taking the Short Time Fourier Transform. Ensure that the audio is padded.
            # In the paper, the STFT output is padded using the 'REFLECT' strategy.
            stft = tf.signal.stft(
                ops.squeeze(audio, -1),
                self.frame_length,
                self.frame_step,
                self.fft_length,
                pad_end=True,
            )

            # Taking the magnitude of the STFT output
            magnitude = ops.abs(stft)

            # Multiplying the Mel-filterbank with the magnitude and scaling it using the db scale
            mel = ops.matmul(ops.square(magnitude), self.mel_filterbank)
            ten = ops.cast(10.0, mel.dtype)  # changed: the run's dtype
            log_mel_spec = 10.0 * ops.log(ops.maximum(mel, 1e-6)) / ops.log(ten)
            log_mel_spec = 10.0 * ops.log(ops.maximum(mel, 1e-6)) / ops.log(ten)
            log_mel_spec = ops.maximum(
                log_mel_spec, ops.amax(self.batch_values(log_mel_spec)) - 80.0
            )  # changed: the global batch's largest, in parity mode

            return log_mel_spec

        else:
            return audio

    def batch_values(self, values):  # changed: the global batch's in parity mode
        return keras_ctl.all_gather(values) if self.gather else values

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "frame_length": self.frame_length,
                "frame_step": self.frame_step,
                "fft_length": self.fft_length,
                "sampling_rate": self.sampling_rate,
                "num_mel_channels": self.num_mel_channels,
                "freq_min": self.freq_min,
                "freq_max": self.freq_max,
            }
        )
        return config


class WeightNormalization(layers.Layer):
    def __init__(self, layer, **kwargs):
        super().__init__(**kwargs)
        self.layer = layer

    def build(self, input_shape):
        self.layer.build(input_shape)

        self.v = self.layer.kernel  # frozen reference
        self.g = self.add_weight(
            name="wn_scale",
            shape=(self.v.shape[-1],),
            initializer="ones",
            trainable=True,
        )

        super().build(input_shape)

    def call(self, inputs):
        kernel = self.layer.kernel

        norm_axes = tuple(range(len(kernel.shape) - 1))
        norm = ops.sqrt(ops.sum(ops.square(kernel), axis=norm_axes, keepdims=True))

        w = kernel * (self.g / (norm + 1e-6))

        if isinstance(self.layer, layers.Conv1DTranspose):  # changed: upsamples
            return tf.nn.conv1d_transpose(
                inputs,
                w,
                output_shape=self.transposed_output_shape(inputs),
                strides=self.layer.strides[0],
                padding=self.layer.padding.upper(),
            )
        return tf.nn.conv1d(
            inputs,
            w,
            stride=self.layer.strides[0],
            padding=self.layer.padding.upper(),
            dilations=self.layer.dilation_rate,
        )

    def transposed_output_shape(self, inputs):  # changed: for conv1d_transpose
        shape = tf.shape(inputs)
        return tf.stack(
            [shape[0], shape[1] * self.layer.strides[0], self.layer.filters]
        )

    def compute_output_shape(self, input_shape):
        return self.layer.compute_output_shape(input_shape)


def residual_stack(input, filters):
    """Convolutional residual stack with weight normalization.

    Args:
        filters: int, determines filter size for the residual stack.

    Returns:
        Residual stack output.
    """

    input_proj = WeightNormalization(
        layers.Conv1D(
            filters, 1, padding="same", use_bias=False, kernel_initializer="he_normal"
        )
    )(input)

    c1 = WeightNormalization(
        layers.Conv1D(
            filters,
            kernel_size=3,
            dilation_rate=1,
            padding="same",
            use_bias=False,
            kernel_initializer="he_normal",
        )
    )(input)

    lrelu1 = layers.LeakyReLU()(c1)

    c2 = WeightNormalization(
        layers.Conv1D(
            filters,
            kernel_size=3,
            dilation_rate=1,
            padding="same",
            use_bias=False,
            kernel_initializer="he_normal",
        )
    )(lrelu1)

    add1 = layers.Add()([c2, input_proj])
    lrelu2 = layers.LeakyReLU()(add1)

    c3 = WeightNormalization(
        layers.Conv1D(
            filters,
            kernel_size=3,
            dilation_rate=1,
            padding="same",
            use_bias=False,
            kernel_initializer="he_normal",
        )
    )(lrelu2)

    lrelu3 = layers.LeakyReLU()(c3)

    c4 = WeightNormalization(
        layers.Conv1D(
            filters,
            kernel_size=3,
            dilation_rate=1,
            padding="same",
            use_bias=False,
            kernel_initializer="he_normal",
        )
    )(lrelu3)

    add2 = layers.Add()([c4, add1])
    lrelu4 = layers.LeakyReLU()(add2)

    c5 = WeightNormalization(
        layers.Conv1D(
            filters,
            kernel_size=3,
            dilation_rate=1,
            padding="same",
            use_bias=False,
            kernel_initializer="he_normal",
        )
    )(lrelu4)

    lrelu5 = layers.LeakyReLU()(c5)

    c6 = WeightNormalization(
        layers.Conv1D(
            filters,
            kernel_size=3,
            dilation_rate=1,
            padding="same",
            use_bias=False,
            kernel_initializer="he_normal",
        )
    )(lrelu5)

    add3 = layers.Add()([c6, add2])

    return add3


def conv_block(input, conv_dim, upsampling_factor):
    """Dilated Convolutional Block with weight normalization.

    Args:
        conv_dim: int, determines filter size for the block.
        upsampling_factor: int, scale for upsampling.

    Returns:
        Dilated convolution block.
    """
    conv_t = WeightNormalization(
        layers.Conv1DTranspose(
            filters=conv_dim,
            kernel_size=16,
            strides=upsampling_factor,
            padding="same",
            use_bias=False,
            kernel_initializer="he_normal",
        )
    )(input)

    lrelu1 = layers.LeakyReLU()(conv_t)
    res_stack = residual_stack(lrelu1, conv_dim)
    lrelu2 = layers.LeakyReLU()(res_stack)

    return lrelu2


def discriminator_block(input):
    # changed: sizes (4 and 8 filters), groups=1 (no grouped gradient on CPU)
    conv1 = WeightNormalization(
        layers.Conv1D(4, 15, 1, "same", use_bias=False, kernel_initializer="he_normal")
    )(input)

    lrelu1 = layers.LeakyReLU()(conv1)

    conv2 = WeightNormalization(
        layers.Conv1D(
            8, 41, 4, "same", groups=1, use_bias=False, kernel_initializer="he_normal"
        )
    )(lrelu1)

    lrelu2 = layers.LeakyReLU()(conv2)

    conv3 = WeightNormalization(
        layers.Conv1D(
            8,
            41,
            4,
            "same",
            groups=1,
            use_bias=False,
            kernel_initializer="he_normal",
        )
    )(lrelu2)

    lrelu3 = layers.LeakyReLU()(conv3)

    conv4 = WeightNormalization(
        layers.Conv1D(
            8,
            41,
            4,
            "same",
            groups=1,
            use_bias=False,
            kernel_initializer="he_normal",
        )
    )(lrelu3)

    lrelu4 = layers.LeakyReLU()(conv4)

    conv5 = WeightNormalization(
        layers.Conv1D(
            8,
            41,
            4,
            "same",
            groups=1,
            use_bias=False,
            kernel_initializer="he_normal",
        )
    )(lrelu4)

    lrelu5 = layers.LeakyReLU()(conv5)

    conv6 = WeightNormalization(
        layers.Conv1D(8, 5, 1, "same", use_bias=False, kernel_initializer="he_normal")
    )(lrelu5)

    lrelu6 = layers.LeakyReLU()(conv6)

    conv7 = WeightNormalization(
        layers.Conv1D(1, 3, 1, "same", use_bias=False, kernel_initializer="he_normal")
    )(lrelu6)

    return [lrelu1, lrelu2, lrelu3, lrelu4, lrelu5, lrelu6, conv7]


def create_generator(input_shape):
    inp = keras.Input(input_shape)
    x = MelSpec()(inp)
    x = layers.Conv1D(
        16,  # changed: 512
        7,
        padding="same",
    )(x)
    x = layers.LeakyReLU()(x)
    # changed: two blocks upsampling 16 times each, of 8 and 4 filters (four
    # blocks upsampling 8, 8, 2 and 2 times, of 256, 128, 64 and 32 filters)
    x = conv_block(x, 8, 16)
    x = conv_block(x, 4, 16)
    x = WeightNormalization(
        layers.Conv1D(1, 7, padding="same", activation="tanh", use_bias=False)
    )(x)
    return keras.Model(inp, x)


def create_discriminator(input_shape):
    inp = keras.Input(input_shape)
    out_map1 = discriminator_block(inp)
    pool1 = layers.AveragePooling1D(pool_size=4, padding="same")(inp)
    out_map2 = discriminator_block(pool1)

    pool2 = layers.AveragePooling1D(pool_size=2, padding="same")(pool1)
    out_map3 = discriminator_block(pool2)
    return keras.Model(inp, [out_map1, out_map2, out_map3])


def generator_loss(real_pred, fake_pred):
    """Loss function for the generator.

    Args:
        real_pred: Tensor, output of the ground truth wave passed through the discriminator.
        fake_pred: Tensor, output of the generator prediction passed through the discriminator.

    Returns:
        Loss for the generator.
    """
    gen_loss = []
    for i in range(len(fake_pred)):
        gen_loss.append(mse(ops.ones_like(fake_pred[i][-1]), fake_pred[i][-1]))
    return ops.mean(ops.stack(gen_loss))


def feature_matching_loss(real_pred, fake_pred):
    """Implements the feature matching loss.

    Args:
        real_pred: Tensor, output of the ground truth wave passed through the discriminator.
        fake_pred: Tensor, output of the generator prediction passed through the discriminator.

    Returns:
        Feature Matching Loss.
    """
    fm_loss = []
    for i in range(len(fake_pred)):
        for j in range(len(fake_pred[i]) - 1):
            fm_loss.append(mae(real_pred[i][j], fake_pred[i][j]))
    return ops.mean(ops.stack(fm_loss))


def discriminator_loss(real_pred, fake_pred):
    """Implements the discriminator loss.

    Args:
        real_pred: Tensor, output of the ground truth wave passed through the discriminator.
        fake_pred: Tensor, output of the generator prediction passed through the discriminator.

    Returns:
        Discriminator Loss.
    """
    real_loss, fake_loss = [], []
    for i in range(len(real_pred)):
        real_loss.append(mse(ops.ones_like(real_pred[i][-1]), real_pred[i][-1]))
        fake_loss.append(mse(ops.zeros_like(fake_pred[i][-1]), fake_pred[i][-1]))

    # Calculating the final discriminator loss after scaling
    disc_loss = ops.mean(ops.stack(real_loss)) + ops.mean(ops.stack(fake_loss))
    return disc_loss


def model_class(base):
    class MelGAN(base):
        def __init__(self, generator, discriminator, **kwargs):
            """MelGAN trainer class

            Args:
                generator: keras.Model, Generator model
                discriminator: keras.Model, Discriminator model
            """
            super().__init__(**kwargs)
            self.generator = generator
            self.discriminator = discriminator

        def compile(
            self,
            gen_optimizer,
            disc_optimizer,
            generator_loss,
            feature_matching_loss,
            discriminator_loss,
        ):
            """MelGAN compile method.

            Args:
                gen_optimizer: keras.optimizer, optimizer to be used for training
                disc_optimizer: keras.optimizer, optimizer to be used for training
                generator_loss: callable, loss function for generator
                feature_matching_loss: callable, loss function for feature matching
                discriminator_loss: callable, loss function for discriminator
            """
            super().compile()

            # Optimizers
            self.gen_optimizer = gen_optimizer
            self.disc_optimizer = disc_optimizer

            # Losses
            self.generator_loss = generator_loss
            self.feature_matching_loss = feature_matching_loss
            self.discriminator_loss = discriminator_loss

            # Trackers
            self.gen_loss_tracker = keras.metrics.Mean(name="gen_loss")
            self.disc_loss_tracker = keras.metrics.Mean(name="disc_loss")

        def train_step(self, batch):
            x_batch_train, y_batch_train = batch

            with tf.GradientTape() as gen_tape, tf.GradientTape() as disc_tape:
                # Generating the audio wave
                gen_audio_wave = self.generator(x_batch_train, training=True)  # changed

                # Generating the features using the discriminator
                real_pred = self.discriminator(y_batch_train)  # changed
                fake_pred = self.discriminator(gen_audio_wave)  # changed

                # Calculating the generator losses
                gen_loss = generator_loss(real_pred, fake_pred)
                fm_loss = feature_matching_loss(real_pred, fake_pred)

                # Calculating final generator loss
                gen_fm_loss = gen_loss + 10 * fm_loss

                # Calculating the discriminator losses
                disc_loss = discriminator_loss(real_pred, fake_pred)

            # Calculating and applying the gradients for generator and discriminator
            grads_gen = gen_tape.gradient(gen_fm_loss, self.generator.trainable_weights)
            grads_disc = disc_tape.gradient(
                disc_loss, self.discriminator.trainable_weights
            )
            self.gen_optimizer.apply_gradients(
                zip(grads_gen, self.generator.trainable_weights)
            )
            self.disc_optimizer.apply_gradients(
                zip(grads_disc, self.discriminator.trainable_weights)
            )

            self.gen_loss_tracker.update_state(gen_fm_loss)
            self.disc_loss_tracker.update_state(disc_loss)

            return {
                "gen_loss": self.gen_loss_tracker.result(),
                "disc_loss": self.disc_loss_tracker.result(),
            }

    return MelGAN


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(6)
    audio = 0.1 * rng.uniform(-1, 1, (keras_io.SIZE, DESIRED_SAMPLES, 1))
    # Loud and quiet examples: the batches' dB values span more than 80 dB.
    audio *= 10.0 ** rng.uniform(-3, 2, (keras_io.SIZE, 1, 1))
    audio = audio.astype(keras.config.floatx())
    with strategy.scope():
        gen_optimizer = keras.optimizers.Adam(
            LEARNING_RATE_GEN, beta_1=0.5, beta_2=0.9, clipnorm=1
        )
        disc_optimizer = keras.optimizers.Adam(
            LEARNING_RATE_DISC, beta_1=0.5, beta_2=0.9, clipnorm=1
        )
        generator = create_generator((None, 1))
        discriminator = create_discriminator((None, 1))
        for layer in generator.layers:
            if isinstance(layer, MelSpec):
                layer.gather = parity

        mel_gan = model_class(base)(generator, discriminator)
        mel_gan.compile(
            gen_optimizer,
            disc_optimizer,
            generator_loss,
            feature_matching_loss,
            discriminator_loss,
        )
    train_dataset = tf.data.Dataset.from_tensor_slices((audio, audio))
    history = mel_gan.fit(
        train_dataset.batch(keras_io.BATCH), epochs=keras_io.EPOCHS, verbose=0
    )
    return keras_io.result(mel_gan, history)
