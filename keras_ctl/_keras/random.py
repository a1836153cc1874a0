"""Random draws inside a replica step: unseeded draws, and draws made as
one device makes them (`draw_rows_as_one_device`)."""

import contextlib
import functools
import inspect
import threading
import weakref
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_ctl._keras import names
from keras_ctl._keras import stateless_rows
from keras_ctl._keras.behaviours import registered
from keras_ctl._keras.state import in_step


class NeedsEagerStep(RuntimeError):
    """A traced replica step must first run eagerly once, to create state
    (the seed generators of unseeded draws, `per_replica_generators`; a
    variable a step of one's own creates, `own_step.variables_made_eagerly`)."""


def needs_eager_step(error: BaseException | None) -> bool:
    """Whether `error` (or an error it was raised from: AutoGraph wraps what
    a converted function raises) is a `NeedsEagerStep`."""
    while error is not None:
        if isinstance(error, NeedsEagerStep):
            return True
        error = error.__cause__ or error.__context__
    return False


_lock = threading.Lock()
# strategy -> {replica id: SeedGenerator}, for as long as the strategy lives.
_generators: weakref.WeakKeyDictionary[tf.distribute.Strategy, dict[int, Any]] = (
    weakref.WeakKeyDictionary()
)


@registered
def per_replica_generators(original):
    """An unseeded draw (`keras.random.normal(shape)`) inside a replica step
    under several replicas uses a seed generator of its replica's.

    Keras keeps its global seed generator per thread (`global_state` is a
    `threading.local`), so each replica thread creates one inside the
    traced step, and `tf.function` refuses the second variable ("only
    supports singleton tf.Variables", stock Keras under a strategy too).
    Here each replica's generator is created once, by Keras's own
    `SeedGenerator()`, in an eager step (`NeedsEagerStep` asks the step
    function for one), and kept for the strategy's life; each replica
    draws its own numbers, as Keras's layers' seeded draws do. Replaces
    `keras.src.random.seed_generator.global_seed_generator` (checked on
    Keras 3.12.0 and 3.15.1).
    """

    def global_seed_generator():
        context = tf.distribute.get_replica_context()
        if (
            not getattr(in_step, "active", False)
            or context is None
            or context.num_replicas_in_sync == 1
        ):
            return original()
        replica = int(tf.get_static_value(context.replica_id_in_sync_group))
        with _lock:
            of_strategy = _generators.setdefault(context.strategy, {})
            generator = of_strategy.get(replica)
            if generator is None:
                if not tf.executing_eagerly():
                    raise NeedsEagerStep(
                        "An unseeded `keras.random` draw needs a seed generator "
                        "per replica, created in an eager step."
                    )
                seed_generator = names.member(
                    "keras.src.random.seed_generator", "SeedGenerator"
                )
                # Its seed is Python's `random`: not a draw of the step's.
                with draw_rows_as_one_device(None, None):
                    generator = of_strategy[replica] = seed_generator()
        return generator

    return global_seed_generator


def is_seed_state(variable: Any) -> bool:
    """Whether `variable` is a `SeedGenerator`'s state, which every draw
    of a seeded layer or `keras.random` function advances (its name is
    Keras's, in `keras.src.random.seed_generator`; the TensorFlow variable
    under it adds its scope and `:0`)."""
    name = str(getattr(variable, "name", ""))
    return name.rsplit("/", 1)[-1].split(":")[0] == "seed_generator_state"


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
    static_first = _static(first)
    if static_first is not None and static_first != static_rows:
        return tf.constant(0, tf.int32)
    if callable(offset):
        offset = offset()
    if static_first is not None or _static(offset) == 0:
        return offset
    return tf.where(tf.equal(tf.cast(first, rows.dtype), rows), offset, 0)


def _static(value):
    """`value` as a Python int when known before the step runs, else `None`."""
    if isinstance(value, (int, np.integer)):
        return int(value)
    static = tf.get_static_value(value)
    return None if static is None else int(static)


# Keras's random functions whose first argument is the output's shape.
SHAPED = ("normal", "uniform", "truncated_normal", "randint")


