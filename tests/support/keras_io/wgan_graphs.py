"""generative/wgan-graphs.py: `GraphWGAN(generator, discriminator)`, a
WGAN-GP on molecular graphs (an adjacency tensor and a feature tensor per
example) with an R-GCN critic and two optimizers of its own set in
`compile()`; its `train_step` runs `discriminator_steps` critic steps (a
latent batch, a difference of `tf.reduce_mean`s of the replica's logits
plus a gradient penalty on graphs interpolated with a per-example `alpha`,
a tape inside the tape) and `generator_steps` generator steps (applying
the gradients inside the tape), updating a loss tracker each time, and
keeps the replica's batch size in `self.batch_size`.

Its local means are read as one device's (a step of one's own). As
written it does not run on replicas: replica threads share the model, so
`self.batch_size`, read after the critic's `apply_gradients` (a
collective, where another replica's step runs), is the last replica's;
on the last batch (1 example) the replica with the example draws a latent
batch of 0 rows and logs the mean of nothing, `loss_gen` NaN (with the
generator's latent batch sized by `tf.shape(graph_real[0])[0]` it is
finite). In parity mode the latents come from the data and the penalty
reads `self.batch_size` before any collective. Changed:
sizes (5 atoms, latent 4; generator units 8 and 16; critic graph units 8
and 8, dense 8); synthetic one-hot graphs instead of QM9 through RDKit
(and no RDKit sampling after training); the R-GCN kernels and the critic's
output layer in the run's dtype (the example makes them float32); Keras 3
needs `keras.ops.transpose` for the generator's symmetrization (a
KerasTensor cannot go into `tf.transpose`) and integer `Dense` units
(`int(np.prod(...))` for `tf.math.reduce_prod(...)`). The step's random
draws (the latent batches and `alpha`) go through `self.latents(...)` and
`self.alphas(...)`, which in parity mode take them from the data; the
`Dropout` rates are 0.0 in parity mode.
"""

import keras
import numpy as np
import tensorflow as tf

import keras_io

SOURCE = "examples/generative/wgan-graphs.py"

NUM_ATOMS = 5  # Maximum number of atoms (changed: 9)
ATOM_DIM = 4 + 1  # Number of atom types
BOND_DIM = 4 + 1  # Number of bond types
LATENT_DIM = 4  # Size of the latent space (changed: 64)


def GraphGenerator(
    dense_units,
    dropout_rate,
    latent_dim,
    adjacency_shape,
    feature_shape,
):
    z = keras.layers.Input(shape=(LATENT_DIM,))
    # Propagate through one or more densely connected layers
    x = z
    for units in dense_units:
        x = keras.layers.Dense(units, activation="tanh")(x)
        x = keras.layers.Dropout(dropout_rate)(x)

    # Map outputs of previous layer (x) to [continuous] adjacency tensors (x_adjacency)
    x_adjacency = keras.layers.Dense(int(np.prod(adjacency_shape)))(x)  # changed
    x_adjacency = keras.layers.Reshape(adjacency_shape)(x_adjacency)
    # Symmetrify tensors in the last two dimensions
    transposed = keras.ops.transpose(x_adjacency, (0, 1, 3, 2))  # changed
    x_adjacency = (x_adjacency + transposed) / 2  # changed
    x_adjacency = keras.layers.Softmax(axis=1)(x_adjacency)

    # Map outputs of previous layer (x) to [continuous] feature tensors (x_features)
    x_features = keras.layers.Dense(int(np.prod(feature_shape)))(x)  # changed
    x_features = keras.layers.Reshape(feature_shape)(x_features)
    x_features = keras.layers.Softmax(axis=2)(x_features)

    return keras.Model(inputs=z, outputs=[x_adjacency, x_features], name="Generator")


class RelationalGraphConvLayer(keras.layers.Layer):
    def __init__(
        self,
        units=128,
        activation="relu",
        use_bias=False,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)

        self.units = units
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)

    def build(self, input_shape):
        bond_dim = input_shape[0][1]
        atom_dim = input_shape[1][2]

        self.kernel = self.add_weight(
            shape=(bond_dim, atom_dim, self.units),
            initializer=self.kernel_initializer,
            regularizer=self.kernel_regularizer,
            trainable=True,
            name="W",
            dtype=self.dtype,  # changed: the run's dtype, not float32
        )

        if self.use_bias:
            self.bias = self.add_weight(
                shape=(bond_dim, 1, self.units),
                initializer=self.bias_initializer,
                regularizer=self.bias_regularizer,
                trainable=True,
                name="b",
                dtype=self.dtype,  # changed
            )

        self.built = True

    def call(self, inputs, training=False):
        adjacency, features = inputs
        # Aggregate information from neighbors
        x = tf.matmul(adjacency, features[:, None, :, :])
        # Apply linear transformation
        x = tf.matmul(x, self.kernel)
        if self.use_bias:
            x += self.bias
        # Reduce bond types dim
        x_reduced = tf.reduce_sum(x, axis=1)
        # Apply non-linear transformation
        return self.activation(x_reduced)


