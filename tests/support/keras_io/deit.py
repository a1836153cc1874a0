"""vision/deit.py: `DeiT(student, teacher)`, a distiller whose own
`compile()` takes two Keras `Loss` objects, whose `compute_loss` ignores
the `y_pred` Keras gives it and runs the student again with
`training=True` (its two heads: the class token's against the labels, the
distillation token's against the frozen teacher's softmax), updates two
loss trackers and an accuracy metric of its own, and whose `test_step`
returns the student's loss (a value of its own under `loss`) with the
trackers. The student `ViTDistilled` has `StochasticDepth` layers, which
draw `keras.random.uniform` each training call.

The example's Keras 3 version (2026/03/11: `compute_loss` and `test_step`
in place of Keras 2's `train_step`/`test_step`, a teacher of Keras layers
in place of the TF-Hub one). Changed: sizes (8x8 images, 4x4 patches, 8-wide
projections, 2 heads, 2 transformer blocks, 16 MLP units); the teacher is a
tiny untrained CNN (a convolution, pooling and a dense head; published: a
frozen ImageNet EfficientNetV2B0 whose head is first trained on the
flowers), frozen as published; the data are synthetic 0-255 images (the
published dataset's random crops and flips are drawn in its input pipeline,
not in the step). In parity mode `StochasticDepth` takes its uniform draws
from the data (`StochasticDepth.draws`, held by `train()`'s step for each
batch: with 2 blocks the drop-path rates are 0.0 and 0.1, so the second
block's two layers draw). `StochasticDepth` keeps its rate as a Python
float: the published rate is a float32 tensor of `ops.linspace`, which
TensorFlow does not combine with float64 activations; the images are
cast to the run's dtype, not float32, before `/ 255.0` (in float64 runs
the float32 division rounds differently on one device and under
replicas, 1.3e-8).
"""

from typing import List

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_io

SOURCE = "examples/vision/deit.py"

# Model
MODEL_TYPE = "deit_distilled_tiny_patch16_224"
RESOLUTION = 8  # changed: 224
PATCH_SIZE = 4  # changed: 16
NUM_PATCHES = (RESOLUTION // PATCH_SIZE) ** 2
LAYER_NORM_EPS = 1e-6
PROJECTION_DIM = 8  # changed: 192
NUM_HEADS = 2  # changed: 3
NUM_LAYERS = 2  # changed: 12
MLP_UNITS = [PROJECTION_DIM * 2, PROJECTION_DIM]  # changed: * 4
DROPOUT_RATE = 0.0
DROP_PATH_RATE = 0.1

# Training
BASE_LR = 0.0005
WEIGHT_DECAY = 0.0001

# Data
BATCH_SIZE = keras_io.BATCH  # changed: 256
NUM_CLASSES = 5


# Referred from: github.com:rwightman/pytorch-image-models.
class StochasticDepth(layers.Layer):
    draws = None  # changed: the data's draws, in parity mode

    def __init__(self, drop_prop, **kwargs):
        super().__init__(**kwargs)
        self.drop_prob = float(drop_prop)  # changed: a float, not a float32 tensor
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, x, training=True):
        if training:
            keep_prob = 1 - self.drop_prob
            shape = (keras.ops.shape(x)[0],) + (1,) * (len(keras.ops.shape(x)) - 1)
            if self.draws is not None:  # changed: the uniform draws from the data
                uniform = self.draws.next()
            else:
                uniform = keras.random.uniform(shape, 0, 1, seed=self.seed_generator)
            random_tensor = keep_prob + uniform  # changed: drawn above
            random_tensor = keras.ops.floor(random_tensor)
            return (x / keep_prob) * random_tensor
        return x


def mlp(x, dropout_rate: float, hidden_units: List):
    """FFN for a Transformer block."""
    for idx, units in enumerate(hidden_units):
        x = layers.Dense(units, activation="gelu" if idx == 0 else None)(x)
        x = layers.Dropout(dropout_rate)(x)
    return x


def transformer(drop_prob: float, name: str) -> keras.Model:
    """Transformer block with pre-norm."""
    num_patches = NUM_PATCHES + 2 if "distilled" in MODEL_TYPE else NUM_PATCHES + 1
    encoded_patches = layers.Input((num_patches, PROJECTION_DIM))
    x1 = layers.LayerNormalization(epsilon=LAYER_NORM_EPS)(encoded_patches)
    attention_output = layers.MultiHeadAttention(
        num_heads=NUM_HEADS, key_dim=PROJECTION_DIM, dropout=DROPOUT_RATE
    )(x1, x1)
    attention_output = (
        StochasticDepth(drop_prob)(attention_output) if drop_prob else attention_output
    )
    x2 = layers.Add()([attention_output, encoded_patches])
    x3 = layers.LayerNormalization(epsilon=LAYER_NORM_EPS)(x2)
    x4 = mlp(x3, hidden_units=MLP_UNITS, dropout_rate=DROPOUT_RATE)
    x4 = StochasticDepth(drop_prob)(x4) if drop_prob else x4
    outputs = layers.Add()([x2, x4])
    return keras.Model(encoded_patches, outputs, name=name)


