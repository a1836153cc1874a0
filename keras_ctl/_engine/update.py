"""The update: gradients summed across replicas once, then applied.

Keras sums gradients inside `optimizer.apply`, after clipping each replica's
*partial* gradient, so `clipnorm`, `global_clipnorm` and `clipvalue` act on
the wrong value under a strategy. Here the step sums the gradients itself
(`replicas.sum_across_replicas`, one all-reduce that can carry the step's
global counts too), and the optimizer applies the sum as it is: clipping
and the loss-scale check of mixed precision see what one device sees, and
every replica takes the same decision.
"""

import warnings
from collections.abc import Iterable
from collections.abc import Sequence

import keras
import tensorflow as tf

from keras_ctl import _keras
from keras_ctl._replicas import Gradient


def divide(
    gradients: Sequence[Gradient | None], divisor: tf.Tensor | int
) -> list[Gradient | None]:
    """Each gradient over `divisor` (0 when it is 0: no example anywhere)."""

    def over(g: Gradient | None) -> Gradient | None:
        if g is None:
            return None
        d = tf.cast(divisor, g.dtype)
        if isinstance(g, tf.IndexedSlices):
            return tf.IndexedSlices(
                tf.math.divide_no_nan(g.values, d), g.indices, g.dense_shape
            )
        return tf.math.divide_no_nan(g, d)

    return [over(g) for g in gradients]


def apply_summed(
    optimizer: keras.optimizers.Optimizer,
    gradients: Sequence[Gradient | None],
    variables: Iterable[keras.Variable],
) -> None:
    """Applies gradients already summed across replicas, without summing
    them again."""
    variables = list(variables)
    if not variables:
        warnings.warn("The model does not have any trainable weights.", stacklevel=3)
        return
    if not optimizer.built:
        # Before its EMA is set aside: building creates the EMA's variables.
        optimizer.build(variables)
    with _keras.gradients_already_summed(optimizer):
        optimizer.apply_gradients(zip(gradients, variables))
