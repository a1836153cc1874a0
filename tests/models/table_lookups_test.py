"""A table looked up once a batch (a position embedding, `emb(arange(T))`)
gets one device's sparse gradient under 2 replicas: one slice a position,
summed across replicas, so Keras's sparse Adam (which squares each slice
apart) equals one device; tables looked up for the examples keep their
slice a lookup, and a table looked up both ways gets both. Decided from
the traced graph, or from the ops as an eager step runs them: static and
dynamic sequence lengths, the default step, a step of one's own (traced,
and eager on its first step) and `run_eagerly=True`, an empty replica
(19 rows in batches of 8: the last splits 3/0), float64. A table looked
up for rows gathered from every replica (in-batch candidates) is looked
up alike on every replica: summed too."""

import configurations
import devices
import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers
from keras import ops
from tensorflow.python.eager import context

import keras_ctl
from keras_ctl._lookups import looked_up_once_a_batch

ROWS, BATCH, LENGTH, VOCABULARY = 19, 8, 5, 11


class TokensAndPositions(layers.Layer):
    """A token table looked up for the examples and once a batch (a
    class token), a position table once a batch."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.tokens = layers.Embedding(VOCABULARY, 4)
        self.positions = layers.Embedding(LENGTH, 4)

    def call(self, x):
        positions = self.positions(ops.arange(ops.shape(x)[-1]))
        return self.tokens(x) + positions + self.tokens(ops.zeros([1], "int32"))


class OwnStep:
    """A step of one's own; with `compiled_loss`, its first step builds the
    compiled loss and metrics, so it runs eagerly under replicas."""

    compiled_loss = False

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            if self.compiled_loss:
                loss = self.compute_loss(y=y, y_pred=y_pred)
            else:
                loss = ops.mean(
                    keras.losses.sparse_categorical_crossentropy(
                        y, y_pred, from_logits=True
                    )
                )
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        return {"batch_loss": loss}


class OwnStepBuildingItsLoss(OwnStep):
    compiled_loss = True


STEPS = {
    "default_step": None,
    "own_step": OwnStep,
    "own_step_eager_first": OwnStepBuildingItsLoss,
    "run_eagerly": None,
}


def data(dynamic_length):
    rng = np.random.default_rng(3)
    x = rng.integers(0, VOCABULARY, (ROWS, LENGTH)).astype("int32")
    y = rng.integers(0, 3, ROWS)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    if dynamic_length:  # the length is known when the step runs, not before
        dataset = dataset.map(lambda a, b: (tf.reshape(a, [tf.shape(a)[0], -1]), b))
    return dataset


def trained(base, step, dynamic_length, strategy):
    keras.utils.set_random_seed(1)
    with strategy.scope():
        inputs = keras.Input((None,), dtype="int32")
        hidden = layers.GlobalAveragePooling1D()(TokensAndPositions()(inputs))
        own = STEPS[step]
        model_class = type("Model", (own, base), {}) if own else base
        model = model_class(inputs, layers.Dense(3)(hidden))
        model.compile(
            keras.optimizers.Adam(0.05),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            run_eagerly=step == "run_eagerly",
        )
    model.fit(data(dynamic_length), epochs=2, verbose=0)
    return model.get_weights()


@pytest.mark.slow  # for the fast tier's time; the suite runs it
@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("dynamic_length", [False, True], ids=["static", "dynamic"])
def test_a_position_table_under_adam_equals_one_device(step, dynamic_length):
    with configurations.computing_in("float64"):
        expected = trained(keras.Model, step, dynamic_length, devices.get("default"))
        got = trained(keras_ctl.CTLModel, step, dynamic_length, devices.get("mirrored"))
    assert max(np.max(np.abs(a - b)) for a, b in zip(expected, got)) < 1e-12


@pytest.mark.parametrize(
    ("indices", "once"),
    [
        (lambda x: tf.range(5), True),
        (lambda x: tf.range(tf.shape(x)[1]), True),
        (lambda x: tf.range(tf.shape(x)[-1]) * 2 + 1, True),
        (lambda x: tf.range(tf.shape(x)[0]), False),  # a row each example
        (lambda x: tf.range(tf.size(x)), False),
        (lambda x: tf.reshape(x, [-1]), False),
        (lambda x: tf.random.uniform([5], 0, 5, tf.int32), False),
        (
            lambda x: tf.random.experimental.stateless_shuffle(tf.range(5), [1, 2]),
            False,
        ),
    ],
    ids=[
        "constant",
        "length",
        "length_arithmetic",
        "examples",
        "size",
        "tokens",
        "random",
        "stateless_shuffle",
    ],
)
def test_indices_are_once_a_batch_only_without_the_examples(indices, once):
    found = []
    rows = tf.data.Dataset.from_tensor_slices(tf.zeros([8, 5], tf.int32))
    dataset = rows.batch(4).repeat().map(lambda a: tf.reshape(a, [tf.shape(a)[0], -1]))

    @tf.function
    def step(iterator):
        found.append(looked_up_once_a_batch(indices(next(iterator))))

    step(iter(dataset))
    assert found == [once]
    assert not looked_up_once_a_batch(tf.range(5))  # eager: nothing to read


def retrieval(base):
    """In-batch candidates: a table looked up for the ids gathered from
    every replica, in a `compute_loss` of one's own (one device's code)."""

    class Retrieval(base):
        def __init__(self):
            inputs = keras.Input((3,))
            super().__init__(inputs, layers.Dense(4)(inputs))
            self.candidates = layers.Embedding(VOCABULARY, 4)
            self.candidates.build((None,))

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, **_):
            ids = keras_ctl.all_gather(y)
            scores = ops.matmul(
                keras_ctl.all_gather(y_pred), ops.transpose(self.candidates(ids))
            )
            return ops.mean(
                keras.losses.sparse_categorical_crossentropy(
                    ops.arange(ops.shape(ids)[0]), scores, from_logits=True
                )
            )

    return Retrieval()


def test_a_table_looked_up_for_gathered_rows_under_adam_equals_one_device():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(ROWS, 3)), rng.integers(0, VOCABULARY, ROWS)
    weights = []
    with configurations.computing_in("float64"):
        for base, kind in ((keras.Model, "default"), (keras_ctl.CTLModel, "mirrored")):
            keras.utils.set_random_seed(1)
            with devices.get(kind).scope():
                model = retrieval(base)
                model.compile(keras.optimizers.Adam(0.05))
            model.fit(x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0)
            weights.append(model.get_weights())
    # Put together replica by replica (before), 0.15 off.
    assert max(np.max(np.abs(a - b)) for a, b in zip(*weights)) < 1e-12


class FailingAfterItsStep(keras_ctl.CTLModel):
    def train_step(self, data):
        super().train_step(data)
        raise RuntimeError("after the step")


class CountingCallbacks(keras.Model):
    found = []

    def train_step(self, data):
        self.found.append(len(context.context().op_callbacks))
        return super().train_step(data)


def test_an_eager_step_leaves_no_op_callback_even_when_it_raises():
    """The eager step's op callbacks (`_keras.ops.eager_ops_of_this_thread`)
    are gone when the call ends, by an exception too: a plain `keras.Model`
    stepping eagerly under the same strategy afterwards runs with none."""
    x = np.arange(32, dtype="int32").reshape(8, 4) % VOCABULARY
    y = np.zeros((8, 1), "float32")
    strategy = devices.get("mirrored")
    for model_class in (FailingAfterItsStep, CountingCallbacks):
        with strategy.scope():
            inputs = keras.Input((4,), dtype="int32")
            hidden = layers.Flatten()(layers.Embedding(VOCABULARY, 2)(inputs))
            model = model_class(inputs, layers.Dense(1)(hidden))
            model.compile("adam", "mse", run_eagerly=True)
        if model_class is FailingAfterItsStep:
            with pytest.raises(RuntimeError, match="after the step"):
                model.fit(x, y, batch_size=4, verbose=0)
        else:
            model.fit(x, y, batch_size=4, verbose=0)
    assert CountingCallbacks.found == [0] * 4  # 2 steps, 2 replicas
    assert context.context().op_callbacks == []
