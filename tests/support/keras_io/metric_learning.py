"""vision/metric_learning.py: `EmbeddingModel(inputs, embeddings)`, a
functional model whose `train_step` embeds a batch of anchors and their
positives, takes every anchor-positive dot product as logits (a softmax
over the batch's positives for each anchor: in-batch negatives), calls
`self.compute_loss` with each anchor's own positive as its label, and
updates the model's metrics the keras.io way.

The example's Keras 3 version: `self.compute_loss(y=..., y_pred=...)`
and the metrics loop for Keras 2's `compiled_loss` and `compiled_metrics`
(the stored source is Keras 2's), `layers.UnitNormalization()` for
`tf.nn.l2_normalize` on a Keras tensor, and `keras.ops.arange` for
`tf.range`. Changed: sizes (16x16 images, 4 and 8 filters a convolution
for 32, 64 and 128); each batch is 8 pairs (the published batches are
one pair of each of the 10 classes, from a `Sequence` whose batch axis is
axis 1); the data is `((anchors, positives),)`, an `x` only, which the
step's "workaround" unpacks as published; the labels count the batch's
anchors, not the classes (`num_classes`), so batches of any size fit.

As written, each replica's anchors are contrasted with its own positives
only, so under R replicas the loss is not one device's. Parity mode (the
example draws nothing at random) makes the change of the docs' global-batch
guide: the positives go through `keras_ctl.all_gather`, and each anchor's
label is its row in the global batch (`keras_ctl.row_offset`); the step's
`self.compute_loss` then gives one device's loss. The step is declared
`keras_ctl.written_in_shares`, so in both modes it runs in replica shares.
The Keras 3 text is the keras.io page's (the stored repository holds the
Keras 2 source only).
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_ctl
import keras_io

SOURCE = "examples/vision/metric_learning.py"

height_width = 16  # changed: 16x16 images (the published 32x32)
num_classes = 10


def model_class(base, parity):
    class EmbeddingModel(base):
        @keras_ctl.written_in_shares
        def train_step(self, data):
            # Note: Workaround for open issue, to be removed.
            if isinstance(data, tuple):
                data = data[0]
            anchors, positives = data[0], data[1]

            with tf.GradientTape() as tape:
                # Run both anchors and positives through model.
                anchor_embeddings = self(anchors, training=True)
                positive_embeddings = self(positives, training=True)
                if parity:  # changed: every replica's positives
                    positive_embeddings = keras_ctl.all_gather(positive_embeddings)

                # Calculate cosine similarity between anchors and positives. As they
                # have been normalised this is just the pair wise dot products.
                similarities = tf.einsum(
                    "ae,pe->ap", anchor_embeddings, positive_embeddings
                )

                # Since we intend to use these as logits we scale them by a temperature.
                # This value would normally be chosen as a hyper parameter.
                temperature = 0.2
                similarities /= temperature

                # We use these similarities as logits for a softmax. The labels for
                # this call are just the sequence [0, 1, 2, ..., num_classes] since we
                # want the main diagonal values, which correspond to the anchor/positive
                # pairs, to be high. This loss will move embeddings for the
                # anchor/positive pairs together and move all other pairs apart.
                # changed: the batch's anchors counted (the published batches
                # hold `num_classes` pairs); in parity mode, each anchor's row
                # in the global batch
                sparse_labels = keras.ops.arange(keras.ops.shape(anchors)[0])
                if parity:
                    sparse_labels += keras.ops.cast(
                        keras_ctl.row_offset(anchor_embeddings), sparse_labels.dtype
                    )
                loss = self.compute_loss(y=sparse_labels, y_pred=similarities)

            # Calculate gradients and apply via optimizer.
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))

            # Update and return metrics (specifically the one for the loss value).
            for metric in self.metrics:
                # Calling `self.compile` will by default add a `keras.metrics.Mean` loss
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(sparse_labels, similarities)

            return {m.name: m.result() for m in self.metrics}

    return EmbeddingModel


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        inputs = layers.Input(shape=(height_width, height_width, 3))
        # changed: 4, 8 and 8 filters (the published 32, 64 and 128)
        x = layers.Conv2D(filters=4, kernel_size=3, strides=2, activation="relu")(
            inputs
        )
        x = layers.Conv2D(filters=8, kernel_size=3, strides=2, activation="relu")(x)
        x = layers.Conv2D(filters=8, kernel_size=3, strides=2, activation="relu")(x)
        x = layers.GlobalAveragePooling2D()(x)
        embeddings = layers.Dense(units=8, activation=None)(x)
        embeddings = layers.UnitNormalization()(embeddings)

        model = model_class(base, parity)(inputs, embeddings)

        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate=1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    rng = np.random.default_rng(4)
    floatx = keras.config.floatx()
    anchors = rng.random((keras_io.SIZE, height_width, height_width, 3))
    # A positive looks like its anchor: the anchor with a little noise.
    positives = np.clip(anchors + 0.2 * rng.normal(size=anchors.shape), 0, 1)
    pairs = (anchors.astype(floatx), positives.astype(floatx))
    dataset = tf.data.Dataset.from_tensor_slices((pairs,)).batch(keras_io.BATCH)
    history = model.fit(dataset, epochs=keras_io.EPOCHS, verbose=0)
    return keras_io.result(model, history)
