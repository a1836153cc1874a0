"""vision/siamese_contrastive.py: a functional siamese network (two
towers sharing one embedding network, the Euclidean distance of their
embeddings, BatchNormalization and a sigmoid), compiled with a contrastive
loss of the example's own (a function returning
`tf.math.reduce_mean(...)` over the batch: one value for the batch),
RMSprop and accuracy.

The second siamese form of keras.io, beside the triplet network
(`siamese_network`): it overrides no step; its loss of one's own is read
as one device computes it, measured on the first batch of the train and
test functions (`_engine/loss_mean.read_compiled_losses`): a mean over
examples, so each replica's value is weighed by its part. Its
`BatchNormalization` layers (plain, in the embedding network and on the
distance) normalize each replica's examples: parity mode compiles the
`CTLModel` with `batch_statistics="global"`, which synchronizes their
moments; as written they keep each replica's, warned of. In parity mode
it equals one device on 2 and 3 replicas (float64: 5.3e-16 and 4.9e-16;
float32 on 3: 1.7e-7).

Changed: the data are 17 generated pairs of 28x28 images (values in
[0, 255], as the example's `astype("float32")` MNIST) with labels 1 and 0
in turn, the validation data the first 9; `tf.keras` is `keras`
(`keras.backend.epsilon()`). The example draws nothing at random in its
model (the pairs are drawn before training).
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_io

SOURCE = "examples/vision/siamese_contrastive.py"

margin = 1  # Margin for constrastive loss.


# Provided two tensors t1 and t2
# Euclidean distance = sqrt(sum(square(t1-t2)))
def euclidean_distance(vects):
    """Find the Euclidean distance between two vectors.

    Arguments:
        vects: List containing two tensors of same length.

    Returns:
        Tensor containing euclidean distance
        (as floating point value) between vectors.
    """

    x, y = vects
    sum_square = tf.math.reduce_sum(tf.math.square(x - y), axis=1, keepdims=True)
    return tf.math.sqrt(tf.math.maximum(sum_square, keras.backend.epsilon()))


def build_siamese(base):
    input = layers.Input((28, 28, 1))
    x = keras.layers.BatchNormalization()(input)
    x = layers.Conv2D(4, (5, 5), activation="tanh")(x)
    x = layers.AveragePooling2D(pool_size=(2, 2))(x)
    x = layers.Conv2D(16, (5, 5), activation="tanh")(x)
    x = layers.AveragePooling2D(pool_size=(2, 2))(x)
    x = layers.Flatten()(x)

    x = keras.layers.BatchNormalization()(x)
    x = layers.Dense(10, activation="tanh")(x)
    embedding_network = keras.Model(input, x)

    input_1 = layers.Input((28, 28, 1))
    input_2 = layers.Input((28, 28, 1))

    # As mentioned above, Siamese Network share weights between
    # tower networks (sister networks). To allow this, we will use
    # same embedding network for both tower networks.
    tower_1 = embedding_network(input_1)
    tower_2 = embedding_network(input_2)

    merge_layer = layers.Lambda(euclidean_distance)([tower_1, tower_2])
    normal_layer = keras.layers.BatchNormalization()(merge_layer)
    output_layer = layers.Dense(1, activation="sigmoid")(normal_layer)
    return base(inputs=[input_1, input_2], outputs=output_layer)


def loss(margin=1):
    """Provides 'constrastive_loss' an enclosing scope with variable 'margin'."""

    # Contrastive loss = mean( (1-true_value) * square(prediction) +
    #                         true_value * square( max(margin-prediction, 0) ))
    def contrastive_loss(y_true, y_pred):
        square_pred = tf.math.square(y_pred)
        margin_square = tf.math.square(tf.math.maximum(margin - (y_pred), 0))
        return tf.math.reduce_mean(
            (1 - y_true) * square_pred + (y_true) * margin_square
        )

    return contrastive_loss


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    floatx = keras.config.floatx()
    rng = np.random.default_rng(3)
    pairs = rng.integers(0, 256, (keras_io.SIZE, 2, 28, 28, 1)).astype(floatx)
    labels = (np.arange(keras_io.SIZE) % 2 == 0).astype(floatx)
    x_1, x_2 = pairs[:, 0], pairs[:, 1]
    with strategy.scope():
        siamese = build_siamese(base)
        options = {}
        if parity and base is not keras.Model:  # changed: synchronized moments
            options["batch_statistics"] = "global"
        siamese.compile(
            loss=loss(margin=margin),
            optimizer="RMSprop",
            metrics=["accuracy"],
            **options,
        )
    history = siamese.fit(
        [x_1, x_2],
        labels,
        validation_data=([x_1[:9], x_2[:9]], labels[:9]),
        batch_size=keras_io.BATCH,
        epochs=keras_io.EPOCHS,
        shuffle=False,  # changed: one order for one device and the replicas
        verbose=0,
    )
    return keras_io.result(siamese, history)