@registered
def shaped_as_one_device(original):
    """`normal`, `uniform`, `truncated_normal` or `randint` of Keras's
    TensorFlow backend, drawing as one device (`draw_rows_as_one_device`).

    TensorFlow's stateless random ops fill an output from one counter-based
    stream in row-major order, so this replica's rows of one device's draw
    are drawn alone from the stream advanced past the rows before them
    (`stateless_rows.rows_of`), with the seed Keras draws, once, by its own
    function. A draw that is not for the replica's rows is Keras's own.
    Replaces the function in `keras.src.backend.tensorflow.random`
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
        bound.arguments["seed"] = _keras_seed(bound.arguments["seed"])
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


def _keras_seed(seed):
    """The seed Keras's TensorFlow draws use for `seed` (a number, a seed
    generator, or `None` for the global one), drawn as Keras draws it; the
    `_..._rows` functions take it so drawn."""
    draw_seed = names.member("keras.src.random.seed_generator", "draw_seed")
    cast_seed = names.member("keras.src.backend.tensorflow.random", "_cast_seed")
    return cast_seed(draw_seed(seed))


# Keras's random functions whose first argument is the output's shape and
# whose named parameters may hold a value per row of it.
PARAMETERIZED = {
    "gamma": ("alpha",),
    "binomial": ("counts", "probabilities"),
    "beta": ("alpha", "beta"),
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
    `keras.src.backend.tensorflow.random` (checked on Keras 3.12.0 and
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
    `keras.src.backend.tensorflow.random.categorical`."""

    def categorical(logits, num_samples, dtype="int64", seed=None):
        if getattr(in_step, "random_rows", None) is None:
            return original(logits, num_samples, dtype=dtype, seed=seed)
        logits = tf.convert_to_tensor(logits)
        rows = _static(logits.shape[0])
        before = _rows_before(tf.shape(logits)[0] if rows is None else rows)
        wider = _rows_in_front(logits, before)
        return original(wider, num_samples, dtype=dtype, seed=seed)[before:]

    return categorical


@registered
def shuffle_refused_as_one_device(original):
    """Keras's TensorFlow `shuffle`, refused for the replica's rows in a
    step drawing as one device: one device's permutation of the global
    batch takes each replica's rows from every replica. Another shuffle (of
    a tensor without a row per example) is one device's already. Replaces
    `keras.src.backend.tensorflow.random.shuffle`."""

    def shuffle(x, axis=0, seed=None):
        random_rows = getattr(in_step, "random_rows", None)
        if random_rows is None:
            return original(x, axis=axis, seed=seed)
        x = tf.convert_to_tensor(x)
        length = _static(x.shape[axis])
        rows, _, static_rows = random_rows
        if length is not None and static_rows is not None:
            if length == static_rows:
                raise ValueError(_SHUFFLE_REFUSED)
            return original(x, axis=axis, seed=seed)
        length = tf.shape(x)[axis] if length is None else length
        check = tf.debugging.Assert(
            tf.not_equal(tf.cast(length, rows.dtype), rows),
            [f"keras_ctl: {_SHUFFLE_REFUSED}"],
        )
        with tf.control_dependencies([check]):
            return original(tf.identity(x), axis=axis, seed=seed)

    return shuffle


# The functions of Python's `random` module that draw.
PYTHON_DRAWS = (
    "random",
    "uniform",
    "randint",
    "randrange",
    "choice",
    "choices",
    "sample",
    "shuffle",
    "gauss",
    "normalvariate",
)


@registered
def python_draw_refused_as_one_device(original):
    """A draw of Python's `random` in a replica step drawing as one device
    is refused: each replica thread runs (and traces) the step, so each
    draws its own numbers, which no replica can make one device's
    (`keras.layers.AugMix` picks its augmentations with `random.choice`).
    Replaces the function of Python's `random` module, for the replica
    steps' threads only. Not refused: the seed Keras draws for a seed
    generator made without one (`seed_generator.make_default_seed`, checked
    on Keras 3.12.0 and 3.15.1), as a layer the step builds makes it
    (`MultiHeadAttention`'s `Dropout`): the layer is built once, for every
    replica, so its seed is one number, as on one device."""

    def draw(*args, **kwargs):
        caller = inspect.currentframe().f_back  # type: ignore[union-attr]
        if getattr(in_step, "random_rows", None) is None or _making_a_seed(
            caller.f_code  # type: ignore[union-attr]
        ):
            return original(*args, **kwargs)
        raise ValueError(
            'compile(random_draws="as_one_device") cannot draw Python\'s '
            f"`random.{original.__name__}` as one device. Received: a call to "
            f"`random.{original.__name__}` in the training step (keras.layers."
            "AugMix picks its augmentations so): each replica runs the step "
            "and draws its own. Draw with `keras.random` and a "
            "`keras.random.SeedGenerator` instead, or compile with "
            'random_draws="per_replica" for each replica\'s own draws.'
        )

    return draw


