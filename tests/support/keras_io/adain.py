"""generative/adain.py: `NeuralStyleTransfer(encoder, decoder, loss_net,
style_weight)`, whose `compile(optimizer, loss_fn)` keeps a Keras
`MeanSquaredError` and whose `compute_loss` (no `training` argument) runs
the frozen loss network on the decoded images and on the style images,
adds the content loss (the AdaIN target against the decoded image's last
features) and the style loss (the means and standard deviations of each
example's feature maps, per level), and updates three loss trackers; the
default `train_step` and `test_step` call it (validation data here).

The AdaIN statistics are each example's own (over its height and width),
so nothing couples the batch's examples; the loss is Keras `Loss` objects'
means, and the example has no random draws: read as one device's code it
equals one device as written, in both modes. The example's current
version overrides `compute_loss` (its earlier versions overrode
`train_step` and `test_step`).

Changed: sizes (16x16 images; the decoder's filters 16, 8, 8 and 4 for the
published 512, 256, 128 and 64); the pretrained VGG19 of the encoder and
of the loss network is `tiny_vgg()`, four frozen random convolutions named
after the VGG19 layers the example reads (`block1_conv1` to
`block4_conv1`, a max pooling between blocks), built with the same seeded
initializers for both, so that the encoder is the loss network's last
level, as the two pretrained VGG19 are; the `PyDataset` of image files
(and its CIFAR-10 fallback) is a dataset of random style and content
images; the plotting callback is left out.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_io

SOURCE = "examples/generative/adain.py"

IMAGE_SIZE = (16, 16)
VGG_LAYERS = (("block1_conv1", 4), ("block2_conv1", 8), ("block3_conv1", 8))
VGG_LAYERS += (("block4_conv1", 16),)


def tiny_vgg():  # changed: for VGG19 with ImageNet weights
    inputs = layers.Input([*IMAGE_SIZE, 3])
    x = inputs
    for index, (name, filters) in enumerate(VGG_LAYERS):
        if index:
            x = layers.MaxPooling2D(name=f"block{index}_pool")(x)
        x = layers.Conv2D(
            filters,
            3,
            padding="same",
            activation="relu",
            name=name,
            kernel_initializer=keras.initializers.GlorotUniform(seed=index),
            bias_initializer=keras.initializers.RandomUniform(-0.1, 0.1, seed=index),
        )(x)
    return keras.Model(inputs, x, name="vgg19")


def get_encoder():
    vgg19 = tiny_vgg()  # changed
    vgg19.trainable = False
    mini_vgg19 = keras.Model(vgg19.input, vgg19.get_layer("block4_conv1").output)

    inputs = layers.Input([*IMAGE_SIZE, 3])
    mini_vgg19_out = mini_vgg19(inputs)
    return keras.Model(inputs, mini_vgg19_out, name="mini_vgg19")


def get_mean_std(x, epsilon=1e-5):
    axes = [1, 2]

    # Compute the mean and standard deviation of a tensor.
    mean, variance = keras.ops.moments(x, axes=axes, keepdims=True)
    standard_deviation = keras.ops.sqrt(variance + epsilon)
    return mean, standard_deviation


def ada_in(style, content):
    """Computes the AdaIn feature map.

    Args:
        style: The style feature map.
        content: The content feature map.

    Returns:
        The AdaIN feature map.
    """
    content_mean, content_std = get_mean_std(content)
    style_mean, style_std = get_mean_std(style)
    t = style_std * (content - content_mean) / content_std + style_mean
    return t


def get_decoder():
    config = {"kernel_size": 3, "strides": 1, "padding": "same", "activation": "relu"}
    decoder = keras.Sequential(
        [
            layers.InputLayer((None, None, 16)),  # changed: sizes
            layers.Conv2D(filters=16, **config),
            layers.UpSampling2D(),
            layers.Conv2D(filters=8, **config),
            layers.Conv2D(filters=8, **config),
            layers.Conv2D(filters=8, **config),
            layers.Conv2D(filters=8, **config),
            layers.UpSampling2D(),
            layers.Conv2D(filters=8, **config),
            layers.Conv2D(filters=8, **config),
            layers.UpSampling2D(),
            layers.Conv2D(filters=4, **config),
            layers.Conv2D(
                filters=3,
                kernel_size=3,
                strides=1,
                padding="same",
                activation="sigmoid",
            ),
        ]
    )
    return decoder


def get_loss_net():
    vgg19 = tiny_vgg()  # changed
    vgg19.trainable = False
    layer_names = ["block1_conv1", "block2_conv1", "block3_conv1", "block4_conv1"]
    outputs = [vgg19.get_layer(name).output for name in layer_names]
    mini_vgg19 = keras.Model(vgg19.input, outputs)

    inputs = layers.Input([*IMAGE_SIZE, 3])
    mini_vgg19_out = mini_vgg19(inputs)
    return keras.Model(inputs, mini_vgg19_out, name="loss_net")


def model_class(base):
    class NeuralStyleTransfer(base):
        def __init__(self, encoder, decoder, loss_net, style_weight, **kwargs):
            super().__init__(**kwargs)
            self.encoder = encoder
            self.decoder = decoder
            self.loss_net = loss_net
            self.style_weight = style_weight

            self.style_loss_tracker = keras.metrics.Mean(name="style_loss")
            self.content_loss_tracker = keras.metrics.Mean(name="content_loss")
            self.total_loss_tracker = keras.metrics.Mean(name="total_loss")

        def compile(self, optimizer, loss_fn, **kwargs):
            super().compile(optimizer=optimizer, **kwargs)
            self.loss_fn = loss_fn

        def call(self, inputs, training=False):
            style, content = inputs

            # Encode style and content, then construct AdaIN target.
            style_encoded = self.encoder(style, training=False)
            content_encoded = self.encoder(content, training=False)
            target_features = ada_in(style=style_encoded, content=content_encoded)

            # Decode back into image space.
            reconstructed_image = self.decoder(target_features, training=training)

            return {
                "reconstructed_image": reconstructed_image,
                "target_features": target_features,
                "style": style,
            }

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
            # Loss content comes from target AdaIN features vs reconstructed features.
            reconstructed_vgg_features = self.loss_net(
                y_pred["reconstructed_image"], training=False
            )
            style_vgg_features = self.loss_net(y_pred["style"], training=False)

            loss_content = self.loss_fn(
                y_pred["target_features"], reconstructed_vgg_features[-1]
            )

            # Style loss matches means/variances at each VGG feature level.
            loss_style = 0.0
            for inp, out in zip(style_vgg_features, reconstructed_vgg_features):
                mean_inp, std_inp = get_mean_std(inp)
                mean_out, std_out = get_mean_std(out)
                loss_style += self.loss_fn(mean_inp, mean_out) + self.loss_fn(
                    std_inp, std_out
                )
            loss_style = self.style_weight * loss_style

            total_loss = loss_content + loss_style

            # Update trackers for progress logs.
            self.style_loss_tracker.update_state(loss_style)
            self.content_loss_tracker.update_state(loss_content)
            self.total_loss_tracker.update_state(total_loss)

            return total_loss

        @property
        def metrics(self):
            return [
                self.style_loss_tracker,
                self.content_loss_tracker,
                self.total_loss_tracker,
            ]

    return NeuralStyleTransfer


def train(base, strategy, parity=True):
    del parity  # no random draws: the same steps in both modes
    keras.utils.set_random_seed(0)
    floatx = keras.config.floatx()
    rng = np.random.default_rng(4)
    style, content, val_style, val_content = (
        rng.random((size, *IMAGE_SIZE, 3)).astype(floatx)
        for size in (keras_io.SIZE, keras_io.SIZE, 9, 9)
    )
    with strategy.scope():
        optimizer = keras.optimizers.Adam(learning_rate=1e-3)  # changed: 1e-5
        loss_fn = keras.losses.MeanSquaredError()

        encoder = get_encoder()
        loss_net = get_loss_net()
        decoder = get_decoder()

        model = model_class(base)(
            encoder=encoder, decoder=decoder, loss_net=loss_net, style_weight=4.0
        )

        model.compile(optimizer=optimizer, loss_fn=loss_fn)
    # x only, as a length-1 tuple: fit() takes (style, content) as the input.
    train_ds = tf.data.Dataset.from_tensor_slices(((style, content),))
    val_ds = tf.data.Dataset.from_tensor_slices(((val_style, val_content),))
    history = model.fit(
        train_ds.batch(keras_io.BATCH),
        epochs=keras_io.EPOCHS,
        validation_data=val_ds.batch(keras_io.BATCH),
        verbose=0,
    )
    return keras_io.result(model, history)
