"""vision/knowledge_distillation.py: `Distiller(student, teacher)`, with its
own `compile()` and a `compute_loss` that calls two Keras `Loss` objects.

Changed: sizes (6 features, 3 classes, dense teacher and student).
"""

import keras
import numpy as np
from cases import _dense as dense
from keras import ops

import keras_io

SOURCE = "examples/vision/knowledge_distillation.py"


def model_class(base):
    class Distiller(base):
        def __init__(self, student, teacher):
            super().__init__()
            self.teacher = teacher
            self.student = student

        def compile(
            self,
            optimizer,
            metrics,
            student_loss_fn,
            distillation_loss_fn,
            alpha=0.1,
            temperature=3,
        ):
            super().compile(optimizer=optimizer, metrics=metrics)
            self.student_loss_fn = student_loss_fn
            self.distillation_loss_fn = distillation_loss_fn
            self.alpha = alpha
            self.temperature = temperature

        def compute_loss(
            self, x=None, y=None, y_pred=None, sample_weight=None, allow_empty=False
        ):
            teacher_pred = self.teacher(x, training=False)
            student_loss = self.student_loss_fn(y, y_pred)

            distillation_loss = self.distillation_loss_fn(
                ops.softmax(teacher_pred / self.temperature, axis=1),
                ops.softmax(y_pred / self.temperature, axis=1),
            ) * (self.temperature**2)

            loss = self.alpha * student_loss + (1 - self.alpha) * distillation_loss
            return loss

        def call(self, x):
            return self.student(x)

    return Distiller


def train(base, strategy, parity=True):
    rng = np.random.default_rng(0)
    x = rng.random((keras_io.SIZE, 6))
    y = rng.integers(0, 3, keras_io.SIZE)
    with strategy.scope():
        teacher = keras.Sequential([keras.Input((6,)), dense(3, 1)])
        student = keras.Sequential(
            [keras.Input((6,)), dense(4, 2, activation="tanh"), dense(3, 3)]
        )
        distiller = model_class(base)(student=student, teacher=teacher)
        distiller.compile(
            optimizer=keras.optimizers.Adam(0.01),
            metrics=[keras.metrics.SparseCategoricalAccuracy()],
            student_loss_fn=keras.losses.SparseCategoricalCrossentropy(
                from_logits=True
            ),
            distillation_loss_fn=keras.losses.KLDivergence(),
            alpha=0.1,
            temperature=10,
        )
    history = distiller.fit(
        x,
        y,
        batch_size=keras_io.BATCH,
        epochs=keras_io.EPOCHS,
        shuffle=False,
        verbose=0,
    )
    evaluation = distiller.evaluate(x, y, batch_size=keras_io.BATCH, verbose=0)
    result = keras_io.result(distiller.student, history)
    result["history"]["evaluate"] = np.asarray(evaluation, "float64")
    return result
