"""generative/vq_vae.py: `VQVAETrainer(train_variance)`, a wrapper that
builds its own VQ-VAE, whose `VectorQuantizer` layer adds its commitment
and codebook losses (`tf.reduce_mean`s) with `add_loss`; the trainer's
`train_step` adds `sum(self.vqvae.losses)` to a `tf.reduce_mean`
reconstruction loss and tracks three losses.

Its step has no random draws and is not declared in shares, so it is
read as one device's code; it logs `sum(self.vqvae.losses)` read after
`apply_gradients`, and the layer losses a model or layer gives in a step
are its replica's. Run as written. Changed: sizes
(8x8 images, latent 4, 8 codes, smaller layers); the codebook is made with
`add_weight` in the run's dtype (the example is Keras 2's: a `tf.Variable`
of float32 that Keras 3 does not track as the layer's weight), and its
one-hot encodings in the run's dtype.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_io

SOURCE = "examples/generative/vq_vae.py"

latent_dim = 4
num_embeddings = 8


class VectorQuantizer(layers.Layer):
    def __init__(self, num_embeddings, embedding_dim, beta=0.25, **kwargs):
        super().__init__(**kwargs)
        self.embedding_dim = embedding_dim
        self.num_embeddings = num_embeddings

        # The `beta` parameter is best kept between [0.25, 2] as per the paper.
        self.beta = beta

        # Initialize the embeddings which we will quantize.
        self.embeddings = self.add_weight(  # changed: Keras 3 tracks add_weight's
            shape=(self.embedding_dim, self.num_embeddings),
            initializer=keras.initializers.RandomUniform(-0.05, 0.05),
            trainable=True,
            name="embeddings_vqvae",
        )

    def call(self, x):
        # Calculate the input shape of the inputs and
        # then flatten the inputs keeping `embedding_dim` intact.
        input_shape = tf.shape(x)
        flattened = tf.reshape(x, [-1, self.embedding_dim])

        # Quantization.
        encoding_indices = self.get_code_indices(flattened)
        encodings = tf.one_hot(
            encoding_indices, self.num_embeddings, dtype=x.dtype
        )  # changed: in the run's dtype
        quantized = tf.matmul(encodings, self.embeddings, transpose_b=True)

        # Reshape the quantized values back to the original input shape
        quantized = tf.reshape(quantized, input_shape)

        # Calculate vector quantization loss and add that to the layer. You can
        # learn more about adding losses to different layers here:
        # https://keras.io/guides/making_new_layers_and_models_via_subclassing/.
        # Check the original paper to get a handle on the formulation of the
        # loss function.
        commitment_loss = tf.reduce_mean((tf.stop_gradient(quantized) - x) ** 2)
        codebook_loss = tf.reduce_mean((quantized - tf.stop_gradient(x)) ** 2)
        self.add_loss(self.beta * commitment_loss + codebook_loss)

        # Straight-through estimator.
        quantized = x + tf.stop_gradient(quantized - x)
        return quantized

    def get_code_indices(self, flattened_inputs):
        # Calculate L2-normalized distance between the inputs and the codes.
        similarity = tf.matmul(flattened_inputs, self.embeddings)
        distances = (
            tf.reduce_sum(flattened_inputs**2, axis=1, keepdims=True)
            + tf.reduce_sum(self.embeddings**2, axis=0)
            - 2 * similarity
        )

        # Derive the indices for minimum distances.
        encoding_indices = tf.argmin(distances, axis=1)
        return encoding_indices


def get_encoder(latent_dim=16):
    encoder_inputs = keras.Input(shape=(8, 8, 1))
    x = layers.Conv2D(4, 3, activation="relu", strides=2, padding="same")(
        encoder_inputs
    )
    x = layers.Conv2D(8, 3, activation="relu", strides=2, padding="same")(x)
    encoder_outputs = layers.Conv2D(latent_dim, 1, padding="same")(x)
    return keras.Model(encoder_inputs, encoder_outputs, name="encoder")


def get_decoder(latent_dim=16):
    latent_inputs = keras.Input(shape=get_encoder(latent_dim).output.shape[1:])
    x = layers.Conv2DTranspose(8, 3, activation="relu", strides=2, padding="same")(
        latent_inputs
    )
    x = layers.Conv2DTranspose(4, 3, activation="relu", strides=2, padding="same")(x)
    decoder_outputs = layers.Conv2DTranspose(1, 3, padding="same")(x)
    return keras.Model(latent_inputs, decoder_outputs, name="decoder")


def get_vqvae(latent_dim=16, num_embeddings=64):
    vq_layer = VectorQuantizer(num_embeddings, latent_dim, name="vector_quantizer")
    encoder = get_encoder(latent_dim)
    decoder = get_decoder(latent_dim)
    inputs = keras.Input(shape=(8, 8, 1))
    encoder_outputs = encoder(inputs)
    quantized_latents = vq_layer(encoder_outputs)
    reconstructions = decoder(quantized_latents)
    return keras.Model(inputs, reconstructions, name="vq_vae")


def model_class(base):
    class VQVAETrainer(base):
        def __init__(self, train_variance, latent_dim=32, num_embeddings=128, **kwargs):
            super(VQVAETrainer, self).__init__(**kwargs)
            self.train_variance = train_variance
            self.latent_dim = latent_dim
            self.num_embeddings = num_embeddings

            self.vqvae = get_vqvae(self.latent_dim, self.num_embeddings)

            self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
            self.reconstruction_loss_tracker = keras.metrics.Mean(
                name="reconstruction_loss"
            )
            self.vq_loss_tracker = keras.metrics.Mean(name="vq_loss")

        @property
        def metrics(self):
            return [
                self.total_loss_tracker,
                self.reconstruction_loss_tracker,
                self.vq_loss_tracker,
            ]

        def train_step(self, x):
            with tf.GradientTape() as tape:
                # Outputs from the VQ-VAE.
                reconstructions = self.vqvae(x)

                # Calculate the losses.
                reconstruction_loss = (
                    tf.reduce_mean((x - reconstructions) ** 2) / self.train_variance
                )
                total_loss = reconstruction_loss + sum(self.vqvae.losses)

            # Backpropagation.
            grads = tape.gradient(total_loss, self.vqvae.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.vqvae.trainable_variables))

            # Loss tracking.
            self.total_loss_tracker.update_state(total_loss)
            self.reconstruction_loss_tracker.update_state(reconstruction_loss)
            self.vq_loss_tracker.update_state(sum(self.vqvae.losses))

            # Log results.
            return {
                "loss": self.total_loss_tracker.result(),
                "reconstruction_loss": self.reconstruction_loss_tracker.result(),
                "vqvae_loss": self.vq_loss_tracker.result(),
            }

    return VQVAETrainer


def train(base, strategy, parity=True):
    del parity  # no random draws: the same step in both modes
    keras.utils.set_random_seed(0)
    x_train = np.random.default_rng(4).random((keras_io.SIZE, 8, 8, 1))
    x_train_scaled = (x_train - 0.5).astype(keras.config.floatx())
    data_variance = float(np.var(x_train))
    with strategy.scope():
        vqvae_trainer = model_class(base)(
            data_variance, latent_dim=latent_dim, num_embeddings=num_embeddings
        )
        vqvae_trainer.compile(optimizer=keras.optimizers.Adam())
    dataset = tf.data.Dataset.from_tensor_slices(x_train_scaled).batch(keras_io.BATCH)
    history = vqvae_trainer.fit(dataset, epochs=keras_io.EPOCHS, verbose=0)
    return keras_io.result(vqvae_trainer, history)
