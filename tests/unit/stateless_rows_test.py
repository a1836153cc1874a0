"""A replica's rows of one device's draw, drawn alone from the advanced
counter, are bit for bit the rows of the global batch's draw: for each of
Keras's TensorFlow draws that the replica steps replace, each float and
integer dtype, rows that start inside a Philox block or at one, and batch
sizes known before the step runs or only when it runs."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_ctl._keras import names
from keras_ctl._keras import stateless_rows
from keras_ctl._replaced import random_rows

BACKEND = names.module("keras.src.backend.tensorflow.random")
GLOBAL_ROWS = 7
SEED = 11


def draws():
    """`(name, shape of a row, dtype, kwargs)` of every draw replaced."""
    floats = ("float16", "float32", "float64")
    for dtype, row in itertools.product(floats, [(), (2, 5)]):
        yield "normal", row, dtype, {"mean": 0.5, "stddev": 2.0}
        yield "truncated_normal", row, dtype, {"mean": -1.0, "stddev": 0.5}
        yield "uniform", row, dtype, {"minval": -2.0, "maxval": 3.0}
        yield "dropout", row, dtype, {"rate": 0.3}
    for dtype, row in itertools.product(("int32", "int64", "uint8"), [(), (3,)]):
        yield "randint", row, dtype, {"minval": 2, "maxval": 200}
    yield "uniform", (3,), "int32", {"minval": -4, "maxval": 9}


def one_device(name, row, dtype, kwargs):
    """The global batch's draw on one device, Keras's own function."""
    seed = keras.random.SeedGenerator(SEED)
    if name == "dropout":
        inputs = tf.ones((GLOBAL_ROWS, *row), dtype)
        return getattr(BACKEND, name)(inputs, seed=seed, **kwargs)
    return getattr(BACKEND, name)((GLOBAL_ROWS, *row), dtype=dtype, seed=seed, **kwargs)


# (rows before, the replica's rows): starting inside a Philox block of
# four numbers or at one, and ending at the global batch's end.
SHARES = [(1, 3), (2, 5), (4, 3), (6, 1)]


def replicas_rows(name, row, dtype, kwargs, static, offset_known=True):
    """Each share's rows, drawn by the replaced function in a step drawing
    as one device (`static`: the batch size is known before it runs;
    `offset_known`: the rows before it are), and the graph's op types."""
    replaced = {
        "dropout": random_rows.dropout_as_one_device,
    }.get(name, random_rows.shaped_as_one_device)(getattr(BACKEND, name))

    seeds = [keras.random.SeedGenerator(SEED) for _ in SHARES]

    def step(befores, *batches):
        drawn = []
        for index, ((before, rows), batch, seed) in enumerate(
            zip(SHARES, batches, seeds)
        ):
            offset = tf.constant(before) if offset_known else befores[index]
            with random_rows.draw_rows_as_one_device(
                tf.shape(batch)[0], offset, rows if static else None
            ):
                if name == "dropout":
                    inputs = tf.ones_like(batch, dtype)
                    drawn.append(replaced(inputs, seed=seed, **kwargs))
                else:
                    shape = keras.ops.shape(batch)
                    drawn.append(replaced(shape, dtype=dtype, seed=seed, **kwargs))
        return drawn

    signature = [tf.TensorSpec((len(SHARES),), tf.int32)] + [
        tf.TensorSpec((rows if static else None, *row)) for _, rows in SHARES
    ]
    traced = tf.function(step, input_signature=signature).get_concrete_function()
    befores = tf.constant([before for before, _ in SHARES])
    drawn = traced(befores, *[tf.zeros((rows, *row)) for _, rows in SHARES])
    return drawn, {op.type for op in traced.graph.get_operations()}


@pytest.mark.parametrize("offset_known", [True, False], ids=["at_known", "at_read"])
@pytest.mark.parametrize("static", [True, False], ids=["static", "dynamic"])
@pytest.mark.parametrize(
    "name, row, dtype, kwargs",
    list(draws()),
    ids=lambda value: str(value) if not isinstance(value, dict) else "",
)
def test_a_replicas_rows_drawn_alone_are_the_global_draws_rows(
    name, row, dtype, kwargs, static, offset_known
):
    expected = np.asarray(one_device(name, row, dtype, kwargs))
    drawn, op_types = replicas_rows(name, row, dtype, kwargs, static, offset_known)
    # Drawn alone: the counter is advanced, not the draw widened.
    assert "StatelessRandomGetKeyCounterAlg" in op_types
    for (before, rows), share in zip(SHARES, drawn):
        assert share.shape == (rows, *row)
        np.testing.assert_array_equal(
            np.asarray(share).view(np.uint8),
            expected[before : before + rows].view(np.uint8),
        )


def test_the_counter_carries_into_its_high_word():
    counter = tf.constant([2**64 - 2, 5], tf.uint64)
    advanced = stateless_rows._advanced(counter, tf.constant(3, tf.int64))
    np.testing.assert_array_equal(advanced.numpy(), np.array([1, 6], np.uint64))