def GraphDiscriminator(
    gconv_units, dense_units, dropout_rate, adjacency_shape, feature_shape
):
    adjacency = keras.layers.Input(shape=adjacency_shape)
    features = keras.layers.Input(shape=feature_shape)

    # Propagate through one or more graph convolutional layers
    features_transformed = features
    for units in gconv_units:
        features_transformed = RelationalGraphConvLayer(units)(
            [adjacency, features_transformed]
        )

    # Reduce 2-D representation of molecule to 1-D
    x = keras.layers.GlobalAveragePooling1D()(features_transformed)

    # Propagate through one or more densely connected layers
    for units in dense_units:
        x = keras.layers.Dense(units, activation="relu")(x)
        x = keras.layers.Dropout(dropout_rate)(x)

    # For each molecule, output a single scalar value expressing the
    # "realness" of the inputted molecule
    x_out = keras.layers.Dense(1)(x)  # changed: not dtype="float32"

    return keras.Model(inputs=[adjacency, features], outputs=x_out)


def model_class(base):
    class GraphWGAN(base):
        def __init__(
            self,
            generator,
            discriminator,
            discriminator_steps=1,
            generator_steps=1,
            gp_weight=10,
            **kwargs,
        ):
            super().__init__(**kwargs)
            self.generator = generator
            self.discriminator = discriminator
            self.discriminator_steps = discriminator_steps
            self.generator_steps = generator_steps
            self.gp_weight = gp_weight
            self.latent_dim = self.generator.input_shape[-1]

        def compile(self, optimizer_generator, optimizer_discriminator, **kwargs):
            super().compile(**kwargs)
            self.optimizer_generator = optimizer_generator
            self.optimizer_discriminator = optimizer_discriminator
            self.metric_generator = keras.metrics.Mean(name="loss_gen")
            self.metric_discriminator = keras.metrics.Mean(name="loss_dis")

        def train_step(self, inputs):
            if isinstance(inputs[0], tuple):
                inputs = inputs[0]

            graph_real = inputs

            self.batch_size = tf.shape(inputs[0])[0]

            # Train the discriminator for one or more steps
            for _ in range(self.discriminator_steps):
                z = self.latents((self.batch_size, self.latent_dim))  # changed

                with tf.GradientTape() as tape:
                    graph_generated = self.generator(z, training=True)
                    loss = self._loss_discriminator(graph_real, graph_generated)

                grads = tape.gradient(loss, self.discriminator.trainable_weights)
                self.optimizer_discriminator.apply_gradients(
                    zip(grads, self.discriminator.trainable_weights)
                )
                self.metric_discriminator.update_state(loss)

            # Train the generator for one or more steps
            for _ in range(self.generator_steps):
                z = self.latents((self.batch_size, self.latent_dim))  # changed

                with tf.GradientTape() as tape:
                    graph_generated = self.generator(z, training=True)
                    loss = self._loss_generator(graph_generated)

                    grads = tape.gradient(loss, self.generator.trainable_weights)
                    self.optimizer_generator.apply_gradients(
                        zip(grads, self.generator.trainable_weights)
                    )
                    self.metric_generator.update_state(loss)

            return {m.name: m.result() for m in self.metrics}

        def _loss_discriminator(self, graph_real, graph_generated):
            logits_real = self.discriminator(graph_real, training=True)
            logits_generated = self.discriminator(graph_generated, training=True)
            loss = tf.reduce_mean(logits_generated) - tf.reduce_mean(logits_real)
            loss_gp = self._gradient_penalty(graph_real, graph_generated)
            return loss + loss_gp * self.gp_weight

        def _loss_generator(self, graph_generated):
            logits_generated = self.discriminator(graph_generated, training=True)
            return -tf.reduce_mean(logits_generated)

        def _gradient_penalty(self, graph_real, graph_generated):
            # Unpack graphs
            adjacency_real, features_real = graph_real
            adjacency_generated, features_generated = graph_generated

            # Generate interpolated graphs (adjacency_interp and features_interp)
            alpha = self.alphas([self.batch_size])  # changed
            alpha = tf.reshape(alpha, (self.batch_size, 1, 1, 1))
            adjacency_interp = (adjacency_real * alpha) + (
                1 - alpha
            ) * adjacency_generated
            alpha = tf.reshape(alpha, (self.batch_size, 1, 1))
            features_interp = (features_real * alpha) + (1 - alpha) * features_generated

            # Compute the logits of interpolated graphs
            with tf.GradientTape() as tape:
                tape.watch(adjacency_interp)
                tape.watch(features_interp)
                logits = self.discriminator(
                    [adjacency_interp, features_interp], training=True
                )

            # Compute the gradients with respect to the interpolated graphs
            grads = tape.gradient(logits, [adjacency_interp, features_interp])
            # Compute the gradient penalty
            grads_adjacency_penalty = (1 - tf.norm(grads[0], axis=1)) ** 2
            grads_features_penalty = (1 - tf.norm(grads[1], axis=2)) ** 2
            return tf.reduce_mean(
                tf.reduce_mean(grads_adjacency_penalty, axis=(-2, -1))
                + tf.reduce_mean(grads_features_penalty, axis=(-1))
            )

    return GraphWGAN


