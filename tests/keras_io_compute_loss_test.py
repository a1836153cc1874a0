"""keras.io examples that override `compute_loss` (and `compute_metrics`),
their model code copied as written with `keras_ctl.CTLModel` as the base:
equal to `keras.Model` on one device, in float64, on 2 replicas with a
replica that gets no example in the last batch.

- vision/knowledge_distillation.py: `Distiller`, with its own `compile()`
  and a `compute_loss` that calls two Keras `Loss` objects;
- nlp/masked_language_modeling.py: `MaskedLanguageModel`, whose
  `compute_loss` sums a `reduction=None` loss and updates its own tracker,
  and whose `compute_metrics` returns that tracker.

Sizes are tiny; nothing else changes.
"""

import configurations
import keras
import numpy as np
import pytest
import strategies
from keras import layers
from keras import ops

import keras_ctl

SIZE, BATCH = 17, 8  # 2 replicas: the last batch leaves one empty


def distiller_class(base):
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


def mlm_class(base):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)
    loss_tracker = keras.metrics.Mean(name="loss")

    class MaskedLanguageModel(base):
        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
            loss = loss_fn(y, y_pred, sample_weight)
            loss_tracker.update_state(loss, sample_weight=sample_weight)
            return keras.ops.sum(loss)

        def compute_metrics(self, x, y, y_pred, sample_weight):
            # Return a dict mapping metric names to current value
            return {"loss": loss_tracker.result()}

        @property
        def metrics(self):
            # We list our `Metric` objects here so that `reset_states()` can be
            # called automatically at the start of each epoch
            # or at the start of `evaluate()`.
            # If you don't implement this property, you have to call
            # `reset_states()` yourself at the time of your choosing.
            return [loss_tracker]

    return MaskedLanguageModel


def dense(units, seed, **kwargs):
    init = keras.initializers.GlorotUniform(seed=seed)
    return layers.Dense(units, kernel_initializer=init, **kwargs)


def train_distiller(base, strategy):
    rng = np.random.default_rng(0)
    x = rng.random((SIZE, 6))
    y = rng.integers(0, 3, SIZE)
    with strategy.scope():
        teacher = keras.Sequential([keras.Input((6,)), dense(3, 1)])
        student = keras.Sequential(
            [keras.Input((6,)), dense(4, 2, activation="tanh"), dense(3, 3)]
        )
        distiller = distiller_class(base)(student=student, teacher=teacher)
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
    history = distiller.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    evaluation = distiller.evaluate(x, y, batch_size=BATCH, verbose=0)
    return distiller.student.get_weights(), history.history, evaluation


def train_mlm(base, strategy):
    rng = np.random.default_rng(1)
    tokens = rng.integers(1, 9, (SIZE, 5))
    masked = rng.random((SIZE, 5)) < 0.4
    x = np.where(masked, 0, tokens)
    sample_weight = masked.astype(keras.config.floatx())
    with strategy.scope():
        inputs = keras.Input((5,), dtype="int64")
        embedded = layers.Embedding(
            9, 4, embeddings_initializer=keras.initializers.RandomNormal(seed=4)
        )(inputs)
        outputs = dense(9, 5, activation="softmax")(embedded)
        model = mlm_class(base)(inputs, outputs)
        model.compile(optimizer=keras.optimizers.Adam(0.01))
    history = model.fit(
        x,
        tokens,
        sample_weight=sample_weight,
        batch_size=BATCH,
        epochs=2,
        shuffle=False,
        verbose=0,
    )
    return model.get_weights(), history.history, None


@pytest.mark.parametrize(
    "train", [train_distiller, train_mlm], ids=["distiller", "mlm"]
)
def test_a_keras_io_compute_loss_override_equals_one_device(train):
    with configurations.computing_in("float64"):
        expected = train(keras.Model, strategies.get("default"))
        got = train(keras_ctl.CTLModel, strategies.get("mirrored"))
    for g, e in zip(got[0], expected[0], strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-12)
    assert set(got[1]) == set(expected[1])
    for name, values in expected[1].items():
        np.testing.assert_allclose(got[1][name], values, rtol=1e-9, atol=1e-12)
    if expected[2] is not None:
        np.testing.assert_allclose(got[2], expected[2], rtol=1e-9, atol=1e-12)
