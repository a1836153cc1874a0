"""Random draws inside a replica step made as one device makes them
(`draw_rows_as_one_device`): the behaviours of the seam's rows of Keras's
random functions that draw a row per example."""

import contextlib
import functools
import inspect
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_ctl._keras import random as keras_random
from keras_ctl._keras import stateless_rows
from keras_ctl._keras.behaviours import registered
from keras_ctl._keras.state import in_step


@contextlib.contextmanager
def draw_rows_as_one_device(rows, offset, static_rows=None):
    """Within it (this replica step's thread), a Keras random draw whose
    first dimension is this replica's `rows` draws the numbers one device
    draws for those examples: rows `offset : offset + rows` of the global
    batch's draw with the step's seed (the same on every replica;
    `offset`: the examples of the replicas before this one). Keras's
    `normal`, `uniform`, `truncated_normal`, `randint` and `dropout` draw
    those rows alone (`stateless_rows`); `gamma`, `binomial`, `beta` and
    `categorical` draw the first `offset + rows` rows and keep the last
    `rows`. Other draws (one per batch) are one device's already: every
    replica uses the seed one device uses. `static_rows` is the replica's
    number of rows where the step knows it before it runs (every batch
    splits evenly), else `None`. `offset` may be a function that computes
    it, called at the first draw that needs it (once in each graph it is
    drawn in): a step that draws nothing computes nothing. With `rows`
    `None`, draws within it are not drawn as one device."""
    previous = getattr(in_step, "random_rows", None)
    if callable(offset):
        offset = _OnceAGraph(offset)
    in_step.random_rows = None if rows is None else (rows, offset, static_rows)
    try:
        yield
    finally:
        in_step.random_rows = previous


class _OnceAGraph:
    """`compute()`, called once in each graph that asks for it (a draw in
    a `tf.cond` branch or a loop's body cannot use a tensor of another)."""

    def __init__(self, compute):
        self._compute = compute
        self._values = {}

    def __call__(self):
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        if graph not in self._values:
            self._values[graph] = self._compute()
        return self._values[graph]


def _rows_before(first):
    """How many rows to draw before a draw whose first dimension is
    `first`, in a step drawing as one device: this replica's offset when
    `first` is its rows, else 0.

    Decided by the value, the same for static and dynamic batches: a first
    dimension equal to the replica's rows is a draw for its examples
    (`ops.shape(x)` gives a number when the batch's size is static, a
    tensor when it is not). A number while the batch's size is known only
    when the step runs cannot be the batch's size: it is one draw for the
    batch (`keras.random.uniform((1,))`), even on a replica holding that
    many examples. The one reading that cannot be checked: a number equal
    to a static batch size is taken for the batch."""
    rows, offset, static_rows = in_step.random_rows
    static_first = static_value(first)
    if static_first is not None and static_first != static_rows:
        return tf.constant(0, tf.int32)
    if callable(offset):
        offset = offset()
    if static_first is not None or static_value(offset) == 0:
        return offset
    return tf.where(tf.equal(tf.cast(first, rows.dtype), rows), offset, 0)


def static_value(value):
    """`value` as a Python int when known before the step runs, else `None`."""
    if isinstance(value, (int, np.integer)):
        return int(value)
    static = tf.get_static_value(value)
    return None if static is None else int(static)


@registered
def shaped_as_one_device(original):
    """`normal`, `uniform`, `truncated_normal` or `randint` of Keras's
    TensorFlow backend, drawing as one device (`draw_rows_as_one_device`).

    TensorFlow's stateless random ops fill an output from one counter-based
    stream in row-major order, so this replica's rows of one device's draw
    are drawn alone from the stream advanced past the rows before them
    (`stateless_rows.rows_of`), with the seed Keras draws, once, by its own
    function. A draw that is not for the replica's rows is Keras's own.
    Replaces the function in the TensorFlow backend's `random`
    (checked on Keras 3.12.0 and 3.15.1).
    """
    signature = inspect.signature(original)
    rows_alone = _ROWS_ALONE[original.__name__]

    def draw(*args, **kwargs):
        if getattr(in_step, "random_rows", None) is None:
            return original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        shape = bound.arguments.pop("shape")
        shape_tensor = _shape_tensor(shape)
        if shape_tensor is None:
            return original(*args, **kwargs)
        before = _rows_before(_first(shape, shape_tensor))
        if tf.get_static_value(before) == 0:
            return original(*args, **kwargs)
        bound.arguments["seed"] = keras_random.keras_seed(bound.arguments["seed"])
        return rows_alone(shape, before, **bound.arguments)

    return draw