def random_graphs(rng, size):
    """One-hot adjacency (bond type, channels first, the last "no bond") and
    feature (atom type, the last "no atom") tensors of random graphs."""
    floatx = keras.config.floatx()
    bonds = rng.integers(0, BOND_DIM, size=(size, NUM_ATOMS, NUM_ATOMS))
    bonds = np.triu(bonds, 1)
    bonds = bonds + np.transpose(bonds, (0, 2, 1))
    bonds[:, np.arange(NUM_ATOMS), np.arange(NUM_ATOMS)] = BOND_DIM - 1
    adjacency = np.moveaxis(np.eye(BOND_DIM)[bonds], -1, 1).astype(floatx)
    atoms = rng.integers(0, ATOM_DIM, size=(size, NUM_ATOMS))
    features = np.eye(ATOM_DIM)[atoms].astype(floatx)
    return adjacency, features


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    draws = keras_io.DrawsFromData()

    class Trained(model_class(base)):
        def train_step(self, data):
            if not parity:
                return super().train_step(data)
            graphs, draws_of_step = data
            draws.hold(draws_of_step)
            return super().train_step(graphs)

        def latents(self, shape):
            if parity:
                return draws.next()
            return tf.random.normal(shape)

        def alphas(self, shape):
            if parity:
                return draws.next()
            return tf.random.uniform(shape, dtype=keras.config.floatx())

    dropout_rate = 0.0 if parity else 0.2  # changed in parity mode
    with strategy.scope():
        generator = GraphGenerator(
            dense_units=[8, 16],
            dropout_rate=dropout_rate,
            latent_dim=LATENT_DIM,
            adjacency_shape=(BOND_DIM, NUM_ATOMS, NUM_ATOMS),
            feature_shape=(NUM_ATOMS, ATOM_DIM),
        )
        discriminator = GraphDiscriminator(
            gconv_units=[8, 8],
            dense_units=[8],
            dropout_rate=dropout_rate,
            adjacency_shape=(BOND_DIM, NUM_ATOMS, NUM_ATOMS),
            feature_shape=(NUM_ATOMS, ATOM_DIM),
        )
        wgan = Trained(generator, discriminator, discriminator_steps=1)
        wgan.compile(
            optimizer_generator=keras.optimizers.Adam(5e-4),
            optimizer_discriminator=keras.optimizers.Adam(5e-4),
        )
    floatx = keras.config.floatx()
    rng = np.random.default_rng(11)
    graphs = random_graphs(rng, keras_io.SIZE)
    if parity:  # in the step's order: latent and alpha for the critic, latent
        step_draws = (
            rng.normal(size=(keras_io.SIZE, LATENT_DIM)).astype(floatx),
            rng.random(keras_io.SIZE).astype(floatx),
            rng.normal(size=(keras_io.SIZE, LATENT_DIM)).astype(floatx),
        )
        data = (graphs, step_draws)
    else:
        data = graphs
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(keras_io.BATCH)
    history = wgan.fit(dataset, epochs=keras_io.EPOCHS, verbose=0)
    return keras_io.result(wgan, history)
