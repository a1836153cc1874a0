"""Layers inside a replica step: synchronized BatchNorm's moments without
the placeholder example, layers of a replica without examples, and each
replica's own layer losses (the behaviours of the seam's layer rows)."""

import tensorflow as tf
from keras import tree

from keras_ctl._keras import layers as keras_layers
from keras_ctl._keras.behaviours import registered
from keras_ctl._keras.state import in_step
from keras_ctl._keras.state import without_placeholder
from keras_ctl._replicas import num_replicas
from keras_ctl._replicas import sum_read_as_one_device
from keras_ctl._replicas import with_placeholder_rows


@registered
def exact_sync_moments(original):
    """`BatchNormalization(synchronized=True)` counts only real examples,
    in one collective.

    Keras's `_compute_moments_sync` (TensorFlow backend) all-reduces each
    replica's sum, sum of squares and count, in three collectives, counting
    every row of the batch: a replica's placeholder example (see
    `count_only_real_examples`) would enter the moments. Here the
    placeholder is left out and the three sums travel in one all-reduce,
    whose gradient is one device's in a step of one's own too
    (`sum_read_as_one_device`). Checked on Keras 3.12.0 and 3.15.1.
    """

    def compute_moments_sync(x, axes, keepdims):
        if (
            not getattr(in_step, "active", False)
            or tf.distribute.get_replica_context() is None
        ):
            return original(x, axes, keepdims)
        if 0 in axes:
            x = without_placeholder(x)
        local_sum = tf.reduce_sum(x, axis=axes, keepdims=True)
        local_squares = tf.reduce_sum(tf.square(x), axis=axes, keepdims=True)
        local_count = tf.reduce_sum(tf.ones_like(x), axis=axes, keepdims=True)
        total, squares, count = tf.unstack(
            sum_read_as_one_device(tf.stack([local_sum, local_squares, local_count]))
        )
        mean = tf.math.divide_no_nan(total, count)
        variance = tf.maximum(
            tf.math.divide_no_nan(squares, count) - tf.square(mean), 0.0
        )
        if not keepdims:
            mean = tf.squeeze(mean, axes)
            variance = tf.squeeze(variance, axes)
        return mean, variance

    return compute_moments_sync


@registered
def moments_over_global_batch(original):
    """With `compile(batch_statistics="global")`, moments over the examples'
    axis in a training step under several replicas are the global
    batch's: every `BatchNormalization` computes them as
    `synchronized=True` does (`exact_sync_moments`), its moving statistics
    with them. Moments over other axes (a layer's own normalization) are
    left alone. Replaces the TensorFlow backend's `nn.moments`, which
    `keras.ops.moments` calls (checked on Keras 3.15.1).
    """

    def moments(x, axes, keepdims=False, synchronized=False):
        rank = x.shape.rank
        if (
            getattr(in_step, "batch_statistics", None) == "global"
            and num_replicas() > 1
            and rank
            and 0 in [axis % rank for axis in axes]
        ):
            synchronized = True
        return original(x, axes, keepdims, synchronized)

    return moments


@registered
def layers_of_empty_batches(original):
    """A layer called by a step of one's own on a replica without examples
    computes on one placeholder example of zeros, whose row it drops from
    its outputs: the caller gets the empty batch's outputs.

    The last global batch can leave a replica without examples, and a step
    of one's own gets that empty batch as it is. Many kernels fail on it or
    give it a wrong shape: TensorFlow's oneDNN CPU convolutions (wrong
    output channels, a failing gradient), `tf.pad(mode="REFLECT")`, Keras's
    LSTM cell (an `ops.add` taken for a bias). Only the outermost layer
    call pads (layers inside it see the placeholder); synchronized
    BatchNorm leaves the placeholder out (`real_examples`), and losses,
    metrics and gradients computed from the outputs see no example.
    The default steps pad their data themselves and are left alone.
    Replaces `Layer.__call__` (checked on Keras 3.12.0 and 3.15.1).
    """

    def call(self, *args, **kwargs):
        if not getattr(in_step, "active", False) or num_replicas() == 1:
            return original(self, *args, **kwargs)
        if getattr(in_step, "real_examples", None) is not None:
            outputs = original(self, *args, **kwargs)
        else:
            outputs = _on_a_placeholder_if_empty(original, self, args, kwargs)
        note_own_losses(self)
        return outputs

    return call


def _on_a_placeholder_if_empty(original, layer, args, kwargs):
    """`original(layer, *args, **kwargs)`, on a placeholder example when the
    batch is empty, without the placeholder's rows."""
    leaves = [t for t in tree.flatten((args, kwargs)) if _may_be_empty(t)]
    if not leaves:
        return original(layer, *args, **kwargs)
    rows = tf.shape(leaves[0])[0]
    missing = tf.cast(tf.equal(rows, 0), tf.int32)
    padded = {id(t): with_placeholder_rows(t, missing) for t in leaves}
    args, kwargs = tree.map_structure(lambda t: padded.get(id(t), t), (args, kwargs))
    # The padded batch's static size: `None`, or 1 where TensorFlow knows
    # the batch was empty (run eagerly, or a static 0).
    size = padded[id(leaves[0])].shape[0]
    in_step.real_examples = rows
    try:
        outputs = original(layer, *args, **kwargs)
    finally:
        in_step.real_examples = None
    return tree.map_structure(lambda t: _without_rows(t, missing, size), outputs)


@registered
def own_losses_of_this_replica(original):
    """A layer's own losses (`add_loss`, activity regularizers), read in a
    replica step under several replicas, are those its last call in this
    replica's thread left.

    Replica threads share the layers, and Keras keeps a layer's losses in
    one list (`Layer._losses`), emptied when a model's call begins: when a
    replica waits on a collective (a `Loss` object's global count, a
    synchronized BatchNorm), another replica's forward pass replaces them,
    and `model.losses` read after that is the other replica's. Each
    layer's list is noted at the end of each of its calls in this thread
    (`note_own_losses`). Replaces `Layer._get_own_losses` (checked on Keras
    3.12.0, 3.15.1 and 3.16).
    """

    def _get_own_losses(self):
        noted = getattr(in_step, "own_losses", None)
        if noted is None or id(self) not in noted:
            return original(self)
        return list(noted[id(self)])

    return _get_own_losses


def note_own_losses(layer):
    """Notes `layer`'s own losses as its call in this replica step left them."""
    noted = getattr(in_step, "own_losses", None)
    if noted is None:
        noted = in_step.own_losses = {}
    noted[id(layer)] = keras_layers.own_losses(layer)


def _may_be_empty(value):
    """A tensor whose leading (batch) dimension may be 0: unknown in a
    trace, 0 when run eagerly (a GAN's first step)."""
    return tf.is_tensor(value) and value.shape.rank and value.shape[0] in (None, 0)


def _without_rows(tensor, missing, size):
    """`tensor` without the placeholder's row, when its leading dimension is
    the padded batch's (`size`: its static size, or `None`), with Keras's
    mask and logits of it likewise."""
    if not (tf.is_tensor(tensor) and tensor.shape.rank):
        return tensor
    if tensor.shape[0] is not None and tensor.shape[0] != size:
        return tensor

    def cut(rows):
        return rows[: tf.shape(rows)[0] - missing]

    return keras_layers.keep_keras_annotations(cut(tensor), tensor, cut)
