"""A step of the user's own, read as one device's code on each replica's
part of the batch, unless it declares itself written in shares as it runs
(`keras_ctl.written_in_shares`; `_own_code`).

    fraction = this replica's examples / the global batch's   # one collective,
        # none where the trace knows every replica's batch size
    within read_as_batch_losses(fraction), watching replica arithmetic:
        outputs = the user's step(this replica's part)
    unless the step declared itself in shares:
        the gradients it applies are weighed by fraction where they are summed
        its untyped logs are weighed by fraction where they are reduced

A mean over the replica's examples (`tf.reduce_mean`, `ops.mean`, a masked
`sum / count`) becomes the global batch's mean, a term that does not depend
on the batch (a regularizer) counts once, Keras's `Loss` objects, the
model's `compute_loss` and keras_ctl's `global_mean` keep their one-device
values and gradients, and a replica without examples weighs exactly 0 (none
of the NaN its placeholder may give reaches the update or the logs).
keras_ctl's own steps, called from it (`super().train_step(data)`, the
`GAN`'s phases), keep their shares as written (`written_in_shares`).
"""

import contextlib
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import tensorflow as tf
from keras import tree

from keras_ctl import _replaced
from keras_ctl._own_code import watching_replica_arithmetic
from keras_ctl._replicas import global_shares
from keras_ctl._replicas import known_global_count
from keras_ctl._replicas import num_replicas
from keras_ctl._replicas import read_as_batch_losses
from keras_ctl._replicas import static_rows

# The log key that carries the replica's fraction from its step to the
# reduction of the logs (`outputs.reduce_step_logs`), never logged.
FRACTION_LOG = "_keras_ctl_batch_fraction"


def run_as_one_device(
    step: Callable[[Any], Any], data: Any, step_name: str = "the step"
) -> Any:
    """`step(data)` on this replica, read as one device's code; a dict of
    logs gains the replica's fraction under `FRACTION_LOG`. `step_name`
    names it in messages."""
    if num_replicas() == 1 or tf.distribute.get_replica_context() is None:
        return step(data)
    fraction = fraction_of_global_batch(data)
    if fraction is None:
        return step(data)
    with read_as_batch_losses(fraction, step_name, kind="step") as reading:
        with variables_made_eagerly(), watching_replica_arithmetic():
            outputs = step(data)
    if isinstance(outputs, dict) and not (reading and reading.in_shares):
        outputs = {**outputs, FRACTION_LOG: fraction}
    return outputs


def fraction_of_global_batch(data: Any) -> tf.Tensor | None:
    """This replica's examples over the global batch's (float64, exact for
    any split), or `None` for data without a batch dimension. The examples
    are the rows of the data's first tensor, whatever its structure.

    Known as the step is traced where every replica's rows are
    (`known_global_count`): no collective, and no guard for a replica
    without examples."""
    leaves = [t for t in tree.flatten(data) if tf.is_tensor(t) and t.shape.rank]
    if not leaves:
        return None
    rows = static_rows(leaves[0])
    known = known_global_count(rows) if rows else None
    if rows and known:
        return tf.constant(rows / known, tf.float64)
    local = tf.cast(tf.shape(leaves[0])[0], tf.float64)
    (fraction,), _ = global_shares([local], [local])
    return fraction


def logs_and_fraction(outputs: Any) -> tuple[Any, tf.Tensor | None]:
    """`(outputs without FRACTION_LOG, the fraction or None)`."""
    if not isinstance(outputs, dict) or FRACTION_LOG not in outputs:
        return outputs, None
    outputs = dict(outputs)
    return outputs, outputs.pop(FRACTION_LOG)


@contextlib.contextmanager
def variables_made_eagerly() -> Iterator[None]:
    """Within it, a variable a step creates as it is traced (`if not
    hasattr(self, "seen"): self.seen = tf.Variable(0)`) asks for an eager
    step (`_replaced.seed_generators.NeedsEagerStep`), which creates it once for every
    replica; the traced step then finds it.
    `tf.function`'s own lifting of such a variable fails in a replica step
    under several replicas."""

    def creator(next_creator: Callable[..., tf.Variable], **kwargs: Any) -> tf.Variable:
        if tf.inside_function():
            raise _replaced.seed_generators.NeedsEagerStep(
                "A variable created in a traced step is created by an eager step."
            )
        return next_creator(**kwargs)

    with tf.variable_creator_scope(creator):
        yield
