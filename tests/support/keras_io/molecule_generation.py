"""generative/molecule_generation.py: `MoleculeGenerator(encoder, decoder,
max_len)`, a VAE on molecular graphs (an adjacency tensor and a feature
tensor per example, with a QED property) whose `call()` samples the
latent with a `Sampling` layer made in the call, and whose `train_step`
takes `data[0]`, keeps the replica's batch size in `self.batch_size`, and
sums `tf.reduce_mean`s over the replica's examples: two reconstruction
cross-entropies, the KL term, a property loss and a gradient penalty (a
tape inside the tape, on graphs interpolated with a per-example `alpha`,
of the property prediction), then updates a loss tracker.

Its local means are read as one device's (a step of one's own). On one
device Keras computes `categorical_crossentropy` of the decoder's
`Softmax` outputs from their logits (`_keras_logits`); the outputs of a
layer a step calls under several replicas carry them too, so it equals
one device (float64 5.6e-17 and float32 1.9e-7 on 3 replicas; 4.4e-3 off
when they did not: for the adjacency, a softmax over the bond axis, 1, and
a cross-entropy over the last axis, the two are different functions).

Changed: sizes (6 atoms, latent 4; graph units 16 and encoder dense 16,
the smallest tried whose ReLUs leave no atom's or example's penalty
gradient exactly 0: `tf.norm` of a zero gradient has a NaN gradient, which
4 and 8, or 9 and 8, hit; decoder dense 8 and 8); synthetic one-hot graphs and uniform QED values instead of ZINC
through RDKit (and no RDKit `inference` after training); the QED values
are rows of one column, as the property prediction's (Keras 3's
`binary_crossentropy` wants equal ranks; Keras 2 broadcast the published
`(batch,)` against `(batch, 1)` into a `(batch, batch)` matrix, a loss
coupling the batch's examples); the R-GCN kernels and the `z_mean` and
`log_var` layers in the run's dtype (the example makes them float32);
Keras 3 needs `keras.ops.transpose` for the decoder's symmetrization (a
KerasTensor cannot go into `tf.transpose`) and integer `Dense` units
(`int(np.prod(...))` for `tf.math.reduce_prod(...)`); `Sampling` draws
with `tf.random.normal` (Keras 2's `tf.keras.backend.random_normal` is
gone, and a seed generator, a variable, cannot be made in the traced call
that makes the layer). The step's random draws (epsilon for the forward
pass, the penalty's `alpha`, epsilon for the penalty's forward pass) go
through `Sampling.draws` and `self.alphas(...)`, which in parity mode take
them from the data (`Sampling.draws` is set once `train()` has built the
model on one example: building it in the first step would take a draw); the decoder's `Dropout(0.2)` is `Dropout(0.0)` in
parity mode.
"""

import ast

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_io

SOURCE = "examples/generative/molecule_generation.py"

SMILE_CHARSET = '["C", "B", "F", "I", "H", "O", "N", "S", "P", "Cl", "Br"]'
SMILE_CHARSET = ast.literal_eval(SMILE_CHARSET)

VAE_LR = 5e-4
NUM_ATOMS = 6  # Maximum number of atoms (changed: 120)

ATOM_DIM = len(SMILE_CHARSET)  # Number of atom types
BOND_DIM = 4 + 1  # Number of bond types
LATENT_DIM = 4  # Size of the latent space (changed: 435)
MAX_MOLSIZE = 12  # changed: the longest SMILES of the data set


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