class ViTClassifier(keras.Model):
    """Vision Transformer base class."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.projection = keras.Sequential(
            [
                layers.Conv2D(
                    filters=PROJECTION_DIM,
                    kernel_size=(PATCH_SIZE, PATCH_SIZE),
                    strides=(PATCH_SIZE, PATCH_SIZE),
                    padding="VALID",
                    name="conv_projection",
                ),
                layers.Reshape(
                    target_shape=(NUM_PATCHES, PROJECTION_DIM),
                    name="flatten_projection",
                ),
            ],
            name="projection",
        )
        dpr = [x for x in keras.ops.linspace(0.0, DROP_PATH_RATE, NUM_LAYERS)]
        self.transformer_blocks = [
            transformer(drop_prob=dpr[i], name=f"transformer_block_{i}")
            for i in range(NUM_LAYERS)
        ]
        self.dropout = layers.Dropout(DROPOUT_RATE)
        self.layer_norm = layers.LayerNormalization(epsilon=LAYER_NORM_EPS)
        self.head = layers.Dense(NUM_CLASSES, name="classification_head")

    def build(self, input_shape):
        self.positional_embedding = self.add_weight(
            shape=(1, NUM_PATCHES + 1, PROJECTION_DIM),
            initializer=keras.initializers.Zeros(),
            trainable=True,
            name="pos_embedding",
        )
        self.cls_token = self.add_weight(
            shape=(1, 1, PROJECTION_DIM),
            initializer=keras.initializers.Zeros(),
            trainable=True,
            name="cls",
        )
        super().build(input_shape)

    def call(self, inputs, training=True):
        n = keras.ops.shape(inputs)[0]
        projected_patches = self.projection(inputs)
        cls_token = keras.ops.tile(self.cls_token, (n, 1, 1))
        cls_token = keras.ops.cast(cls_token, projected_patches.dtype)
        projected_patches = keras.ops.concatenate(
            [cls_token, projected_patches], axis=1
        )
        encoded_patches = self.positional_embedding + projected_patches
        encoded_patches = self.dropout(encoded_patches)
        for transformer_module in self.transformer_blocks:
            encoded_patches = transformer_module(encoded_patches)
        representation = self.layer_norm(encoded_patches)
        encoded_patches = representation[:, 0]
        output = self.head(encoded_patches)
        return output


class ViTDistilled(ViTClassifier):
    def __init__(self, regular_training=False, **kwargs):
        super().__init__(**kwargs)
        self.num_tokens = 2
        self.regular_training = regular_training
        self.head = layers.Dense(NUM_CLASSES, name="classification_head")
        self.head_dist = layers.Dense(NUM_CLASSES, name="distillation_head")

    def build(self, input_shape):
        self.cls_token = self.add_weight(
            shape=(1, 1, PROJECTION_DIM),
            initializer=keras.initializers.Zeros(),
            trainable=True,
            name="cls",
        )
        self.dist_token = self.add_weight(
            shape=(1, 1, PROJECTION_DIM),
            initializer=keras.initializers.Zeros(),
            trainable=True,
            name="dist_token",
        )
        self.positional_embedding = self.add_weight(
            shape=(1, NUM_PATCHES + self.num_tokens, PROJECTION_DIM),
            initializer=keras.initializers.Zeros(),
            trainable=True,
            name="pos_embedding",
        )

    def call(self, inputs, training=True):
        n = keras.ops.shape(inputs)[0]
        projected_patches = self.projection(inputs)
        cls_token = keras.ops.tile(self.cls_token, (n, 1, 1))
        dist_token = keras.ops.tile(self.dist_token, (n, 1, 1))
        cls_token = keras.ops.cast(cls_token, projected_patches.dtype)
        dist_token = keras.ops.cast(dist_token, projected_patches.dtype)
        projected_patches = keras.ops.concatenate(
            [cls_token, dist_token, projected_patches], axis=1
        )
        encoded_patches = self.positional_embedding + projected_patches
        encoded_patches = self.dropout(encoded_patches)
        for transformer_module in self.transformer_blocks:
            encoded_patches = transformer_module(encoded_patches)
        representation = self.layer_norm(encoded_patches)
        x, x_dist = (
            self.head(representation[:, 0]),
            self.head_dist(representation[:, 1]),
        )
        if training and not self.regular_training:
            return x, x_dist
        return (x + x_dist) / 2


def model_class(base):
    class DeiT(base):
        # Reference: https://keras.io/examples/vision/knowledge_distillation/
        def __init__(self, student, teacher, **kwargs):
            super().__init__(**kwargs)
            self.student = student
            self.teacher = teacher
            self.student_loss_tracker = keras.metrics.Mean(name="student_loss")
            self.dist_loss_tracker = keras.metrics.Mean(name="distillation_loss")
            self.accuracy_metric = keras.metrics.CategoricalAccuracy(name="accuracy")

        @property
        def metrics(self):
            metrics = super().metrics
            metrics.append(self.student_loss_tracker)
            metrics.append(self.dist_loss_tracker)
            metrics.append(self.accuracy_metric)
            return metrics

        def compile(self, optimizer, student_loss_fn, distillation_loss_fn):
            super().compile(optimizer=optimizer)
            self.student_loss_fn = student_loss_fn
            self.distillation_loss_fn = distillation_loss_fn

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
            x_normalized = keras.ops.cast(x, keras.config.floatx()) / 255.0  # changed
            cls_predictions, dist_predictions = self.student(
                x_normalized, training=True
            )
            teacher_logits = self.teacher(
                keras.ops.cast(x, keras.config.floatx()),
                training=False,  # changed
            )
            teacher_predictions = keras.ops.softmax(teacher_logits, axis=-1)
            student_loss = self.student_loss_fn(y, cls_predictions)
            distillation_loss = self.distillation_loss_fn(
                teacher_predictions, dist_predictions
            )
            self.student_loss_tracker.update_state(student_loss)
            self.dist_loss_tracker.update_state(distillation_loss)
            student_predictions = (cls_predictions + dist_predictions) / 2
            self.accuracy_metric.update_state(y, student_predictions)
            return (student_loss + distillation_loss) / 2

        def test_step(self, data):
            x, y = data
            x_normalized = keras.ops.cast(x, keras.config.floatx()) / 255.0  # changed
            y_prediction = self.student(x_normalized, training=False)
            student_loss = self.student_loss_fn(y, y_prediction)
            self.accuracy_metric.update_state(y, y_prediction)
            self.student_loss_tracker.update_state(student_loss)
            return {
                "loss": student_loss,
                "student_loss": self.student_loss_tracker.result(),
                "accuracy": self.accuracy_metric.result(),
            }

        def call(self, inputs, training=False):
            inputs_normalized = keras.ops.cast(inputs, keras.config.floatx())  # changed
            inputs_normalized = inputs_normalized / 255.0
            return self.student(inputs_normalized, training=False)

    return DeiT


def build_teacher():
    # changed: a tiny untrained CNN for the ImageNet EfficientNetV2B0 backbone
    teacher_model = keras.Sequential(
        [
            layers.Input((RESOLUTION, RESOLUTION, 3)),
            layers.Rescaling(1 / 255.0),
            layers.Conv2D(4, 3, strides=2, activation="relu"),
            layers.GlobalAveragePooling2D(),
            layers.Dense(NUM_CLASSES),
        ],
        name="teacher",
    )
    teacher_model.trainable = False
    return teacher_model


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    floatx = keras.config.floatx()
    rng = np.random.default_rng(12)
    images = (rng.random((keras_io.SIZE, RESOLUTION, RESOLUTION, 3)) * 255).astype(
        floatx
    )
    labels = keras.utils.to_categorical(
        rng.integers(0, NUM_CLASSES, keras_io.SIZE), NUM_CLASSES
    ).astype(floatx)
    draws = keras_io.DrawsFromData()

    class Trained(model_class(base)):
        def train_step(self, data):
            if not parity:
                return super().train_step(data)
            x, y, uniform = data
            # The two drawing layers' (B, 1, 1) draws, in call order.
            draws.hold([uniform[:, i, None, None] for i in range(2)])
            return super().train_step((x, y))

    with strategy.scope():
        deit_tiny = ViTDistilled()
        deit_distiller = Trained(student=deit_tiny, teacher=build_teacher())
        lr_scaled = (BASE_LR / 512) * BATCH_SIZE
        deit_distiller.compile(
            optimizer=keras.optimizers.AdamW(
                weight_decay=WEIGHT_DECAY, learning_rate=lr_scaled
            ),
            student_loss_fn=keras.losses.CategoricalCrossentropy(
                from_logits=True, label_smoothing=0.1
            ),
            distillation_loss_fn=keras.losses.CategoricalCrossentropy(from_logits=True),
        )
        if parity:
            deit_tiny(images[:1], training=False)  # built before the draws are set
            for block in deit_tiny.transformer_blocks:
                for layer in block.layers:
                    if isinstance(layer, StochasticDepth):
                        layer.draws = draws
    if parity:
        uniform = rng.random((keras_io.SIZE, 2)).astype(floatx)
        data = (images, labels, uniform)
    else:
        data = (images, labels)
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(keras_io.BATCH)
    validation = tf.data.Dataset.from_tensor_slices((images[:9], labels[:9])).batch(
        keras_io.BATCH
    )
    history = deit_distiller.fit(
        dataset, validation_data=validation, epochs=keras_io.EPOCHS, verbose=0
    )
    return keras_io.result(deit_distiller, history)
