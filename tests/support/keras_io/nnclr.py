"""vision/nnclr.py: `NNCLR`, with its own `compile()` taking two
optimizers, a feature queue (a non-trainable variable of projections)
searched for each projection's nearest neighbour, a contrastive loss over
the batch's two views, contrastive and correlation accuracies of the
batch's features, a linear probe trained in the same step, and a
`test_step` (run on validation data here).

Changed beyond parity mode, to run on tiny data:

- sizes: 8x8 images, two convolutions in place of four, 8-wide features,
  a queue of 24 (the published 10 classes);
- the augmenters' keras_cv layers are Keras's own (`RandomZoom` zooming
  in for `RandomCropAndResize`, `RandomBrightness`);
- `update_correlation_accuracy` casts the batch's size before dividing by
  it: in a step traced for batches of any size (17 examples in batches of
  8) it is an integer tensor, which TensorFlow does not divide a float by;
  the published batches are static (`drop_remainder=True`);
- `ops.transpose` as on the published page (the source's revision of
  2024/01/19 misspells it `ops.tranpose`).

The published step returns `contrastive_loss`, a value per row and
similarity matrix, as `c_loss`.

As written, the nearest neighbours, the negatives, the accuracies and the
queue's update come from the replica's own examples, so under R replicas
the step is not one device's; and on a replica without examples
`self.feature_queue[:-batch_size]` with `batch_size` 0 is empty, so the
queue's `assign` fails ("Trying to assign to variable with tensor with
wrong shape. Expected [24,8] got [0,8]"): it does not run as written under
2 replicas. Parity mode takes the augmented views from the data, and makes
the changes of the docs' global-batch guide: the projections (and the
features the accuracies read) go through `keras_ctl.all_gather` before the
lookup and the loss, in one device's row order, so every replica pushes
the global batch's projections into its queue, and each replica adds
`1 / R` of the loss; the probe's accuracy is named as logged, so its
result is read from every replica's state.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers
from keras import ops

import keras_ctl
import keras_io

SOURCE = "examples/vision/nnclr.py"

TEMPERATURE, QUEUE_SIZE = 0.1, 24
# The initial weights. In float32 the step is sensitive to round-off: Adam's
# first update is about `lr * sign(gradient)`, so an entry whose gradient is
# near zero moves by +-lr on round-off, and the accuracies' argmax can flip
# on near-ties. With this seed one device and 2 or 3 replicas stay within
# 1e-6 in float32 (seeds 0 to 7 range from 6e-8 to 1.5e-2); float64 stays
# within 1e-14 with seeds 0 and 7.
SEED = 7
INPUT_SHAPE, WIDTH, CLASSES = (8, 8, 3), 8, 10
CONTRASTIVE_AUGMENTER = {
    "brightness": 0.5,
    "name": "contrastive_augmenter",
    "scale": (0.2, 1.0),
}
CLASSIFICATION_AUGMENTER = {
    "brightness": 0.2,
    "name": "classification_augmenter",
    "scale": (0.5, 1.0),
}


def augmenter(brightness, name, scale):
    # changed: Keras's layers for keras_cv's; zooming in by up to
    # 1 - sqrt(area) crops about `scale` of the image and resizes it.
    zoom = (-(1 - scale[0] ** 0.5), -(1 - scale[1] ** 0.5))
    return keras.Sequential(
        [
            layers.Input(shape=INPUT_SHAPE),
            layers.Rescaling(1 / 255),
            layers.RandomFlip("horizontal"),
            layers.RandomZoom(zoom),
            layers.RandomBrightness(factor=brightness, value_range=(0.0, 1.0)),
        ],
        name=name,
    )


def encoder():
    return keras.Sequential(
        [
            layers.Input(shape=INPUT_SHAPE),
            layers.Conv2D(WIDTH, kernel_size=3, strides=2, activation="relu"),
            layers.Conv2D(WIDTH, kernel_size=3, strides=2, activation="relu"),
            layers.Flatten(),
            layers.Dense(WIDTH, activation="relu"),
        ],
        name="encoder",
    )


def gathered(rows, unlabeled):
    """`rows` (the replica's unlabeled rows, then its labeled rows) of
    every replica, in one device's order: every unlabeled row first. A
    plain gather would interleave the replicas' parts, and the queue keeps
    its newest rows in order."""
    count = ops.shape(unlabeled)[0]
    return ops.concatenate(
        [keras_ctl.all_gather(rows[:count]), keras_ctl.all_gather(rows[count:])],
        axis=0,
    )


def model_class(base, parity):
    class NNCLR(base):
        def __init__(
            self,
            temperature,
            queue_size,
        ):
            super().__init__()
            # changed in parity mode: named as logged, so `p_acc` is read
            # from every replica's state (each replica probes its examples)
            self.probe_accuracy = keras.metrics.SparseCategoricalAccuracy(
                **({"name": "p_acc"} if parity else {})
            )
            self.correlation_accuracy = keras.metrics.SparseCategoricalAccuracy()
            self.contrastive_accuracy = keras.metrics.SparseCategoricalAccuracy()
            self.probe_loss = keras.losses.SparseCategoricalCrossentropy(
                from_logits=True
            )

            self.contrastive_augmenter = augmenter(**CONTRASTIVE_AUGMENTER)
            self.classification_augmenter = augmenter(**CLASSIFICATION_AUGMENTER)
            self.encoder = encoder()
            self.projection_head = keras.Sequential(
                [
                    layers.Input(shape=(WIDTH,)),
                    layers.Dense(WIDTH, activation="relu"),
                    layers.Dense(WIDTH),
                ],
                name="projection_head",
            )
            self.linear_probe = keras.Sequential(
                [layers.Input(shape=(WIDTH,)), layers.Dense(CLASSES)],
                name="linear_probe",
            )
            self.temperature = temperature

            feature_dimensions = self.encoder.output_shape[1]
            self.feature_queue = keras.Variable(
                keras.utils.normalize(
                    keras.random.normal(shape=(queue_size, feature_dimensions)),
                    axis=1,
                    order=2,
                ),
                trainable=False,
            )

        def compile(self, contrastive_optimizer, probe_optimizer, **kwargs):
            super().compile(**kwargs)
            self.contrastive_optimizer = contrastive_optimizer
            self.probe_optimizer = probe_optimizer

        def nearest_neighbour(self, projections):
            support_similarities = ops.matmul(
                projections, ops.transpose(self.feature_queue)
            )
            nn_projections = ops.take(
                self.feature_queue, ops.argmax(support_similarities, axis=1), axis=0
            )
            return projections + ops.stop_gradient(nn_projections - projections)

        def update_contrastive_accuracy(self, features_1, features_2):
            features_1 = keras.utils.normalize(features_1, axis=1, order=2)
            features_2 = keras.utils.normalize(features_2, axis=1, order=2)
            similarities = ops.matmul(features_1, ops.transpose(features_2))
            batch_size = ops.shape(features_1)[0]
            contrastive_labels = ops.arange(batch_size)
            self.contrastive_accuracy.update_state(
                ops.concatenate([contrastive_labels, contrastive_labels], axis=0),
                ops.concatenate([similarities, ops.transpose(similarities)], axis=0),
            )

        def update_correlation_accuracy(self, features_1, features_2):
            features_1 = (features_1 - ops.mean(features_1, axis=0)) / ops.std(
                features_1, axis=0
            )
            features_2 = (features_2 - ops.mean(features_2, axis=0)) / ops.std(
                features_2, axis=0
            )

            # changed: cast, the batch's size is a tensor in a step traced
            # for batches of any size (the published batches are static)
            batch_size = ops.cast(ops.shape(features_1)[0], features_1.dtype)
            cross_correlation = (
                ops.matmul(ops.transpose(features_1), features_2) / batch_size
            )

            feature_dim = ops.shape(features_1)[1]
            correlation_labels = ops.arange(feature_dim)
            self.correlation_accuracy.update_state(
                ops.concatenate([correlation_labels, correlation_labels], axis=0),
                ops.concatenate(
                    [cross_correlation, ops.transpose(cross_correlation)], axis=0
                ),
            )

        def contrastive_loss(self, projections_1, projections_2):
            projections_1 = keras.utils.normalize(projections_1, axis=1, order=2)
            projections_2 = keras.utils.normalize(projections_2, axis=1, order=2)

            similarities_1_2_1 = (
                ops.matmul(
                    self.nearest_neighbour(projections_1), ops.transpose(projections_2)
                )
                / self.temperature
            )
            similarities_1_2_2 = (
                ops.matmul(
                    projections_2, ops.transpose(self.nearest_neighbour(projections_1))
                )
                / self.temperature
            )

            similarities_2_1_1 = (
                ops.matmul(
                    self.nearest_neighbour(projections_2), ops.transpose(projections_1)
                )
                / self.temperature
            )
            similarities_2_1_2 = (
                ops.matmul(
                    projections_1, ops.transpose(self.nearest_neighbour(projections_2))
                )
                / self.temperature
            )

            batch_size = ops.shape(projections_1)[0]
            contrastive_labels = ops.arange(batch_size)
            loss = keras.losses.sparse_categorical_crossentropy(
                ops.concatenate(
                    [
                        contrastive_labels,
                        contrastive_labels,
                        contrastive_labels,
                        contrastive_labels,
                    ],
                    axis=0,
                ),
                ops.concatenate(
                    [
                        similarities_1_2_1,
                        similarities_1_2_2,
                        similarities_2_1_1,
                        similarities_2_1_2,
                    ],
                    axis=0,
                ),
                from_logits=True,
            )

            self.feature_queue.assign(
                ops.concatenate(
                    [projections_1, self.feature_queue[:-batch_size]], axis=0
                )
            )
            return loss

        @keras_ctl.written_in_shares
        def train_step(self, data):
            if parity:  # changed: the views drawn with the data
                (unlabeled_1, unlabeled_2), (labeled_1, labeled_2, probed, labels) = (
                    data
                )
                augmented_images_1 = ops.concatenate((unlabeled_1, labeled_1), axis=0)
                augmented_images_2 = ops.concatenate((unlabeled_2, labeled_2), axis=0)
            else:
                (unlabeled_images, _), (labeled_images, labels) = data
                images = ops.concatenate((unlabeled_images, labeled_images), axis=0)
                augmented_images_1 = self.contrastive_augmenter(images)
                augmented_images_2 = self.contrastive_augmenter(images)

            with tf.GradientTape() as tape:
                features_1 = self.encoder(augmented_images_1)
                features_2 = self.encoder(augmented_images_2)
                projections_1 = self.projection_head(features_1)
                projections_2 = self.projection_head(features_2)
                if parity:  # changed: the global batch's projections
                    projections_1 = gathered(projections_1, unlabeled_1)
                    projections_2 = gathered(projections_2, unlabeled_1)
                contrastive_loss = self.contrastive_loss(projections_1, projections_2)
                # changed in parity mode: the replica's 1/R of the loss
                share = contrastive_loss / (keras_ctl.num_replicas() if parity else 1)
            gradients = tape.gradient(
                share,
                self.encoder.trainable_weights + self.projection_head.trainable_weights,
            )
            self.contrastive_optimizer.apply_gradients(
                zip(
                    gradients,
                    self.encoder.trainable_weights
                    + self.projection_head.trainable_weights,
                )
            )
            if parity:  # changed: the accuracies of the global batch
                features_1 = gathered(features_1, unlabeled_1)
                features_2 = gathered(features_2, unlabeled_1)
            self.update_contrastive_accuracy(features_1, features_2)
            self.update_correlation_accuracy(features_1, features_2)
            if parity:
                preprocessed_images = probed
            else:
                preprocessed_images = self.classification_augmenter(labeled_images)

            with tf.GradientTape() as tape:
                features = self.encoder(preprocessed_images)
                class_logits = self.linear_probe(features)
                probe_loss = self.probe_loss(labels, class_logits)
            gradients = tape.gradient(probe_loss, self.linear_probe.trainable_weights)
            self.probe_optimizer.apply_gradients(
                zip(gradients, self.linear_probe.trainable_weights)
            )
            self.probe_accuracy.update_state(labels, class_logits)

            return {
                "c_loss": contrastive_loss,
                "c_acc": self.contrastive_accuracy.result(),
                "r_acc": self.correlation_accuracy.result(),
                "p_loss": probe_loss,
                "p_acc": self.probe_accuracy.result(),
            }

        def test_step(self, data):
            labeled_images, labels = data

            preprocessed_images = self.classification_augmenter(
                labeled_images, training=False
            )
            features = self.encoder(preprocessed_images, training=False)
            class_logits = self.linear_probe(features, training=False)
            probe_loss = self.probe_loss(labels, class_logits)

            self.probe_accuracy.update_state(labels, class_logits)
            return {"p_loss": probe_loss, "p_acc": self.probe_accuracy.result()}

    return NNCLR


def views(images, rng, brightness):
    """The augmenters' draws, taken in numpy: rescaled to [0, 1], a random
    horizontal flip, a shift of up to 2 pixels and a brightness factor."""
    images = images / 255
    flipped = np.where(
        rng.random((len(images), 1, 1, 1)) < 0.5, images[:, :, ::-1], images
    )
    shifts = rng.integers(-2, 3, (len(images), 2))
    shifted = np.stack(
        [
            np.roll(image, tuple(shift), axis=(0, 1))
            for image, shift in zip(flipped, shifts)
        ]
    )
    factors = rng.uniform(1 - brightness, 1 + brightness, (len(images), 1, 1, 1))
    return np.clip(shifted * factors, 0, 1).astype(keras.config.floatx())


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(SEED)
    with strategy.scope():
        model = model_class(base, parity)(
            temperature=TEMPERATURE, queue_size=QUEUE_SIZE
        )
        model.compile(
            contrastive_optimizer=keras.optimizers.Adam(),
            probe_optimizer=keras.optimizers.Adam(),
            jit_compile=False,
        )
    rng = np.random.default_rng(8)
    floatx = keras.config.floatx()
    unlabeled = (rng.random((keras_io.SIZE, *INPUT_SHAPE)) * 255).astype(floatx)
    labeled = (rng.random((keras_io.SIZE, *INPUT_SHAPE)) * 255).astype(floatx)
    labels = rng.integers(0, CLASSES, keras_io.SIZE)
    # The last global batch holds one image of each set: two rows, which
    # the correlation accuracy standardizes to +-1, so its argmax breaks
    # exact ties by round-off (one device's and R replicas' differ). Black
    # images give the two rows equal features, and the same tie-break.
    unlabeled[-1] = labeled[-1] = 0
    if parity:
        draws = np.random.default_rng(9)
        contrastive = CONTRASTIVE_AUGMENTER["brightness"]
        first = tf.data.Dataset.from_tensor_slices(
            (views(unlabeled, draws, contrastive), views(unlabeled, draws, contrastive))
        )
        second = tf.data.Dataset.from_tensor_slices(
            (
                views(labeled, draws, contrastive),
                views(labeled, draws, contrastive),
                views(labeled, draws, CLASSIFICATION_AUGMENTER["brightness"]),
                labels,
            )
        )
    else:
        first = tf.data.Dataset.from_tensor_slices((unlabeled, -np.ones(keras_io.SIZE)))
        second = tf.data.Dataset.from_tensor_slices((labeled, labels))
    dataset = tf.data.Dataset.zip(first, second).batch(keras_io.BATCH)
    validation = tf.data.Dataset.from_tensor_slices((labeled, labels)).batch(
        keras_io.BATCH
    )
    history = model.fit(
        dataset, epochs=keras_io.EPOCHS, validation_data=validation, verbose=0
    )
    return keras_io.result(model, history)