def _normal_rows(shape, before, mean, stddev, dtype, seed, kind="normal"):
    """Keras's `normal` (and `truncated_normal`): TensorFlow's stateless
    draw, scaled as `tf.random.stateless_normal` scales it."""
    dtype = dtype or keras.config.floatx()
    drawn = stateless_rows.rows_of(kind, shape, before, seed, dtype)
    return drawn * tf.convert_to_tensor(stddev, dtype) + tf.convert_to_tensor(
        mean, dtype
    )


def _uniform_rows(shape, before, minval, maxval, dtype, seed):
    """Keras's `uniform`: `tf.random.stateless_uniform` of `minval` and
    `maxval` cast to `dtype`."""
    dtype = tf.as_dtype(dtype or keras.config.floatx())
    minval, maxval = tf.cast(minval, dtype), tf.cast(maxval, dtype)
    if dtype.is_integer:
        bounds = {"minval": minval, "maxval": maxval}
        return stateless_rows.rows_of(
            "uniform_int", shape, before, seed, dtype, **bounds
        )
    drawn = stateless_rows.rows_of("uniform", shape, before, seed, dtype)
    return drawn * (maxval - minval) + minval


def _randint_rows(shape, before, minval, maxval, dtype, seed):
    """Keras's `randint`: a uniform integer draw in int32 or int64, cast."""
    drawn_as = (
        dtype
        if keras.backend.standardize_dtype(dtype) in ("int32", "int64")
        else "int64"
    )
    bounds = {
        "minval": tf.convert_to_tensor(minval, drawn_as),
        "maxval": tf.convert_to_tensor(maxval, drawn_as),
    }
    drawn = stateless_rows.rows_of(
        "uniform_int", shape, before, seed, drawn_as, **bounds
    )
    return tf.cast(drawn, dtype)


_ROWS_ALONE: dict[str, Callable[..., Any]] = {
    "normal": _normal_rows,
    "truncated_normal": functools.partial(_normal_rows, kind="truncated_normal"),
    "uniform": _uniform_rows,
    "randint": _randint_rows,
}


