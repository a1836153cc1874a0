"""What Keras keeps on layers and tensors under private names: a layer's
own losses, and the mask and logits Keras reads off a tensor."""

import tensorflow as tf

from keras_ctl._keras import names


def own_losses(layer: object) -> list[object]:
    """The losses `layer`'s last call left (`Layer._losses`)."""
    return list(names.attribute(layer, "_losses"))


def keep_keras_annotations(kept: tf.Tensor, tensor: tf.Tensor, cut) -> tf.Tensor:
    """`kept`, cut from `tensor` by `cut`, with Keras's mask and logits of
    `tensor` cut the same way.

    Keras reads a mask and a softmax's or sigmoid's logits off the tensor
    (`_keras_mask`, `_keras_logits`, no public setter); its losses also
    find the logits of a `Softmax` or `Sigmoid` op by the op's type.
    Carried over, a cross-entropy of the layer's output is computed from
    its logits, as on one device."""
    mask = names.attribute(tensor, "_keras_mask", None)
    if mask is not None:
        kept._keras_mask = cut(mask)
    logits = names.attribute(tensor, "_keras_logits", None)
    if logits is None and _activation_op(tensor):
        logits = tensor.op.inputs[0]
    if logits is not None:
        kept._keras_logits = cut(logits)
    return kept


def _activation_op(tensor):
    """Whether `tensor` is a traced `Softmax` or `Sigmoid` of one input."""
    if isinstance(tensor, tf.__internal__.EagerTensor) or not hasattr(tensor, "op"):
        return False
    return tensor.op.type in ("Softmax", "Sigmoid") and len(tensor.op.inputs) == 1
