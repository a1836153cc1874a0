"""vision/zero_dce.py: `ZeroDCE()`, whose `compile(learning_rate)` sets its
own optimizer, a Keras `Loss` with `reduction="none"` and five loss
trackers, and whose `train_step` and `test_step` compute four
zero-reference losses of their own (`tf.reduce_mean`s and a sum divided by
the replica's batch size) on the enhanced images.

Its steps have no random draws and are not declared in shares, so they are
read as one device's code and equal one device as written. The example's
Keras 3 version (trackers made in `compile()`, `metrics` listing them).
Changed: sizes (16x16 images, the smallest the exposure loss's 16x16
pooling takes; 4 filters a convolution instead of 32); the spatial
consistency kernels and the illumination smoothness counts are in the
run's dtype (the example makes them float32); its `save_weights` and
`load_weights` overrides, Keras 2's signatures that `fit()` never calls,
are left out.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_io

SOURCE = "examples/vision/zero_dce.py"

IMAGE_SIZE = 16
FILTERS = 4


def build_dce_net():
    input_img = keras.Input(shape=[None, None, 3])
    conv1 = layers.Conv2D(
        FILTERS, (3, 3), strides=(1, 1), activation="relu", padding="same"
    )(input_img)
    conv2 = layers.Conv2D(
        FILTERS, (3, 3), strides=(1, 1), activation="relu", padding="same"
    )(conv1)
    conv3 = layers.Conv2D(
        FILTERS, (3, 3), strides=(1, 1), activation="relu", padding="same"
    )(conv2)
    conv4 = layers.Conv2D(
        FILTERS, (3, 3), strides=(1, 1), activation="relu", padding="same"
    )(conv3)
    int_con1 = layers.Concatenate(axis=-1)([conv4, conv3])
    conv5 = layers.Conv2D(
        FILTERS, (3, 3), strides=(1, 1), activation="relu", padding="same"
    )(int_con1)
    int_con2 = layers.Concatenate(axis=-1)([conv5, conv2])
    conv6 = layers.Conv2D(
        FILTERS, (3, 3), strides=(1, 1), activation="relu", padding="same"
    )(int_con2)
    int_con3 = layers.Concatenate(axis=-1)([conv6, conv1])
    x_r = layers.Conv2D(24, (3, 3), strides=(1, 1), activation="tanh", padding="same")(
        int_con3
    )
    return keras.Model(inputs=input_img, outputs=x_r)


def color_constancy_loss(x):
    mean_rgb = tf.reduce_mean(x, axis=(1, 2), keepdims=True)
    mr, mg, mb = mean_rgb[:, :, :, 0], mean_rgb[:, :, :, 1], mean_rgb[:, :, :, 2]
    d_rg = tf.square(mr - mg)
    d_rb = tf.square(mr - mb)
    d_gb = tf.square(mb - mg)
    return tf.sqrt(tf.square(d_rg) + tf.square(d_rb) + tf.square(d_gb))


def exposure_loss(x, mean_val=0.6):
    x = tf.reduce_mean(x, axis=3, keepdims=True)
    mean = tf.nn.avg_pool2d(x, ksize=16, strides=16, padding="VALID")
    return tf.reduce_mean(tf.square(mean - mean_val))


def illumination_smoothness_loss(x):
    batch_size = tf.shape(x)[0]
    h_x = tf.shape(x)[1]
    w_x = tf.shape(x)[2]
    count_h = (tf.shape(x)[2] - 1) * tf.shape(x)[3]
    count_w = tf.shape(x)[2] * (tf.shape(x)[3] - 1)
    h_tv = tf.reduce_sum(tf.square((x[:, 1:, :, :] - x[:, : h_x - 1, :, :])))
    w_tv = tf.reduce_sum(tf.square((x[:, :, 1:, :] - x[:, :, : w_x - 1, :])))
    batch_size = tf.cast(batch_size, dtype=x.dtype)  # changed: the run's dtype
    count_h = tf.cast(count_h, dtype=x.dtype)  # changed
    count_w = tf.cast(count_w, dtype=x.dtype)  # changed
    return 2 * (h_tv / count_h + w_tv / count_w) / batch_size


class SpatialConsistencyLoss(keras.losses.Loss):
    def __init__(self, **kwargs):
        super().__init__(reduction="none")

        dtype = keras.config.floatx()  # changed: the kernels in the run's dtype
        self.left_kernel = tf.constant(
            [[[[0, 0, 0]], [[-1, 1, 0]], [[0, 0, 0]]]], dtype=dtype
        )
        self.right_kernel = tf.constant(
            [[[[0, 0, 0]], [[0, 1, -1]], [[0, 0, 0]]]], dtype=dtype
        )
        self.up_kernel = tf.constant(
            [[[[0, -1, 0]], [[0, 1, 0]], [[0, 0, 0]]]], dtype=dtype
        )
        self.down_kernel = tf.constant(
            [[[[0, 0, 0]], [[0, 1, 0]], [[0, -1, 0]]]], dtype=dtype
        )

    def call(self, y_true, y_pred):
        original_mean = tf.reduce_mean(y_true, 3, keepdims=True)
        enhanced_mean = tf.reduce_mean(y_pred, 3, keepdims=True)
        original_pool = tf.nn.avg_pool2d(
            original_mean, ksize=4, strides=4, padding="VALID"
        )
        enhanced_pool = tf.nn.avg_pool2d(
            enhanced_mean, ksize=4, strides=4, padding="VALID"
        )

        d_original_left = tf.nn.conv2d(
            original_pool, self.left_kernel, strides=[1, 1, 1, 1], padding="SAME"
        )
        d_original_right = tf.nn.conv2d(
            original_pool, self.right_kernel, strides=[1, 1, 1, 1], padding="SAME"
        )
        d_original_up = tf.nn.conv2d(
            original_pool, self.up_kernel, strides=[1, 1, 1, 1], padding="SAME"
        )
        d_original_down = tf.nn.conv2d(
            original_pool, self.down_kernel, strides=[1, 1, 1, 1], padding="SAME"
        )

        d_enhanced_left = tf.nn.conv2d(
            enhanced_pool, self.left_kernel, strides=[1, 1, 1, 1], padding="SAME"
        )
        d_enhanced_right = tf.nn.conv2d(
            enhanced_pool, self.right_kernel, strides=[1, 1, 1, 1], padding="SAME"
        )
        d_enhanced_up = tf.nn.conv2d(
            enhanced_pool, self.up_kernel, strides=[1, 1, 1, 1], padding="SAME"
        )
        d_enhanced_down = tf.nn.conv2d(
            enhanced_pool, self.down_kernel, strides=[1, 1, 1, 1], padding="SAME"
        )

        d_left = tf.square(d_original_left - d_enhanced_left)
        d_right = tf.square(d_original_right - d_enhanced_right)
        d_up = tf.square(d_original_up - d_enhanced_up)
        d_down = tf.square(d_original_down - d_enhanced_down)
        return d_left + d_right + d_up + d_down


def model_class(base):
    class ZeroDCE(base):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dce_model = build_dce_net()

        def compile(self, learning_rate, **kwargs):
            super().compile(**kwargs)
            self.optimizer = keras.optimizers.Adam(learning_rate=learning_rate)
            self.spatial_constancy_loss = SpatialConsistencyLoss(reduction="none")
            self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
            self.illumination_smoothness_loss_tracker = keras.metrics.Mean(
                name="illumination_smoothness_loss"
            )
            self.spatial_constancy_loss_tracker = keras.metrics.Mean(
                name="spatial_constancy_loss"
            )
            self.color_constancy_loss_tracker = keras.metrics.Mean(
                name="color_constancy_loss"
            )
            self.exposure_loss_tracker = keras.metrics.Mean(name="exposure_loss")

        @property
        def metrics(self):
            return [
                self.total_loss_tracker,
                self.illumination_smoothness_loss_tracker,
                self.spatial_constancy_loss_tracker,
                self.color_constancy_loss_tracker,
                self.exposure_loss_tracker,
            ]

        def get_enhanced_image(self, data, output):
            r1 = output[:, :, :, :3]
            r2 = output[:, :, :, 3:6]
            r3 = output[:, :, :, 6:9]
            r4 = output[:, :, :, 9:12]
            r5 = output[:, :, :, 12:15]
            r6 = output[:, :, :, 15:18]
            r7 = output[:, :, :, 18:21]
            r8 = output[:, :, :, 21:24]
            x = data + r1 * (tf.square(data) - data)
            x = x + r2 * (tf.square(x) - x)
            x = x + r3 * (tf.square(x) - x)
            enhanced_image = x + r4 * (tf.square(x) - x)
            x = enhanced_image + r5 * (tf.square(enhanced_image) - enhanced_image)
            x = x + r6 * (tf.square(x) - x)
            x = x + r7 * (tf.square(x) - x)
            enhanced_image = x + r8 * (tf.square(x) - x)
            return enhanced_image

        def call(self, data):
            dce_net_output = self.dce_model(data)
            return self.get_enhanced_image(data, dce_net_output)

        def compute_losses(self, data, output):
            enhanced_image = self.get_enhanced_image(data, output)
            loss_illumination = 200 * illumination_smoothness_loss(output)
            loss_spatial_constancy = tf.reduce_mean(
                self.spatial_constancy_loss(enhanced_image, data)
            )
            loss_color_constancy = 5 * tf.reduce_mean(
                color_constancy_loss(enhanced_image)
            )
            loss_exposure = 10 * tf.reduce_mean(exposure_loss(enhanced_image))
            total_loss = (
                loss_illumination
                + loss_spatial_constancy
                + loss_color_constancy
                + loss_exposure
            )
            return {
                "total_loss": total_loss,
                "illumination_smoothness_loss": loss_illumination,
                "spatial_constancy_loss": loss_spatial_constancy,
                "color_constancy_loss": loss_color_constancy,
                "exposure_loss": loss_exposure,
            }

        def train_step(self, data):
            with tf.GradientTape() as tape:
                output = self.dce_model(data)
                losses = self.compute_losses(data, output)

            gradients = tape.gradient(
                losses["total_loss"], self.dce_model.trainable_weights
            )
            self.optimizer.apply_gradients(
                zip(gradients, self.dce_model.trainable_weights)
            )

            self.total_loss_tracker.update_state(losses["total_loss"])
            self.illumination_smoothness_loss_tracker.update_state(
                losses["illumination_smoothness_loss"]
            )
            self.spatial_constancy_loss_tracker.update_state(
                losses["spatial_constancy_loss"]
            )
            self.color_constancy_loss_tracker.update_state(
                losses["color_constancy_loss"]
            )
            self.exposure_loss_tracker.update_state(losses["exposure_loss"])

            return {metric.name: metric.result() for metric in self.metrics}

        def test_step(self, data):
            output = self.dce_model(data)
            losses = self.compute_losses(data, output)

            self.total_loss_tracker.update_state(losses["total_loss"])
            self.illumination_smoothness_loss_tracker.update_state(
                losses["illumination_smoothness_loss"]
            )
            self.spatial_constancy_loss_tracker.update_state(
                losses["spatial_constancy_loss"]
            )
            self.color_constancy_loss_tracker.update_state(
                losses["color_constancy_loss"]
            )
            self.exposure_loss_tracker.update_state(losses["exposure_loss"])

            return {metric.name: metric.result() for metric in self.metrics}

    return ZeroDCE


def train(base, strategy, parity=True):
    del parity  # no random draws: the same steps in both modes
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(5)
    # Low-light images: pixel values in [0, 0.4).
    images = 0.4 * rng.random((keras_io.SIZE, IMAGE_SIZE, IMAGE_SIZE, 3))
    images = images.astype(keras.config.floatx())
    with strategy.scope():
        zero_dce_model = model_class(base)()
        zero_dce_model.compile(learning_rate=1e-3)
    train_dataset = tf.data.Dataset.from_tensor_slices(images).batch(keras_io.BATCH)
    val_dataset = tf.data.Dataset.from_tensor_slices(images[:9]).batch(keras_io.BATCH)
    history = zero_dce_model.fit(
        train_dataset, validation_data=val_dataset, epochs=keras_io.EPOCHS, verbose=0
    )
    return keras_io.result(zero_dce_model, history)