def _making_a_seed(caller: Any) -> bool:
    """Whether `caller` (a code object) is Keras's `make_default_seed`."""
    make_default_seed = names.member(
        "keras.src.random.seed_generator", "make_default_seed"
    )
    return caller is make_default_seed.__code__


@registered
def image_draw_refused_as_one_device(original):
    """Keras's TensorFlow `image.elastic_transform` is refused in a replica
    step drawing as one device: it draws its displacement fields with
    TensorFlow's own random ops, for a batch whose size it reads from the
    static shape (1 when unknown), which no replica can make one device's
    (`keras.layers.RandomElasticTransform`). Replaces
    `keras.src.backend.tensorflow.image.elastic_transform`, or, in a Keras
    without it, the layer's `transform_images`."""

    def elastic_transform(*args, **kwargs):
        if getattr(in_step, "random_rows", None) is None:
            return original(*args, **kwargs)
        raise ValueError(
            'compile(random_draws="as_one_device") cannot draw '
            "`keras.layers.RandomElasticTransform`'s displacement fields as "
            "one device. Received: a call to Keras's `image.elastic_transform` "
            "in the training step, which draws with TensorFlow's own random "
            "ops for a batch of its static size. Apply it in the input "
            "pipeline (`dataset.map`) instead, or compile with "
            'random_draws="per_replica" for each replica\'s own fields.'
        )

    return elastic_transform


@registered
def batch_mixing_refused_as_one_device(original):
    """`keras.layers.Mosaic` (Keras 3.16) is refused in a replica step
    drawing as one device: it picks each example's other tiles among the
    batch's rows (a `randint` up to the batch's size), which a replica
    cannot draw from the global batch. Replaces its
    `get_random_transformation`."""

    def get_random_transformation(self, data, training=True, seed=None):
        if getattr(in_step, "random_rows", None) is None or not training:
            return original(self, data, training=training, seed=seed)
        raise ValueError(
            'compile(random_draws="as_one_device") cannot draw '
            f"`keras.layers.{type(self).__name__}`'s tiles as one device. "
            "Received: the layer in the training step, which picks each "
            "example's tiles among the batch's rows: a replica holds only "
            "its part of the batch. Apply it in the input pipeline "
            "(`dataset.map` on batches) instead, or compile with "
            'random_draws="per_replica" to mix each replica\'s own rows.'
        )

    return get_random_transformation


_SHUFFLE_REFUSED = (
    'compile(random_draws="as_one_device") cannot shuffle the '
    "replica's rows as one device does. Received: `keras.random.shuffle` of "
    "a tensor with a row per example of the replica's share of the batch. "
    "One device's permutation of the global batch takes each replica's rows "
    "from every replica: shuffle `keras_ctl.all_gather(rows)` (the global "
    "batch, the same on every replica) and keep the replica's rows "
    "(from `keras_ctl.row_offset(rows)`), or compile with "
    'random_draws="per_replica" for each replica\'s own permutation.'
)


@registered
def dropout_as_one_device(original):
    """Keras's TensorFlow `dropout`, drawing its mask as one device
    (`shaped_as_one_device`): TensorFlow's own stateless dropout, its
    uniform numbers this replica's rows of one device's draw. Replaces
    `keras.src.backend.tensorflow.random.dropout`."""

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
            concrete_noise_shape = names.member(
                "keras.src.backend.tensorflow.random", "_get_concrete_noise_shape"
            )(inputs, noise_shape)
        before = _rows_before(concrete_noise_shape[0])
        if tf.get_static_value(before) == 0:
            return original(inputs, rate, noise_shape=noise_shape, seed=seed)
        seed = _keras_seed(seed)

        def uniform(shape, dtype):
            # `tf.random.stateless_uniform` in [0, 1), as TensorFlow's
            # stateless dropout draws it.
            return _uniform_rows(shape, before, 0.0, 1.0, dtype, seed)

        return names.member("tensorflow.python.ops.nn_ops", "_dropout")(
            inputs,
            rate,
            concrete_noise_shape,
            uniform,
            lambda: None,
            None,
            "stateless_dropout",
        )

    return dropout


def _static_noise_shape(inputs, noise_shape):
    """Keras's concrete noise shape of a dropout as Python ints, where the
    trace knows every dimension (else `None`): the same draw, no op."""
    shape = inputs.shape.as_list()
    if noise_shape is not None:
        if len(noise_shape) != len(shape):
            return None
        given = [None if d is None else _static(d) for d in noise_shape]
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
    if isinstance(shape, (list, tuple)) and _static(shape[0]) is not None:
        return _static(shape[0])
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
