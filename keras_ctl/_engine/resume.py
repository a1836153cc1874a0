"""Where a restarted `fit()` picks up a killed run's epoch: the batches to
skip (`ResumePlan`) and the metrics' state (`MetricStates`)."""

from collections.abc import Iterable
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_ctl import _keras
from keras_ctl._replicas import assign_whole


class ResumePlan:
    """Skips the batches a killed run trained on in the epoch it was killed in.

    `keras_ctl.callbacks.BackupAndRestore` sets one on the model when it
    restores a mid-epoch backup; the train function consults it before each
    call until the resumed epoch is over. Keras still calls the train
    function once per batch of the whole epoch, so the calls past the data
    end the epoch *before* a step runs: a step that ran out of data half-way
    could already have advanced stateful ops such as random generators.

    Args:
        batches_done: Batches of the epoch the killed run trained on.
        steps_per_epoch: Batches in an epoch, or `None` when unknown (then
            the data ends the epoch).
    """

    def __init__(self, batches_done: int, steps_per_epoch: int | None) -> None:
        self.batches_done = batches_done
        self._skip = batches_done
        self._left = None if steps_per_epoch is None else steps_per_epoch - batches_done
        self.finished = False

    def before_call(self, iterator: Iterator[Any], steps_per_call: int) -> None:
        """Skips the trained batches (first call); ends the epoch when done.

        Raises:
            StopIteration: when the epoch has no batch left (through
                `_keras.end_epoch_early`).
        """
        for _ in range(self._skip):
            next(iterator)
        self._skip = 0
        if self._left is None:
            self.finished = True
            return
        if self._left <= 0:
            self.finished = True
            _keras.end_epoch_early()
        self._left -= steps_per_call


class MetricStates:
    """The metrics' state at a backup's position, carried into the resumed
    epoch, so that it logs what the uninterrupted epoch logs.

    Keras resets the metrics when an epoch begins; a resumed epoch would
    then average only the batches trained after the restart. The state is
    read across replicas and workers (the value a log shows) and written
    back whole into the first replica of the chief, zeros elsewhere (for a
    summed variable), so it can be restored on any topology.

    A metric not yet built when the resumed epoch begins (Keras builds the
    compiled metrics of a model created without a strategy when the step
    is traced) gets its state added after the epoch's first batch, as
    Keras's metrics keep sums of per-batch statistics.

    Args:
        saved: `{metric name: [variable values]}`, as `read` returns it.
    """

    def __init__(self, saved: dict[str, list[Any]]) -> None:
        self._saved = saved
        self._pending: dict[str, list[Any]] = {}

    @staticmethod
    def read(metrics: Iterable[keras.metrics.Metric]) -> dict[str, list[Any]]:
        """`{metric name: [variable values as lists]}` of built `metrics`.

        Under several workers every worker must call it, in the same order:
        a summed variable is read through a collective."""
        return {
            metric.name: [np.asarray(v.numpy()).tolist() for v in metric.variables]
            for metric in metrics
            if metric.variables
        }

    def restore(
        self, metrics: Iterable[keras.metrics.Metric], strategy: tf.distribute.Strategy
    ) -> None:
        """Writes the saved state into the built `metrics`; keeps the rest
        (a metric not built, or not yet listed) for `add_to_first_batch`."""
        self._pending = dict(self._saved)
        for metric in metrics:
            values = self._saved.get(metric.name)
            if values is not None and len(metric.variables) == len(values):
                for variable, value in zip(metric.variables, values):
                    assign_whole(variable.value, value, strategy)
                del self._pending[metric.name]

    def add_to_first_batch(
        self, metrics: Iterable[keras.metrics.Metric], strategy: tf.distribute.Strategy
    ) -> bool:
        """Adds the saved state of the metrics built by the first step;
        returns whether any was."""
        added = False
        for metric in metrics:
            values = self._pending.pop(metric.name, None)
            if values is not None and len(metric.variables) == len(values):
                for variable, value in zip(metric.variables, values):
                    assign_whole(variable.value, value, strategy, add=True)
                added = True
        self._pending.clear()
        return added
