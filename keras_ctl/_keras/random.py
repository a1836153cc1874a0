"""Keras's random draws as its private functions spell them: which
functions draw, the seed Keras's TensorFlow draws use, its seed
generators, and TensorFlow's stateless dropout."""

from typing import Any

import tensorflow as tf

from keras_ctl._keras import names

# Keras's random functions whose first argument is the output's shape.
SHAPED = ("normal", "uniform", "truncated_normal", "randint")

# Keras's random functions whose first argument is the output's shape and
# whose named parameters may hold a value per row of it.
PARAMETERIZED = {
    "gamma": ("alpha",),
    "binomial": ("counts", "probabilities"),
    "beta": ("alpha", "beta"),
}

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


def is_seed_state(variable: Any) -> bool:
    """Whether `variable` is a `SeedGenerator`'s state, which every draw
    of a seeded layer or `keras.random` function advances (its name is
    Keras's, in `keras.src.random.seed_generator`; the TensorFlow variable
    under it adds its scope and `:0`)."""
    name = str(getattr(variable, "name", ""))
    return name.rsplit("/", 1)[-1].split(":")[0] == "seed_generator_state"


def new_seed_generator() -> object:
    """A `keras.random.SeedGenerator()` without a seed, made as Keras's
    global one is (`random.seed_generator.SeedGenerator`)."""
    return names.member("keras.src.random.seed_generator", "SeedGenerator")()


def keras_seed(seed: object) -> tf.Tensor:
    """The seed Keras's TensorFlow draws use for `seed` (a number, a seed
    generator, or `None` for the global one), drawn as Keras draws it
    (`seed_generator.draw_seed`, the backend's `_cast_seed`)."""
    draw_seed = names.member("keras.src.random.seed_generator", "draw_seed")
    cast_seed = names.member("keras.src.backend.tensorflow.random", "_cast_seed")
    return cast_seed(draw_seed(seed))


def is_making_a_seed(code: object) -> bool:
    """Whether `code` (a code object) is Keras's `make_default_seed`, which
    draws the seed of a seed generator made without one (checked on Keras
    3.12.0 and 3.15.1)."""
    make_default_seed = names.member(
        "keras.src.random.seed_generator", "make_default_seed"
    )
    return code is make_default_seed.__code__


def concrete_noise_shape(inputs: tf.Tensor, noise_shape: object) -> object:
    """Keras's noise shape of a dropout of `inputs` (the backend's
    `_get_concrete_noise_shape`)."""
    return names.member(
        "keras.src.backend.tensorflow.random", "_get_concrete_noise_shape"
    )(inputs, noise_shape)


def stateless_dropout(inputs, rate, noise_shape, uniform) -> tf.Tensor:
    """TensorFlow's stateless dropout of `inputs` (`nn_ops._dropout`), its
    uniform numbers `uniform(shape, dtype)`."""
    return names.member("tensorflow.python.ops.nn_ops", "_dropout")(
        inputs, rate, noise_shape, uniform, lambda: None, None, "stateless_dropout"
    )
