"""XLA for the default steps under a multi-replica strategy.

XLA cannot compile a `strategy.run` that spans devices (Keras 3.15 fails
with "Trying to access resource ... located in device CPU:1 from device
CPU:0"), and a compiled function cannot hold the collectives of a step. So
each replica compiles its own forward and backward pass, and the two
collectives stay outside it: the global batch size is all-reduced before the
compiled pass, the gradients are summed when the optimizer applies them.

Without an all-reduce inside, every loss denominator must be a fixed count
per example (no masks, no sample-weight sums); a loss that needs more runs
the uncompiled exact step instead, with a warning.
"""

import warnings

import keras
import tensorflow as tf

from keras_ctl import compiled_loss
from keras_ctl import reduction


def prepare(model, training):
    """Compiles `model`'s per-replica pass (train or test) when XLA applies."""
    applies = (
        model.jit_compile
        and not model.run_eagerly
        and model.distribute_strategy.num_replicas_in_sync > 1
        and model._compile_loss is not None
        and type(model).compute_loss is _default_compute_loss()
    )
    passes = model.__dict__.setdefault("_ctl_xla_passes", {})
    passes[training] = None
    if applies:
        passes[training] = tf.function(
            lambda data, batch_size, global_batch: _pass(
                model, data, batch_size, global_batch, training
            ),
            jit_compile=True,
            reduce_retracing=True,
        )


def forward_backward(model, data, batch_size, training):
    """Runs the compiled pass on this replica, or returns `None`.

    Returns:
        `(loss, shares, y_pred, gradients)` (no gradients when not
        training), or `None` when the caller must run the uncompiled step.
    """
    compiled_pass = getattr(model, "_ctl_xla_passes", {}).get(training)
    if compiled_pass is None:
        return None
    global_batch = reduction.all_reduce_sum(tf.cast(batch_size, tf.float32))
    try:
        with tf.control_dependencies([global_batch]):
            loss, shares, y_pred, gradients = compiled_pass(
                data, batch_size, global_batch
            )
    except compiled_loss.NeedsCountAllReduce:
        if model._ctl_xla_passes[training] is not None:  # warn once, not per replica
            warnings.warn(
                "`jit_compile=True` under a multi-replica strategy compiles "
                "each replica's pass only when every loss divides by a fixed "
                "count per example. This model's loss uses masks or "
                "sample-weight sums, so its steps run without XLA (still exact).",
                stacklevel=2,
            )
            model._ctl_xla_passes[training] = None
        return None
    # Output names are strings, which a compiled function cannot return.
    names = [name for *_, name in model._compile_loss._flat_losses]
    shares = shares._replace(per_output=list(zip(names, shares.per_output)))
    return loss, shares, y_pred, gradients


def _pass(model, data, batch_size, global_batch, training):
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    with tf.GradientTape() as tape:
        y_pred = model(x, training=training)
        regularization = reduction.scaled_regularization_loss(model.losses)
        shares = compiled_loss.compiled_loss_shares(
            model._compile_loss, y, y_pred, sample_weight, batch_size, global_batch
        )
        loss = shares.total + regularization
        shares = shares._replace(per_output=[share for _, share in shares.per_output])
        scaled_loss = model.optimizer.scale_loss(loss) if training else loss
    gradients = tape.gradient(scaled_loss, model.trainable_weights) if training else []
    return loss, shares, y_pred, gradients


def _default_compute_loss():
    from keras_ctl.ctl_model import CTLModel

    return CTLModel.compute_loss
