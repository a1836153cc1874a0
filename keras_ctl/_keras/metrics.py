"""Trackers inside a `compute_loss` of the user's own."""

import keras
import tensorflow as tf

from keras_ctl._keras.state import _in_step
from keras_ctl._replicas import batch_fraction
from keras_ctl._replicas import num_replicas


def weighed_by_batch(original):
    """A `keras.metrics.Mean` given one value inside a `compute_loss` of
    the user's own weighs it by the replica's fraction of the global batch.

    One device adds one value a step (the Distiller's `student_loss`, a
    tracker of one's own). Each replica adds its own batch's value, and the
    replicas' trackers are summed: counted once per replica, a step would
    weigh R times and a replica of fewer examples as much as a full one.
    Weighed by its fraction (`read_as_batch_losses`), each step weighs 1 and
    its value is one device's: a mean over the replica's examples becomes
    the global batch's mean, and a replica without examples adds nothing.
    Values with one entry per example (`MeanMetricWrapper`s, any tensor of
    several values) and explicit weights are Keras's.

    Keras's `CompileLoss` weighs its per-output trackers by the batch's
    static size, unknown (`None`) in a traced step. The first step of a
    step of one's own under several replicas runs eagerly in place of the
    traced one (to build those trackers): there the static size is taken
    as unknown too, so the first step weighs as the others, and as one
    device's traced steps. Replaces `keras.metrics.Mean.update_state`.
    """

    def update_state(self, values, sample_weight=None):
        if _static_batch_size_of_compiled_loss(sample_weight):
            sample_weight = None
        fraction = batch_fraction()
        if (
            fraction is not None
            and sample_weight is None
            and num_replicas() > 1
            and not isinstance(self, keras.metrics.MeanMetricWrapper)
            and _one_value(values)
        ):
            sample_weight = tf.cast(fraction, self.dtype)
        return original(self, values, sample_weight=sample_weight)

    return update_state


def _static_batch_size_of_compiled_loss(sample_weight):
    """Whether `sample_weight` is the static batch size `CompileLoss` gives
    its per-output trackers, in an eager step standing for a trace."""
    return (
        isinstance(sample_weight, int)
        and getattr(_in_step, "stands_for_trace", False)
        and getattr(_in_step, "examples", None) is not None
    )


def _one_value(values):
    shape = tf.convert_to_tensor(values).shape
    return shape.is_fully_defined() and shape.num_elements() == 1
