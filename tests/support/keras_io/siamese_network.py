"""vision/siamese_network.py: `SiameseModel(siamese_network)`, whose
`train_step` and `test_step` compute a triplet loss from the network's
anchor-positive and anchor-negative distances and update a `Mean` tracker.

The step's loss is the vector of its examples' triplet losses
(`tf.maximum(ap - an + margin, 0)`, never reduced), so `tape.gradient`
takes the gradient of their sum: a sum over the batch's examples, not a
mean. The step calls the network without `training=True`, so the
embedding's BatchNormalization layers normalize with their moving
statistics (never updated), as published: they couple no examples.

Changed: sizes (8x8 images; one small linear convolution in place of the
pretrained ResNet50, none of it frozen; 8-wide dense layers in place of
512 and 256); the train data is 17 triplets of images in [0, 1] (what the
published pipeline gives `resnet.preprocess_input`), the validation data
the first 9. The example draws nothing at random. Read as one device's code (the
step is not declared in shares), each replica's gradient would be weighed
by its part of the global batch, which is right for a mean and not for
this sum (on 2 replicas in float64 the weights differed from one device's
by 9.1e-7). The first batch's measurement finds the sum and runs the step
in shares: each replica's sum over its examples is its share of the
global batch's sum, and the replicas' gradients are summed as they are.
Parity mode is the published step as written.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import Model
from keras import layers
from keras import metrics
from keras import ops
from keras import optimizers
from keras.applications import resnet

import keras_io

SOURCE = "examples/vision/siamese_network.py"

target_shape = (8, 8)  # changed: 8x8 images (the published 200x200)


class DistanceLayer(layers.Layer):
    """
    This layer is responsible for computing the distance between the anchor
    embedding and the positive embedding, and the anchor embedding and the
    negative embedding.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)

    def call(self, anchor, positive, negative):
        ap_distance = ops.sum(tf.square(anchor - positive), -1)
        an_distance = ops.sum(tf.square(anchor - negative), -1)
        return (ap_distance, an_distance)


def build_siamese_network():
    # changed: a small linear convolution for the pretrained ResNet50
    # (nothing to freeze)
    base_input = layers.Input(shape=target_shape + (3,))
    base_output = layers.Conv2D(4, 3, strides=2)(base_input)

    flatten = layers.Flatten()(base_output)
    dense1 = layers.Dense(8, activation="relu")(flatten)  # changed: 512
    dense1 = layers.BatchNormalization()(dense1)
    dense2 = layers.Dense(8, activation="relu")(dense1)  # changed: 256
    dense2 = layers.BatchNormalization()(dense2)
    output = layers.Dense(8)(dense2)  # changed: 256

    embedding = Model(base_input, output, name="Embedding")

    anchor_input = layers.Input(name="anchor", shape=target_shape + (3,))
    positive_input = layers.Input(name="positive", shape=target_shape + (3,))
    negative_input = layers.Input(name="negative", shape=target_shape + (3,))

    distances = DistanceLayer()(
        embedding(resnet.preprocess_input(anchor_input)),
        embedding(resnet.preprocess_input(positive_input)),
        embedding(resnet.preprocess_input(negative_input)),
    )

    return Model(
        inputs=[anchor_input, positive_input, negative_input], outputs=distances
    )


def model_class(base):
    class SiameseModel(base):
        """The Siamese Network model with a custom training and testing loops.

        Computes the triplet loss using the three embeddings produced by the
        Siamese Network.

        The triplet loss is defined as:
           L(A, P, N) = max(‖f(A) - f(P)‖² - ‖f(A) - f(N)‖² + margin, 0)
        """

        def __init__(self, siamese_network, margin=0.5):
            super().__init__()
            self.siamese_network = siamese_network
            self.margin = margin
            self.loss_tracker = metrics.Mean(name="loss")

        def call(self, inputs):
            return self.siamese_network(inputs)

        def train_step(self, data):
            # GradientTape is a context manager that records every operation that
            # you do inside. We are using it here to compute the loss so we can get
            # the gradients and apply them using the optimizer specified in
            # `compile()`.
            with tf.GradientTape() as tape:
                loss = self._compute_loss(data)

            # Storing the gradients of the loss function with respect to the
            # weights/parameters.
            gradients = tape.gradient(loss, self.siamese_network.trainable_weights)

            # Applying the gradients on the model using the specified optimizer
            self.optimizer.apply_gradients(
                zip(gradients, self.siamese_network.trainable_weights)
            )

            # Let's update and return the training loss metric.
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

        def test_step(self, data):
            loss = self._compute_loss(data)

            # Let's update and return the loss metric.
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

        def _compute_loss(self, data):
            # The output of the network is a tuple containing the distances
            # between the anchor and the positive example, and the anchor and
            # the negative example.
            ap_distance, an_distance = self.siamese_network(data)

            # Computing the Triplet Loss by subtracting both distances and
            # making sure we don't get a negative value.
            loss = ap_distance - an_distance
            loss = tf.maximum(loss + self.margin, 0.0)
            return loss

        @property
        def metrics(self):
            # We need to list our metrics here so the `reset_states()` can be
            # called automatically.
            return [self.loss_tracker]

    return SiameseModel


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        siamese_network = build_siamese_network()
        siamese_model = model_class(base)(siamese_network)
        siamese_model.compile(optimizer=optimizers.Adam(0.0001))
    rng = np.random.default_rng(3)
    # Images in [0, 1], as the published pipeline's `convert_image_dtype`
    # gives them to `resnet.preprocess_input`.
    triplets = tuple(
        rng.random((keras_io.SIZE, *target_shape, 3)).astype(keras.config.floatx())
        for _ in range(3)
    )
    train_dataset = tf.data.Dataset.from_tensor_slices(triplets).batch(keras_io.BATCH)
    val_dataset = tf.data.Dataset.from_tensor_slices(
        tuple(images[:9] for images in triplets)
    ).batch(keras_io.BATCH)
    history = siamese_model.fit(
        train_dataset, epochs=keras_io.EPOCHS, validation_data=val_dataset, verbose=0
    )
    return keras_io.result(siamese_model, history)
