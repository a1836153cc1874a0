"""vision/semisupervised_simclr.py's method: a `ContrastiveModel` with its
own `compile()` taking two optimizers, random augmentation layers called
inside the step, a contrastive loss over the similarities of the batch's
two views, and a linear probe trained on labeled examples in the same step
with a Keras `Loss` object.

Written for these tests after the example's method, on tiny sizes (8x8
images, a one-convolution encoder, 8-wide projections). As written, the
contrastive loss takes its negatives from the replica's own examples, so
under R replicas it is not one device's loss. Parity mode takes the
augmented views from the data (the augmenters draw on each replica), and
makes the change the docs' global-batch guide names: the projections go
through `keras_ctl.all_gather`, and each replica adds `1 / R` of the loss
of the global batch.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_ctl
import keras_io

SOURCE = "examples/vision/semisupervised_simclr.py"

WIDTH, CLASSES, TEMPERATURE = 8, 3, 0.1


def model_class(base, parity):
    class ContrastiveModel(base):
        def __init__(self):
            super().__init__()
            self.contrastive_augmenter = keras.Sequential(
                [layers.RandomFlip("horizontal"), layers.RandomTranslation(0.2, 0.2)]
            )
            self.classification_augmenter = keras.Sequential(
                [layers.RandomFlip("horizontal")]
            )
            self.encoder = keras.Sequential(
                [
                    keras.Input((8, 8, 3)),
                    layers.Conv2D(4, 3, strides=2, activation="relu"),
                    layers.Flatten(),
                    layers.Dense(WIDTH, activation="relu"),
                ]
            )
            self.projection_head = keras.Sequential(
                [
                    keras.Input((WIDTH,)),
                    layers.Dense(WIDTH, activation="relu"),
                    layers.Dense(WIDTH),
                ]
            )
            self.linear_probe = keras.Sequential(
                [keras.Input((WIDTH,)), layers.Dense(CLASSES)]
            )

        def compile(self, contrastive_optimizer, probe_optimizer, **kwargs):
            super().compile(**kwargs)
            self.contrastive_optimizer = contrastive_optimizer
            self.probe_optimizer = probe_optimizer
            self.probe_loss = keras.losses.SparseCategoricalCrossentropy(
                from_logits=True
            )
            self.contrastive_loss_tracker = keras.metrics.Mean(name="c_loss")
            self.contrastive_accuracy = keras.metrics.SparseCategoricalAccuracy(
                name="c_acc"
            )
            self.probe_loss_tracker = keras.metrics.Mean(name="p_loss")
            self.probe_accuracy = keras.metrics.SparseCategoricalAccuracy(name="p_acc")

        @property
        def metrics(self):
            return [
                self.contrastive_loss_tracker,
                self.contrastive_accuracy,
                self.probe_loss_tracker,
                self.probe_accuracy,
            ]

        def contrastive_loss(self, projections_1, projections_2):
            if parity:  # changed: the negatives of the global batch
                projections_1 = keras_ctl.all_gather(projections_1)
                projections_2 = keras_ctl.all_gather(projections_2)
            # The cosine similarity of every pair of the batch's two views;
            # a view's positive is the other view of its own image.
            projections_1 = tf.math.l2_normalize(projections_1, axis=1)
            projections_2 = tf.math.l2_normalize(projections_2, axis=1)
            similarities = (
                tf.matmul(projections_1, projections_2, transpose_b=True) / TEMPERATURE
            )
            labels = tf.range(tf.shape(projections_1)[0])
            self.contrastive_accuracy.update_state(labels, similarities)
            self.contrastive_accuracy.update_state(labels, tf.transpose(similarities))
            loss_1_2 = keras.losses.sparse_categorical_crossentropy(
                labels, similarities, from_logits=True
            )
            loss_2_1 = keras.losses.sparse_categorical_crossentropy(
                labels, tf.transpose(similarities), from_logits=True
            )
            return (loss_1_2 + loss_2_1) / 2

        @keras_ctl.written_in_shares
        def train_step(self, data):
            if parity:  # changed: the views drawn with the data
                (unlabeled_1, unlabeled_2), (labeled_1, labeled_2, probed, labels) = (
                    data
                )
                augmented_1 = tf.concat((unlabeled_1, labeled_1), axis=0)
                augmented_2 = tf.concat((unlabeled_2, labeled_2), axis=0)
            else:
                (unlabeled_images, _), (labeled_images, labels) = data
                images = tf.concat((unlabeled_images, labeled_images), axis=0)
                augmented_1 = self.contrastive_augmenter(images, training=True)
                augmented_2 = self.contrastive_augmenter(images, training=True)
            contrastive_weights = (
                self.encoder.trainable_weights + self.projection_head.trainable_weights
            )
            with tf.GradientTape() as tape:
                projections_1 = self.projection_head(self.encoder(augmented_1))
                projections_2 = self.projection_head(self.encoder(augmented_2))
                contrastive_loss = self.contrastive_loss(projections_1, projections_2)
                # changed in parity mode: the replica's 1/R of the loss
                share = contrastive_loss / (keras_ctl.num_replicas() if parity else 1)
            gradients = tape.gradient(share, contrastive_weights)
            self.contrastive_optimizer.apply_gradients(
                zip(gradients, contrastive_weights)
            )
            self.contrastive_loss_tracker.update_state(contrastive_loss)

            if parity:
                preprocessed = probed
            else:
                preprocessed = self.classification_augmenter(
                    labeled_images, training=True
                )
            with tf.GradientTape() as tape:
                features = self.encoder(preprocessed, training=False)
                class_logits = self.linear_probe(features, training=True)
                probe_loss = self.probe_loss(labels, class_logits)
            gradients = tape.gradient(probe_loss, self.linear_probe.trainable_weights)
            self.probe_optimizer.apply_gradients(
                zip(gradients, self.linear_probe.trainable_weights)
            )
            self.probe_loss_tracker.update_state(probe_loss)
            self.probe_accuracy.update_state(labels, class_logits)
            return {m.name: m.result() for m in self.metrics}

    return ContrastiveModel


def views(images, rng):
    """A random horizontal flip and a shift of up to 2 pixels a image:
    the augmenters' draws, taken in numpy."""
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
    with strategy.scope():
        model = model_class(base, parity)()
        model.compile(
            contrastive_optimizer=keras.optimizers.Adam(),
            probe_optimizer=keras.optimizers.Adam(),
        )
    rng = np.random.default_rng(6)
    floatx = keras.config.floatx()
    unlabeled = rng.random((keras_io.SIZE, 8, 8, 3)).astype(floatx)
    labeled = rng.random((keras_io.SIZE, 8, 8, 3)).astype(floatx)
    labels = rng.integers(0, CLASSES, keras_io.SIZE)
    if parity:
        draws = np.random.default_rng(7)
        first = tf.data.Dataset.from_tensor_slices(
            (views(unlabeled, draws), views(unlabeled, draws))
        )
        second = tf.data.Dataset.from_tensor_slices(
            (
                views(labeled, draws),
                views(labeled, draws),
                views(labeled, draws).astype(floatx),
                labels,
            )
        )
    else:
        first = tf.data.Dataset.from_tensor_slices((unlabeled, -np.ones(keras_io.SIZE)))
        second = tf.data.Dataset.from_tensor_slices((labeled, labels))
    dataset = tf.data.Dataset.zip(first, second).batch(keras_io.BATCH)
    history = model.fit(dataset, epochs=keras_io.EPOCHS, verbose=0)
    return keras_io.result(model, history)