def get_encoder(
    gconv_units, latent_dim, adjacency_shape, feature_shape, dense_units, dropout_rate
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
        x = layers.Dense(units, activation="relu")(x)
        x = layers.Dropout(dropout_rate)(x)

    z_mean = layers.Dense(latent_dim, name="z_mean")(x)  # changed: not float32
    log_var = layers.Dense(latent_dim, name="log_var")(x)  # changed

    encoder = keras.Model([adjacency, features], [z_mean, log_var], name="encoder")

    return encoder


def get_decoder(dense_units, dropout_rate, latent_dim, adjacency_shape, feature_shape):
    latent_inputs = keras.Input(shape=(latent_dim,))

    x = latent_inputs
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

    decoder = keras.Model(
        latent_inputs, outputs=[x_adjacency, x_features], name="decoder"
    )

    return decoder


class Sampling(layers.Layer):
    draws = None  # changed: the data's draws, in parity mode

    def call(self, inputs):
        z_mean, z_log_var = inputs
        batch = tf.shape(z_log_var)[0]
        dim = tf.shape(z_log_var)[1]
        if Sampling.draws is not None:  # changed: epsilon from the data
            epsilon = Sampling.draws.next()
        else:
            epsilon = tf.random.normal(
                shape=(batch, dim), dtype=z_log_var.dtype
            )  # changed
        return z_mean + tf.exp(0.5 * z_log_var) * epsilon


def model_class(base):
    class MoleculeGenerator(base):
        def __init__(self, encoder, decoder, max_len, **kwargs):
            super().__init__(**kwargs)
            self.encoder = encoder
            self.decoder = decoder
            self.property_prediction_layer = layers.Dense(1)
            self.max_len = max_len

            self.train_total_loss_tracker = keras.metrics.Mean(name="train_total_loss")
            self.val_total_loss_tracker = keras.metrics.Mean(name="val_total_loss")

        def train_step(self, data):
            adjacency_tensor, feature_tensor, qed_tensor = data[0]
            graph_real = [adjacency_tensor, feature_tensor]
            self.batch_size = tf.shape(qed_tensor)[0]
            with tf.GradientTape() as tape:
                z_mean, z_log_var, qed_pred, gen_adjacency, gen_features = self(
                    graph_real, training=True
                )
                graph_generated = [gen_adjacency, gen_features]
                total_loss = self._compute_loss(
                    z_log_var, z_mean, qed_tensor, qed_pred, graph_real, graph_generated
                )

            grads = tape.gradient(total_loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights))

            self.train_total_loss_tracker.update_state(total_loss)
            return {"loss": self.train_total_loss_tracker.result()}

        def _compute_loss(
            self, z_log_var, z_mean, qed_true, qed_pred, graph_real, graph_generated
        ):
            adjacency_real, features_real = graph_real
            adjacency_gen, features_gen = graph_generated

            adjacency_loss = tf.reduce_mean(
                tf.reduce_sum(
                    keras.losses.categorical_crossentropy(
                        adjacency_real, adjacency_gen
                    ),
                    axis=(1, 2),
                )
            )
            features_loss = tf.reduce_mean(
                tf.reduce_sum(
                    keras.losses.categorical_crossentropy(features_real, features_gen),
                    axis=(1),
                )
            )
            kl_loss = -0.5 * tf.reduce_sum(
                1 + z_log_var - tf.square(z_mean) - tf.exp(z_log_var), 1
            )
            kl_loss = tf.reduce_mean(kl_loss)

            property_loss = tf.reduce_mean(
                keras.losses.binary_crossentropy(qed_true, qed_pred)
            )

            graph_loss = self._gradient_penalty(graph_real, graph_generated)

            return kl_loss + property_loss + graph_loss + adjacency_loss + features_loss

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
                _, _, logits, _, _ = self(
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

        def call(self, inputs):
            z_mean, log_var = self.encoder(inputs)
            z = Sampling()([z_mean, log_var])

            gen_adjacency, gen_features = self.decoder(z)

            property_pred = self.property_prediction_layer(z_mean)

            return z_mean, log_var, property_pred, gen_adjacency, gen_features

    return MoleculeGenerator


def random_graphs(rng, size):
    """One-hot adjacency (bond type, channels first, the last "no bond") and
    feature (atom type) tensors of random graphs."""
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
    Sampling.draws = None

    class Trained(model_class(base)):
        def train_step(self, data):
            if parity:
                draws.hold(data[1])
            return super().train_step(data)

        def alphas(self, shape):
            if parity:
                return draws.next()
            return tf.random.uniform(shape, dtype=keras.config.floatx())

    with strategy.scope():
        encoder = get_encoder(
            gconv_units=[16],
            adjacency_shape=(BOND_DIM, NUM_ATOMS, NUM_ATOMS),
            feature_shape=(NUM_ATOMS, ATOM_DIM),
            latent_dim=LATENT_DIM,
            dense_units=[16],
            dropout_rate=0.0,
        )
        decoder = get_decoder(
            dense_units=[8, 8],
            dropout_rate=0.0 if parity else 0.2,  # changed in parity mode
            latent_dim=LATENT_DIM,
            adjacency_shape=(BOND_DIM, NUM_ATOMS, NUM_ATOMS),
            feature_shape=(NUM_ATOMS, ATOM_DIM),
        )
        model = Trained(encoder, decoder, MAX_MOLSIZE)
        model.compile(keras.optimizers.Adam(learning_rate=VAE_LR))
    floatx = keras.config.floatx()
    rng = np.random.default_rng(12)
    adjacency, features = random_graphs(rng, keras_io.SIZE)
    qed = rng.random((keras_io.SIZE, 1)).astype(floatx)
    with strategy.scope():  # built before the steps, which draw from the data
        model([adjacency[:1], features[:1]])
    if parity:
        Sampling.draws = draws
    if parity:  # in the step's order: epsilon, alpha, the penalty's epsilon
        step_draws = (
            rng.normal(size=(keras_io.SIZE, LATENT_DIM)).astype(floatx),
            rng.random(keras_io.SIZE).astype(floatx),
            rng.normal(size=(keras_io.SIZE, LATENT_DIM)).astype(floatx),
        )
        data = ((adjacency, features, qed), step_draws)
    else:
        data = ((adjacency, features, qed),)
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(keras_io.BATCH)
    history = model.fit(dataset, epochs=keras_io.EPOCHS, verbose=0)
    return keras_io.result(model, history)
