"""The loss trackers and compiled metrics of the default steps, updated on
each replica from its `forward.Pass` so that the logs' one reduction
(`outputs.all_reduce_logs`) gives one device's values; in the train step,
that reduction rides on the gradients' collective (`RidingLogs`)."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf
from keras import tree

from keras_ctl import _keras
from keras_ctl import outputs
from keras_ctl._engine import state as engine_state
from keras_ctl._engine.forward import Pass
from keras_ctl._replicas import SummedTogether
from keras_ctl._replicas import never_empty
from keras_ctl._replicas import num_replicas
from keras_ctl.distribute import preemption
from keras_ctl.distribute import topology


def update(model: Any, x: Any, y: Any, sample_weight: Any, step: Pass) -> Any:
    """Updates `model`'s loss trackers and compiled metrics on this replica
    from its `step`, and returns the metrics' results."""
    update_states(model, x, y, sample_weight, step)
    return _logged(model, model.get_metrics_result())


def update_states(model: Any, x: Any, y: Any, sample_weight: Any, step: Pass) -> None:
    """Updates `model`'s loss trackers and compiled metrics on this replica
    from its `step`."""
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

    def compute_metrics() -> None:
        logs = model.compute_metrics(x, y, y_pred, sample_weight)
        if isinstance(logs, dict):
            # Keras logs what `compute_metrics` returns (an override may
            # leave a metric out); noted as it is traced.
            engine.logged_metric_names = list(logs)

    def computed() -> tf.Tensor:
        compute_metrics()
        return tf.constant(True)

    if num_replicas() == 1 or never_empty(shares.local_batch_size):
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
        tf.cond(shares.local_batch_size > 0, computed, lambda: tf.constant(False))


def _logged(model: Any, results: dict[str, Any]) -> dict[str, Any]:
    """The `results` Keras logs: those `compute_metrics` returned."""
    names = engine_state.of(model).logged_metric_names
    if names is None:
        return results
    return {name: results[name] for name in names if name in results}


class RidingLogs:
    """The train step's logs, reduced in its gradients' collective.

    The metrics are updated from the step's `Pass` before its gradients
    are summed (`before_sum`, which `forward.exact_gradients` calls), so
    their state rides on that all-reduce, with the preemption notice of
    several workers: one collective a step, as `keras.Model`'s. The
    update reads the predictions and loss only, not the weights the
    optimizer then changes. A step whose per-output loss trackers need the
    global count, known only after the sum, updates after it (`logs`) and
    its logs take a collective of their own.
    """

    def __init__(self, model: Any, x: Any, y: Any, sample_weight: Any) -> None:
        self._model = model
        self._data = (x, y, sample_weight)
        self._finish: Any = None

    def before_sum(self, step: Pass) -> SummedTogether | None:
        """Updates the metrics from `step` and queues its logs; returns
        what rides on the gradients' sum, or `None` when the update must
        wait for the sum."""
        model = self._model
        compile_loss = _keras.compile_loss(model)
        if _overrides(model, "get_metrics_result") or (
            step.shares.global_batch_size is None
            and compile_loss is not None
            and _keras.per_output_loss_trackers(compile_loss)
        ):
            return None
        update_states(model, *self._data, step)
        together = SummedTogether()
        results = outputs.planned_metric_results(model.metrics, together)
        notice = None
        if topology.of(model.distribute_strategy).workers > 1:
            notice = together.add(preemption.notice_variable().read_value())

        def finish() -> dict[str, Any]:
            logs = _logged(model, results())
            if notice is not None:
                logs[preemption.NOTICE_LOG] = notice()
            return logs

        self._finish = finish
        return together

    def logs(self, step: Pass) -> Any:
        """The step's logs once its update is applied: reduced already
        (`Synchronized`) when they rode on its sum."""
        if self._finish is None:
            return update(self._model, *self._data, step)
        return {
            name: outputs.Synchronized(value) for name, value in self._finish().items()
        }


def _overrides(model: Any, name: str) -> bool:
    """Whether `model`'s class defines `name` over Keras's `Model`'s."""
    return getattr(type(model), name) is not getattr(keras.Model, name)
