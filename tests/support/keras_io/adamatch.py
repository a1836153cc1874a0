"""vision/adamatch.py's method: semi-supervised domain adaptation in a
`train_step` of one's own, on a zip of a labeled source dataset and an
unlabeled target dataset, with weak and strong augmentations drawn inside
the step, random logit interpolation, distribution alignment, a relative
confidence threshold and a loss weight that ramps up over the steps.

Written for these tests after the example's method, on tiny sizes (8x8
images, a one-convolution network, 3 classes). As written, its
alignment, threshold and losses are means over the replica's batch, so
under R replicas each replica aligns and thresholds its own examples.
Parity mode takes the augmentations' and the interpolation's draws from
the data, and makes the change the docs' global-batch guide names: the
logits and labels go through `keras_ctl.all_gather` before the batch's
statistics, and each replica adds `1 / R` of the global batch's loss.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_ctl
import keras_io

SOURCE = "examples/vision/adamatch.py"

CLASSES, TAU = 3, 0.9


def model_class(base, parity):
    class AdaMatch(base):
        def __init__(self, model, total_steps, tau=TAU):
            super().__init__()
            self.model = model
            self.tau = tau
            self.total_steps = float(total_steps)
            self.current_step = keras.Variable(0, dtype="int64", trainable=False)
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.weak = keras.Sequential([layers.RandomFlip("horizontal")])
            self.strong = keras.Sequential(
                [layers.RandomFlip("horizontal"), layers.RandomTranslation(0.2, 0.2)]
            )

        @property
        def metrics(self):
            return [self.loss_tracker]

        def call(self, x):
            return self.model(x)

        def loss_weight(self):
            # Ramps from 0 to 1 over the training's first half.
            step = tf.cast(self.current_step, tf.float32)
            ramp = tf.minimum(step / (self.total_steps / 2), 1.0)
            return tf.cast(ramp, keras.config.floatx())

        @keras_ctl.written_in_shares
        def train_step(self, data):
            if parity:  # changed: the augmentations drawn with the data
                (source_weak, source_strong, source_y, mix), target_views = data
                source = tf.concat([source_weak, source_strong], 0)
                target = tf.concat(target_views, 0)
                mix = tf.concat([mix[:, 0], mix[:, 1]], 0)
            else:
                (source_x, source_y), (target_x,) = data
                source = tf.concat([self.weak(source_x), self.strong(source_x)], 0)
                target = tf.concat([self.weak(target_x), self.strong(target_x)], 0)
            n_source = tf.shape(source)[0]
            with tf.GradientTape() as tape:
                combined_logits = self.model(tf.concat([source, target], 0))
                source_only = self.model(source)
                # Random logit interpolation of the source logits.
                if not parity:
                    mix = tf.random.uniform(
                        tf.shape(source_only), dtype=source_only.dtype
                    )
                source_logits = mix * combined_logits[:n_source] + (1 - mix) * (
                    source_only
                )
                target_logits = combined_logits[n_source:]
                # The weak and strong views' logits, of the global batch in
                # parity mode (changed).
                parts = (
                    source_logits[: n_source // 2],
                    source_logits[n_source // 2 :],
                    target_logits[: tf.shape(target)[0] // 2],
                    target_logits[tf.shape(target)[0] // 2 :],
                    source_y,
                )
                if parity:
                    parts = [keras_ctl.all_gather(part) for part in parts]
                (
                    weak_logits,
                    strong_logits,
                    weak_target_logits,
                    strong_target_logits,
                    y,
                ) = parts
                source_logits = tf.concat([weak_logits, strong_logits], 0)
                weak_source = tf.nn.softmax(weak_logits)
                weak_target = tf.nn.softmax(weak_target_logits)
                # Distribution alignment, then the relative threshold.
                aligned = weak_target * tf.reduce_mean(weak_source, 0)
                aligned = aligned / tf.reduce_mean(weak_target, 0)
                aligned = aligned / tf.reduce_sum(aligned, 1, keepdims=True)
                threshold = self.tau * tf.reduce_mean(tf.reduce_max(weak_source, 1))
                mask = tf.cast(tf.reduce_max(aligned, 1) >= threshold, aligned.dtype)
                pseudo = tf.stop_gradient(tf.argmax(aligned, 1))
                source_loss = tf.reduce_mean(
                    keras.losses.sparse_categorical_crossentropy(
                        tf.concat([y, y], 0), source_logits, from_logits=True
                    )
                )
                target_loss = tf.reduce_mean(
                    keras.losses.sparse_categorical_crossentropy(
                        pseudo, strong_target_logits, from_logits=True
                    )
                    * mask
                )
                loss = source_loss + self.loss_weight() * target_loss
                # changed in parity mode: the replica's 1/R of the loss
                share = loss / (keras_ctl.num_replicas() if parity else 1)
            gradients = tape.gradient(share, self.model.trainable_variables)
            self.optimizer.apply_gradients(
                zip(gradients, self.model.trainable_variables)
            )
            self.current_step.assign_add(1)
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

    return AdaMatch


def views(images, rng, strong):
    """A random horizontal flip (and, `strong`, a shift of up to 2 pixels)
    an image: the augmenters' draws, taken in numpy."""
    flip = rng.random((len(images), 1, 1, 1)) < 0.5
    images = np.where(flip, images[:, :, ::-1], images)
    if not strong:
        return images
    shifts = rng.integers(-2, 3, (len(images), 2))
    return np.stack(
        [np.roll(image, tuple(s), axis=(0, 1)) for image, s in zip(images, shifts)]
    )


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    steps = keras_io.EPOCHS * -(-keras_io.SIZE // keras_io.BATCH)
    with strategy.scope():
        network = keras.Sequential(
            [
                keras.Input((8, 8, 3)),
                layers.Conv2D(4, 3, strides=2, activation="relu"),
                layers.GlobalAveragePooling2D(),
                layers.Dense(CLASSES),
            ]
        )
        model = model_class(base, parity)(network, total_steps=steps)
        model.compile(optimizer=keras.optimizers.Adam(0.01))
    rng = np.random.default_rng(8)
    floatx = keras.config.floatx()
    source_x = rng.random((keras_io.SIZE, 8, 8, 3)).astype(floatx)
    source_y = rng.integers(0, CLASSES, keras_io.SIZE)
    target_x = rng.random((keras_io.SIZE, 8, 8, 3)).astype(floatx)
    if parity:
        draws = np.random.default_rng(9)
        source = (
            views(source_x, draws, strong=False),
            views(source_x, draws, strong=True),
            source_y,
            draws.random((keras_io.SIZE, 2, CLASSES)).astype(floatx),
        )
        target = (
            views(target_x, draws, strong=False),
            views(target_x, draws, strong=True),
        )
    else:
        source, target = (source_x, source_y), (target_x,)
    dataset = tf.data.Dataset.zip(
        tf.data.Dataset.from_tensor_slices(source),
        tf.data.Dataset.from_tensor_slices(target),
    ).batch(keras_io.BATCH)
    history = model.fit(dataset, epochs=keras_io.EPOCHS, verbose=0)
    result = keras_io.result(model, history)
    result["current_step"] = int(model.current_step.numpy())
    return result
