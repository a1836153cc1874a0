"""Unseeded `keras.random` draws inside a replica step."""

import threading
import weakref

import tensorflow as tf

from keras_ctl._keras import names
from keras_ctl._keras.state import _in_step


class NeedsEagerStep(RuntimeError):
    """A traced replica step must first run eagerly once, to create state
    (the seed generators of unseeded draws, `per_replica_generators`; a
    variable a step of one's own creates, `own_step.variables_made_eagerly`)."""


_lock = threading.Lock()
# strategy -> {replica id: SeedGenerator}, for as long as the strategy lives.
_generators = weakref.WeakKeyDictionary()


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
            not getattr(_in_step, "active", False)
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
                generator = of_strategy[replica] = seed_generator()
        return generator

    return global_seed_generator
