"""vision/semantic_image_clustering.py: `RepresentationLearner(encoder,
projection_units, num_augmentations, temperature)`, the example's first
phase (SCAN's SimCLR-style representation learning), whose `call()`
preprocesses the images, augments them `num_augmentations` times with
random layers and stacks the views, and whose `train_step` and
`test_step` (run on validation data here) compute a contrastive loss over
every pair of the batch's views, a value per view that `tape.gradient`
sums, with a `Mean` tracker. The encoder and the projection head have
BatchNormalization layers (the batch's statistics in training), the head a
Dropout.

The example's second phase (the clustering learner) is a functional model
with compiled losses and no step of its own, so it is not ported. The
example's Keras 3 text (`layers.Resizing` and friends for
`layers.experimental.preprocessing`). Changed: sizes (8x8 images, 8-wide
representations and projections); a convolution with BatchNormalization
for the untrained ResNet50V2; Keras's `AdamW` (same learning-rate schedule
and weight decay) for TensorFlow Addons' (not installed; its weight decay
is not scaled by the learning rate, Keras's is); the preprocessing and
augmentation layers are the class's closure, made by `train()` (the
published class reads module globals of the same names).

As written, every replica contrasts its own examples' views only (and its
BatchNormalization normalizes with them), so under R replicas the step is
not one device's; a replica without examples divides by its batch size 0
(`tf.shape(feature_vectors)[0] // batch_size`). Parity mode takes the
augmented views from the data (`AugmentationDraws`, training only; in
inference the augmentation layers pass their input through), sets the
Dropout rate to 0.0, synchronizes the BatchNormalization layers across
replicas, and makes the changes of the docs' global-batch guide in both
steps: the features of each view go through `keras_ctl.all_gather` in one
device's order (`gathered`), the batch size is the global batch's, and the
train step's gradient is taken of `1 / R` of the loss. The views are
held by the published `train_step` itself (a subclass's step calling
`super().train_step` would decide the step's reading with its own code).
On 2 replicas parity mode equals one device (float64, 6.1e-10: the
encoder's last Dense bias, whose gradient the projector's BatchNormalization
makes zero but for round-off, which Adam scales up); on 3 replicas its last
batch (1, 0 and 0 examples) stops on a shape mismatch in the synchronized
BatchNormalization's all-reduce ([12] against [9]), not yet explained.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_ctl
import keras_io

SOURCE = "examples/vision/semantic_image_clustering.py"

input_shape = (8, 8, 3)  # changed: the published 32x32 CIFAR-10 images
target_size = 8  # Resize the input images.
representation_dim = 8  # changed: 512
projection_units = 8  # changed: 128


def make_data_augmentation():
    return keras.Sequential(
        [
            layers.RandomTranslation(
                height_factor=(-0.2, 0.2), width_factor=(-0.2, 0.2), fill_mode="nearest"
            ),
            layers.RandomFlip(mode="horizontal"),
            layers.RandomRotation(factor=0.15, fill_mode="nearest"),
            layers.RandomZoom(
                height_factor=(-0.3, 0.1), width_factor=(-0.3, 0.1), fill_mode="nearest"
            ),
        ]
    )


class AugmentationDraws(layers.Layer):
    """Parity mode's augmentation: in training, the next augmented view
    taken from the data (`keras_io.DrawsFromData`); in inference, its input
    (as Keras's random layers)."""

    def __init__(self, draws, **kwargs):
        super().__init__(**kwargs)
        self.draws = draws

    def call(self, inputs, training=None):
        return self.draws.next() if training else inputs


def create_encoder(representation_dim, synchronized):
    # changed: a convolution with BatchNormalization (synchronized in
    # parity mode) for the untrained ResNet50V2
    encoder = keras.Sequential(
        [
            layers.Conv2D(4, 3, strides=2, use_bias=False),
            layers.BatchNormalization(synchronized=synchronized),
            layers.ReLU(),
            layers.GlobalAveragePooling2D(),
            layers.Dense(representation_dim),
        ]
    )
    return encoder


def gathered(feature_vectors, batch_size, num_augmentations):
    """Parity mode: every replica's features of each view, in one device's
    order (every first view, then every second view), and the global batch
    size."""
    views = [
        keras_ctl.all_gather(feature_vectors[i * batch_size : (i + 1) * batch_size])
        for i in range(num_augmentations)
    ]
    return tf.concat(views, axis=0), tf.shape(views[0])[0]


def model_class(base, parity, data_preprocessing, data_augmentation, draws=None):
    class RepresentationLearner(base):
        def __init__(
            self,
            encoder,
            projection_units,
            num_augmentations,
            temperature=1.0,
            dropout_rate=0.1,
            l2_normalize=False,
            synchronized=False,  # changed: parity mode's BatchNormalization
            **kwargs,
        ):
            super(RepresentationLearner, self).__init__(**kwargs)
            self.encoder = encoder
            # Create projection head.
            self.projector = keras.Sequential(
                [
                    layers.Dropout(dropout_rate),
                    layers.Dense(units=projection_units, use_bias=False),
                    layers.BatchNormalization(synchronized=synchronized),
                    layers.ReLU(),
                ]
            )
            self.num_augmentations = num_augmentations
            self.temperature = temperature
            self.l2_normalize = l2_normalize
            self.loss_tracker = keras.metrics.Mean(name="loss")

        @property
        def metrics(self):
            return [self.loss_tracker]

        def compute_contrastive_loss(self, feature_vectors, batch_size):
            num_augmentations = tf.shape(feature_vectors)[0] // batch_size
            if self.l2_normalize:
                feature_vectors = tf.math.l2_normalize(feature_vectors, -1)
            # The logits shape is [num_augmentations * batch_size,
            # num_augmentations * batch_size].
            logits = (
                tf.linalg.matmul(feature_vectors, feature_vectors, transpose_b=True)
                / self.temperature
            )
            # Apply log-max trick for numerical stability.
            logits_max = tf.math.reduce_max(logits, axis=1)
            logits = logits - logits_max
            # The shape of targets is [num_augmentations * batch_size,
            # num_augmentations * batch_size]. targets is a matrix consits of
            # num_augmentations submatrices of shape [batch_size * batch_size].
            # Each [batch_size * batch_size] submatrix is an identity matrix
            # (diagonal entries are ones).
            targets = tf.tile(
                tf.eye(batch_size), [num_augmentations, num_augmentations]
            )
            # Compute cross entropy loss
            return keras.losses.categorical_crossentropy(
                y_true=targets, y_pred=logits, from_logits=True
            )

        def call(self, inputs):
            # Preprocess the input images.
            preprocessed = data_preprocessing(inputs)
            # Create augmented versions of the images.
            augmented = []
            for _ in range(self.num_augmentations):
                augmented.append(data_augmentation(preprocessed))
            augmented = layers.Concatenate(axis=0)(augmented)
            # Generate embedding representations of the images.
            features = self.encoder(augmented)
            # Apply projection head.
            return self.projector(features)

        @keras_ctl.written_in_shares
        def train_step(self, inputs):
            if parity:  # changed: the views drawn with the data
                inputs, view_1, view_2 = inputs
                draws.hold([view_1, view_2])
            batch_size = tf.shape(inputs)[0]
            # Run the forward pass and compute the contrastive loss
            with tf.GradientTape() as tape:
                feature_vectors = self(inputs, training=True)
                if parity:  # changed: the global batch's features
                    feature_vectors, batch_size = gathered(
                        feature_vectors, batch_size, self.num_augmentations
                    )
                loss = self.compute_contrastive_loss(feature_vectors, batch_size)
                # changed in parity mode: the replica's 1/R of the loss
                share = loss / (keras_ctl.num_replicas() if parity else 1)
            # Compute gradients
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(share, trainable_vars)
            # Update weights
            self.optimizer.apply_gradients(zip(gradients, trainable_vars))
            # Update loss tracker metric
            self.loss_tracker.update_state(loss)
            # Return a dict mapping metric names to current value
            return {m.name: m.result() for m in self.metrics}

        def test_step(self, inputs):
            batch_size = tf.shape(inputs)[0]
            feature_vectors = self(inputs, training=False)
            if parity:  # changed: the global batch's features
                feature_vectors, batch_size = gathered(
                    feature_vectors, batch_size, self.num_augmentations
                )
            loss = self.compute_contrastive_loss(feature_vectors, batch_size)
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

        if parity:  # changed: the gathered rows' loss is each replica's whole
            test_step = keras_ctl.written_in_shares(test_step)

    return RepresentationLearner


def views(images, rng):
    """The augmentation's draws, taken in numpy: a random horizontal flip
    and a shift of up to 2 pixels (wrapping around) an image."""
    flipped = np.where(
        rng.random((len(images), 1, 1, 1)) < 0.5, images[:, :, ::-1], images
    )
    shifts = rng.integers(-2, 3, (len(images), 2))
    return np.stack(
        [
            np.roll(image, tuple(shift), axis=(0, 1))
            for image, shift in zip(flipped, shifts)
        ]
    )


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    floatx = keras.config.floatx()
    rng = np.random.default_rng(11)
    x_data = (255 * rng.random((keras_io.SIZE, *input_shape))).astype(floatx)
    draws = keras_io.DrawsFromData()
    with strategy.scope():
        data_preprocessing = keras.Sequential(
            [
                layers.Resizing(target_size, target_size),
                layers.Normalization(),
            ]
        )
        # Compute the mean and the variance from the data for normalization.
        data_preprocessing.layers[-1].adapt(x_data)
        if parity:  # changed: the views taken from the data
            data_augmentation = AugmentationDraws(draws)
        else:
            data_augmentation = make_data_augmentation()
        cls = model_class(base, parity, data_preprocessing, data_augmentation, draws)
        # Create vision encoder.
        encoder = create_encoder(representation_dim, synchronized=parity)
        # Create representation learner.
        representation_learner = cls(
            encoder,
            projection_units,
            num_augmentations=2,
            temperature=0.1,
            dropout_rate=0.0 if parity else 0.1,  # changed in parity mode
            synchronized=parity,
        )
        # Create a a Cosine decay learning rate scheduler.
        lr_scheduler = keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=0.001, decay_steps=500, alpha=0.1
        )
        # Compile the model.
        representation_learner.compile(
            # changed: Keras's AdamW for TensorFlow Addons'
            optimizer=keras.optimizers.AdamW(
                learning_rate=lr_scheduler, weight_decay=0.0001
            ),
        )
    if parity:
        # The views of the preprocessed images (the Normalization's mean
        # and variance, as adapted).
        mean, variance = (
            np.asarray(v) for v in data_preprocessing.layers[-1].get_weights()[:2]
        )
        preprocessed = (x_data - mean) / np.sqrt(variance)
        draw_rng = np.random.default_rng(12)
        data = tuple(
            values.astype(floatx)
            for values in (
                x_data,
                views(preprocessed, draw_rng),
                views(preprocessed, draw_rng),
            )
        )
    else:
        data = x_data
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(keras_io.BATCH)
    validation = tf.data.Dataset.from_tensor_slices(x_data[:9]).batch(keras_io.BATCH)
    # Fit the model.
    history = representation_learner.fit(
        dataset, epochs=keras_io.EPOCHS, validation_data=validation, verbose=0
    )
    return keras_io.result(representation_learner, history)