@registered
def parameterized_as_one_device(original, parameters):
    """`gamma`, `binomial` or `beta` of Keras's TensorFlow backend, drawing
    as one device (`shaped_as_one_device`): each of `parameters` (the
    names of the function's arguments) that has a value per row gets
    `offset` rows of ones in front, which draw valid numbers that are
    dropped again. TensorFlow's stateless gamma and binomial give each
    element a stream of its own, so a row's numbers do not depend on the
    other rows' parameters. Replaces the functions in
    the TensorFlow backend's `random` (checked on Keras 3.12.0 and
    3.15.1)."""
    signature = inspect.signature(original)

    def draw(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        shape = bound.arguments["shape"]
        shape_tensor = _shape_tensor(shape)
        if getattr(in_step, "random_rows", None) is None or shape_tensor is None:
            return original(*args, **kwargs)
        before = _rows_before(_first(shape, shape_tensor))
        dtype = bound.arguments.get("dtype") or keras.config.floatx()
        for name in parameters:
            bound.arguments[name] = _with_rows_before(
                bound.arguments[name], before, shape_tensor.shape[0], dtype
            )
        bound.arguments["shape"] = tf.concat(
            [[shape_tensor[0] + before], shape_tensor[1:]], 0
        )
        return original(*bound.args, **bound.kwargs)[before:]

    return draw


def _with_rows_before(value, before, rank, dtype):
    """`value`, a parameter of a draw of `rank` dimensions, with `before`
    rows of ones in front when it has a value per row (its first dimension
    is not 1, which broadcasts over the wider draw as it is)."""
    if isinstance(value, (int, float)) or np.ndim(value) != rank:
        return value
    if not isinstance(value, (tf.Tensor, tf.Variable)):
        value = tf.convert_to_tensor(value, dtype=dtype)
    rows = tf.shape(value)[0]
    before = tf.where(tf.equal(rows, 1), tf.zeros_like(before), before)
    return _rows_in_front(value, before, fill=1)


@registered
def categorical_as_one_device(original):
    """Keras's TensorFlow `categorical`, drawing as one device
    (`shaped_as_one_device`): the logits, a row per draw, get `offset` rows
    of zeros in front, dropped again after. Replaces
    the TensorFlow backend's `random.categorical`."""

    def categorical(logits, num_samples, dtype="int64", seed=None):
        if getattr(in_step, "random_rows", None) is None:
            return original(logits, num_samples, dtype=dtype, seed=seed)
        logits = tf.convert_to_tensor(logits)
        rows = static_value(logits.shape[0])
        before = _rows_before(tf.shape(logits)[0] if rows is None else rows)
        wider = _rows_in_front(logits, before)
        return original(wider, num_samples, dtype=dtype, seed=seed)[before:]

    return categorical


@registered
def dropout_as_one_device(original):
    """Keras's TensorFlow `dropout`, drawing its mask as one device
    (`shaped_as_one_device`): TensorFlow's own stateless dropout, its
    uniform numbers this replica's rows of one device's draw. Replaces
    the TensorFlow backend's `random.dropout`."""

    def dropout(inputs, rate, noise_shape=None, seed=None):
        rank = inputs.shape.rank
        if (
            getattr(in_step, "random_rows", None) is None
            or not rank
            or (isinstance(rate, (int, float)) and rate in (0, 1))
        ):
            return original(inputs, rate, noise_shape=noise_shape, seed=seed)
        concrete_noise_shape = _static_noise_shape(inputs, noise_shape)
        if concrete_noise_shape is None:
            concrete_noise_shape = keras_random.concrete_noise_shape(
                inputs, noise_shape
            )
        before = _rows_before(concrete_noise_shape[0])
        if tf.get_static_value(before) == 0:
            return original(inputs, rate, noise_shape=noise_shape, seed=seed)
        seed = keras_random.keras_seed(seed)

        def uniform(shape, dtype):
            # `tf.random.stateless_uniform` in [0, 1), as TensorFlow's
            # stateless dropout draws it.
            return _uniform_rows(shape, before, 0.0, 1.0, dtype, seed)

        return keras_random.stateless_dropout(
            inputs, rate, concrete_noise_shape, uniform
        )

    return dropout


def _static_noise_shape(inputs, noise_shape):
    """Keras's concrete noise shape of a dropout as Python ints, where the
    trace knows every dimension (else `None`): the same draw, no op."""
    shape = inputs.shape.as_list()
    if noise_shape is not None:
        if len(noise_shape) != len(shape):
            return None
        given = [None if d is None else static_value(d) for d in noise_shape]
        if any(d is not None and g is None for d, g in zip(noise_shape, given)):
            return None  # a dimension known only when the step runs
        shape = [s if g is None else g for s, g in zip(shape, given)]
    return shape if all(isinstance(d, int) for d in shape) else None


def _rows_in_front(value, before, fill=0):
    """`value` with `before` rows of `fill` in front of its first axis: the
    rows of the replicas before this one, drawn for and dropped after."""
    padding = [[before, 0]] + [[0, 0]] * (value.shape.rank - 1)
    return tf.pad(value, padding, constant_values=fill)


def _first(shape, shape_tensor):
    """The first dimension of `shape`, a Python int where it is written as
    one (converted to a tensor, it is no longer known statically)."""
    if isinstance(shape, tf.TensorShape):
        shape = shape.as_list()
    if isinstance(shape, (list, tuple)) and static_value(shape[0]) is not None:
        return static_value(shape[0])
    return shape_tensor[0]


def _shape_tensor(shape):
    """`shape` as a 1-D int32 tensor, or `None` for a scalar's."""
    if isinstance(shape, tf.TensorShape):
        shape = shape.as_list()
    if isinstance(shape, (list, tuple)) and not shape:
        return None
    tensor = tf.cast(tf.convert_to_tensor(shape), tf.int32)
    if tensor.shape.rank != 1 or tensor.shape[0] == 0:
        return None
    return tensor
