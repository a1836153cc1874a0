"""vision/consistency_training.py's method: a `SelfTrainer(student,
teacher)` with its own `compile()` (two Keras `Loss` objects, a
temperature, Keras's compiled metrics), a `train_step` on a zip of two
datasets (clean images for the frozen teacher, noisy ones with labels for
the student), the mean of the two losses logged as `total_loss`, and a
`test_step` of its own run on `validation_data`.

Written for these tests after the example's method in Keras 3's idiom (its
stored text updates `self.compiled_metrics`, which Keras 3 no longer has),
on tiny sizes (6 features, 3 classes, dense teacher and student). Its
losses are Keras `Loss` objects, so it equals one device as written.
"""

import keras
import numpy as np
import tensorflow as tf
from cases import _dense as dense

import keras_io

SOURCE = "examples/vision/consistency_training.py"


def model_class(base):
    class SelfTrainer(base):
        def __init__(self, student, teacher):
            super().__init__()
            self.student = student
            self.teacher = teacher

        def compile(
            self, optimizer, metrics, student_loss_fn, distillation_loss_fn, temperature
        ):
            super().compile(optimizer=optimizer, metrics=metrics)
            self.student_loss_fn = student_loss_fn
            self.distillation_loss_fn = distillation_loss_fn
            self.temperature = temperature

        def call(self, x):
            return self.student(x)

        def update_metrics(self, y, logits):
            for metric in self.metrics:
                if metric.name != "loss":
                    metric.update_state(y, tf.nn.softmax(logits, axis=1))
            return {m.name: m.result() for m in self.metrics}

        def train_step(self, data):
            (clean_images, _), (noisy_images, y) = data
            teacher_predictions = self.teacher(clean_images, training=False)
            with tf.GradientTape() as tape:
                student_predictions = self.student(noisy_images, training=True)
                student_loss = self.student_loss_fn(y, student_predictions)
                distillation_loss = self.distillation_loss_fn(
                    tf.nn.softmax(teacher_predictions / self.temperature, axis=1),
                    tf.nn.softmax(student_predictions / self.temperature, axis=1),
                )
                total_loss = (student_loss + distillation_loss) / 2
            weights = self.student.trainable_variables
            gradients = tape.gradient(total_loss, weights)
            self.optimizer.apply_gradients(zip(gradients, weights))
            results = self.update_metrics(y, student_predictions)
            results.update({"total_loss": total_loss})
            return results

        def test_step(self, data):
            x, y = data
            return self.update_metrics(y, self.student(x, training=False))

    return SelfTrainer


def train(base, strategy, parity=True):
    rng = np.random.default_rng(7)
    floatx = keras.config.floatx()
    clean = rng.random((keras_io.SIZE, 6)).astype(floatx)
    noisy = (clean + 0.1 * rng.normal(size=clean.shape)).astype(floatx)
    y = rng.integers(0, 3, keras_io.SIZE)
    with strategy.scope():
        teacher = keras.Sequential([keras.Input((6,)), dense(3, 1)])
        student = keras.Sequential(
            [keras.Input((6,)), dense(4, 2, activation="relu"), dense(3, 3)]
        )
        trainer = model_class(base)(student=student, teacher=teacher)
        trainer.compile(
            optimizer=keras.optimizers.Adam(0.01),
            metrics=["accuracy"],
            student_loss_fn=keras.losses.SparseCategoricalCrossentropy(
                from_logits=True
            ),
            distillation_loss_fn=keras.losses.KLDivergence(),
            temperature=10,
        )
    both = tf.data.Dataset.zip(
        tf.data.Dataset.from_tensor_slices((clean, y)),
        tf.data.Dataset.from_tensor_slices((noisy, y)),
    ).batch(keras_io.BATCH)
    validation = tf.data.Dataset.from_tensor_slices((clean, y)).batch(keras_io.BATCH)
    history = trainer.fit(
        both, validation_data=validation, epochs=keras_io.EPOCHS, verbose=0
    )
    return keras_io.result(trainer, history)
