"""Unseeded draws inside a replica step: a seed generator per replica,
created in an eager step (the behaviour of the seam's
`global_seed_generator` row)."""

import threading
import weakref
from typing import Any

import tensorflow as tf

from keras_ctl._keras import random as keras_random
from keras_ctl._keras.behaviours import registered
from keras_ctl._keras.state import in_step
from keras_ctl._replaced.random_rows import draw_rows_as_one_device


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
    Keras's `random.seed_generator.global_seed_generator` (checked on
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
                # Its seed is Python's `random`: not a draw of the step's.
                with draw_rows_as_one_device(None, None):
                    generator = of_strategy[replica] = keras_random.new_seed_generator()
        return generator

    return global_seed_generator
