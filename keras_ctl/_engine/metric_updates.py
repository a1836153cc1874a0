"""The loss trackers and compiled metrics of the default steps, updated on
each replica from its `forward.Pass` so that the logs' one reduction
(`outputs.all_reduce_logs`) gives one device's values."""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from keras import tree

from keras_ctl import _keras
from keras_ctl._engine import state as engine_state
from keras_ctl._engine.forward import Pass
from keras_ctl._replicas import num_replicas
from keras_ctl.distribute import topology


def update(model: Any, x: Any, y: Any, sample_weight: Any, step: Pass) -> Any:
    """Updates `model`'s loss trackers and compiled metrics on this replica
    from its `step`, and returns the metrics' results."""
    y_pred, shares = step.y_pred, step.shares
    # The loss tracker averages over examples like one device: each replica
    # adds its part of the global batch's loss sum, and its own count.
    _keras.add_to_mean(
        _keras.loss_tracker(model), step.loss_sum, shares.local_batch_size
    )
    compile_loss = _keras.compile_loss(model)
    if compile_loss is not None:
        # Keras 3.15 weighs per-output losses by the static batch size,
        # unknown in a traced step: one weight per step, 1/R per replica.
        per_replica = 1.0 / num_replicas()
        trackers = _keras.per_output_loss_trackers(compile_loss)
        for tracker, share in zip(trackers, shares.per_output):
            _keras.add_to_mean(tracker, share, per_replica)
    engine = engine_state.of(model)

    def compute_metrics() -> tf.Tensor:
        logs = model.compute_metrics(x, y, y_pred, sample_weight)
        if isinstance(logs, dict):
            # Keras logs what `compute_metrics` returns (an override may
            # leave a metric out); noted as it is traced.
            engine.logged_metric_names = list(logs)
        return tf.constant(True)

    if num_replicas() == 1:
        compute_metrics()
    elif topology.of(model.distribute_strategy).one_copy:
        # A padded replica updates with no example (a `tf.cond` cannot hold
        # the `merge_call` of these variables' updates).
        real = tf.cast(shares.local_batch_size, tf.int32)
        x, y, y_pred, sample_weight = tree.map_structure(
            lambda t: None if t is None else t[:real], (x, y, y_pred, sample_weight)
        )
        compile_metrics = _keras.compile_metrics(model)
        if compile_metrics is not None:
            _keras.add_metric_update(compile_metrics, y, y_pred, sample_weight)
    else:
        # A replica padded with a placeholder example skips the update.
        tf.cond(
            shares.local_batch_size > 0, compute_metrics, lambda: tf.constant(False)
        )
    results = model.get_metrics_result()
    names = engine.logged_metric_names
    if names is None:
        return results
    return {name: results[name] for name in names if name in results}
