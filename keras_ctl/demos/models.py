"""Small models of the tutorials, for the command line and the examples."""

import keras

from keras_ctl.gan import GAN
from keras_ctl.model import CTLModel


def tutorial_cnn(input_shape, num_classes=10, model_class=CTLModel):
    """The CNN of the TensorFlow distributed-training tutorial.

    `padding="same"` keeps it valid for 8x8 digits as well as 28x28 images.
    """
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    return model_class(inputs, keras.layers.Dense(num_classes)(x))


def guide_mlp(model_class=CTLModel):
    """The MLP of the Keras guide "Writing a training loop from scratch"
    (784-64-64-10, logits)."""
    inputs = keras.Input((784,))
    x = keras.layers.Dense(64, activation="relu")(inputs)
    x = keras.layers.Dense(64, activation="relu")(x)
    return model_class(inputs, keras.layers.Dense(10)(x))


def transformer_block(model_class=CTLModel, blocks=1):
    """`blocks` transformer blocks (each: attention of 4 heads of 16, a
    feed-forward of 128) on 16 tokens of 64 features, 10 logits: the
    benchmarks' model of attention. Defaults to one block."""
    inputs = keras.Input((16, 64))
    x = inputs
    for _ in range(blocks):
        attended = keras.layers.MultiHeadAttention(4, 16)(x, x)
        x = keras.layers.LayerNormalization()(x + attended)
        forward = keras.layers.Dense(128, activation="relu")(x)
        x = keras.layers.LayerNormalization()(x + keras.layers.Dense(64)(forward))
    x = keras.layers.GlobalAveragePooling1D()(x)
    return model_class(inputs, keras.layers.Dense(10)(x))


def gan_models(image_shape, latent_dim):
    """A small DCGAN `(discriminator, generator)` for `image_shape` images
    whose height and width are even (8x8 digits, 28x28 MNIST).

    The convolutions followed by LeakyReLU have no bias: TensorFlow's graph
    optimizer (grappler's remapper) tries to fuse Conv2D + BiasAdd +
    LeakyRelu while the gradient of LeakyRelu still reads the BiasAdd, and
    logs "remapper failed: INVALID_ARGUMENT" on every trace (harmless: the
    graph runs unfused).
    """
    height, width, channels = image_shape
    generator = keras.Sequential(
        [
            keras.Input((latent_dim,)),
            keras.layers.Dense(height // 2 * width // 2 * 64),
            keras.layers.LeakyReLU(0.2),
            keras.layers.Reshape((height // 2, width // 2, 64)),
            keras.layers.UpSampling2D(),
            keras.layers.Conv2D(64, 3, padding="same", use_bias=False),
            keras.layers.LeakyReLU(0.2),
            keras.layers.Conv2D(channels, 3, padding="same", activation="sigmoid"),
        ],
        name="generator",
    )
    discriminator = keras.Sequential(
        [
            keras.Input(image_shape),
            keras.layers.Conv2D(64, 3, strides=2, padding="same", use_bias=False),
            keras.layers.LeakyReLU(0.2),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ],
        name="discriminator",
    )
    return discriminator, generator


def gan(image_shape, latent_dim=32, **gan_kwargs):
    """A compiled `keras_ctl.GAN` over `gan_models` (Adam, beta_1=0.5)."""
    discriminator, generator = gan_models(image_shape, latent_dim)
    model = GAN(
        discriminator=discriminator,
        generator=generator,
        latent_dim=latent_dim,
        **gan_kwargs,
    )
    model.compile(
        d_optimizer=keras.optimizers.Adam(1e-3, beta_1=0.5),
        g_optimizer=keras.optimizers.Adam(1e-3, beta_1=0.5),
    )
    return model


def trunk(input_shape):
    """A small convolutional trunk shared by several heads."""
    return keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Conv2D(16, 3, activation="relu", name="conv"),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu", name="features"),
        ],
        name="trunk",
    )


def class_head_model(trunk, inputs, num_classes=10):
    """`trunk` + a 10-way `class_head`, compiled with variable groups: the
    trunk by SGD with momentum, the head by Adam (`MultiOptimizer`)."""
    head = keras.layers.Dense(num_classes, name="class_head")
    model = CTLModel(inputs, head(trunk(inputs)))
    model.compile(
        optimizer=keras.optimizers.MultiOptimizer(
            keras.optimizers.OptimizerMap(
                default_optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                optimizer_map={"class_head/.*": keras.optimizers.Adam(1e-3)},
            )
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def parity_head_model(trunk, inputs):
    """The frozen `trunk` + a 1-unit `parity_head` (even / odd digit),
    compiled with Adam; only the head trains. Call it in the strategy's
    scope."""
    trunk.trainable = False
    model = CTLModel(inputs, keras.layers.Dense(1, name="parity_head")(trunk(inputs)))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=[keras.metrics.BinaryAccuracy(threshold=0.0, name="accuracy")],
    )
    return model
