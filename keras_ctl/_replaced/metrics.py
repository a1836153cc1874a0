"""Metrics inside a step: trackers in code of the user's own (the
behaviour of the seam's `Mean.update_state` row), which logged values are
metric results, and which metrics a step updated."""

import contextlib
import threading
from typing import Any

import keras
import tensorflow as tf

from keras_ctl._example_dependence import mark_follows
from keras_ctl._keras.behaviours import registered
from keras_ctl._keras.state import in_step
from keras_ctl._replicas import batch_fraction
from keras_ctl._replicas import current_reading
from keras_ctl._replicas import never_empty
from keras_ctl._replicas import num_replicas


@registered
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
    In a `compute_loss` read in shares (measured a sum over examples), the
    value is the replica's share of the step's: it adds its value over its
    fraction, weighed by its fraction, so the replicas add one device's
    value. Values with one entry per example (`MeanMetricWrapper`s, any
    tensor of several values) and explicit weights are Keras's.

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
        fraction, in_shares = batch_fraction(), False
        if fraction is None:
            fraction, in_shares = _share_of_one_value()
        if (
            fraction is not None
            and sample_weight is None
            and num_replicas() > 1
            and not isinstance(self, keras.metrics.MeanMetricWrapper)
            and _one_value(values)
        ):
            sample_weight = tf.cast(fraction, self.dtype)
            values = tf.cast(values, self.dtype)
            if in_shares:
                # The replicas' values sum to the step's: each adds its
                # value over its weight, the weights summing to 1.
                values = tf.math.divide_no_nan(values, sample_weight)
            # A replica without examples adds nothing, not its 0/0's NaN.
            if not never_empty(sample_weight):
                values = tf.where(sample_weight > 0, values, tf.zeros_like(values))
        return original(self, values, sample_weight=sample_weight)

    return update_state


def _share_of_one_value():
    """`(fraction, True)` inside a `compute_loss` of one's own read in
    shares, as measured (a sum over examples): a tracker's one value is
    the replica's share of the step's. Else `(None, False)`."""
    reading = current_reading()
    if reading is None or not reading.in_shares or reading.kind != "compute_loss":
        return None, False
    return reading.fraction, True


def _static_batch_size_of_compiled_loss(sample_weight):
    """Whether `sample_weight` is the static batch size `CompileLoss` gives
    its per-output trackers, in an eager step standing for a trace."""
    return (
        isinstance(sample_weight, int)
        and getattr(in_step, "stands_for_trace", False)
        and getattr(in_step, "examples", None) is not None
    )


def _one_value(values):
    shape = tf.convert_to_tensor(values).shape
    return shape.is_fully_defined() and shape.num_elements() == 1


_noting = threading.Lock()
# id(metric) -> [metric, replica steps using its wrapper], while steps run.
_wrapped: dict[int, list[Any]] = {}


@contextlib.contextmanager
def results_noted(metrics):
    """Within it (this replica step's thread), each of `metrics` notes the
    tensors its `result()` returns; yields `{id(tensor): (tensor, metric,
    key)}`, `key` naming the entry of a result that is a dict (else
    `None`).

    A step of one's own may log a metric's result under any key
    (`{"p_acc": self.probe.result()}`): so the logs recognize it by what it
    is, and reduce it from the metric's state summed across replicas. Read
    inside the step, a result is the replica's own state, so it follows
    the replica's examples (`_example_dependence.mark_follows`): a weight
    assigned from it (keras.io's Forward-Forward adds each layer's loss
    tracker's result to a variable) is a batch statistic. The
    wrapper is an attribute of each metric instance, there while any
    replica step uses it (replica threads share the metrics; each metric
    counts its users, so steps of other models in other threads neither
    miss it nor remove it early), never of a Keras class.
    """
    mine = []
    with _noting:
        for metric in metrics:
            entry = _wrapped.get(id(metric))
            if entry is None:
                if "result" in vars(metric):
                    continue  # an instance attribute of the user's own
                object.__setattr__(metric, "result", _noting_result(metric))
                entry = _wrapped[id(metric)] = [metric, 0]
            entry[1] += 1
            mine.append(entry)
    results: dict[int, tuple[Any, keras.metrics.Metric, str | None]] = {}
    previous = getattr(in_step, "results", None)
    in_step.results = results
    try:
        yield results
    finally:
        in_step.results = previous
        with _noting:
            for entry in mine:
                entry[1] -= 1
                if entry[1] == 0:
                    object.__delattr__(entry[0], "result")
                    del _wrapped[id(entry[0])]


def _noting_result(metric):
    own = type(metric).result

    def result():
        value = own(metric)
        results = getattr(in_step, "results", None)
        if results is None:
            return value
        if isinstance(value, dict):
            for key, item in value.items():
                results[id(item)] = (item, metric, key)
                mark_follows(item, _described(metric))
        else:
            results[id(value)] = (value, metric, None)
            mark_follows(value, _described(metric))
        return value

    return result


def _described(metric: Any) -> str:
    """A metric as messages name it: its class and name."""
    return f"the result of {type(metric).__name__} `{metric.name}`"


def metric_results_among(outputs: Any, noted: Any = None) -> dict[str, Any]:
    """`{key: (metric, entry)}` for the top-level values of `outputs` (a
    dict) that are metric results noted by `results_noted` (by default,
    those this replica step's thread notes)."""
    if noted is None:
        noted = getattr(in_step, "results", None) or {}
    if not isinstance(outputs, dict):
        return {}
    found = {}
    for key, value in outputs.items():
        known = noted.get(id(value))
        if known is not None and known[0] is value:
            found[key] = known[1:]
    return found


def updated_metrics(metrics: list[Any], written: set[int]) -> list[Any]:
    """The `metrics` any of whose variables a step assigned (`written`)."""
    return [m for m in metrics if any(id(v) in written for v in m.variables)]
