"""When a train or test function measures its step (`loss_mean`).

A step's reading is measured before the step runs on the batch of:

    step 1, 2, 4, 8, ... of the function's run   # the k-th measurement at
                                                 # step 2^(k-1): ten in a
                                                 # thousand steps
    the first step of every `fit()` and `evaluate()` call
    the first batch of a batch spec not measured before (a new trace)

so a loss that stops being a mean as the run goes (a term switched on
after a warm-up, padding first met in a later batch) stops the run by
name within twice the steps it trained. A measurement that finds the step
cannot be measured (it draws TensorFlow's own random numbers) ends the
schedule. With `steps_per_execution`, a call that runs a step due is
measured on its first batch.
"""

from __future__ import annotations

from typing import Any

from keras_ctl._engine.state import EngineState


class MeasurementSchedule:
    """Which of a function's calls are measured.

    Args:
        engine: The model's `EngineState`, whose `calls` count the
            `fit()` and `evaluate()` calls.
    """

    def __init__(self, engine: EngineState) -> None:
        self._engine = engine
        self._steps_run = 0
        self._next = 1
        self._call: int | None = None
        self._specs: list[Any] = []
        self._ended = False

    def due(self, spec: Any) -> int | None:
        """The number of the call's first step (from 1) when the call is
        measured, else `None`; `spec` is its batches' element spec."""
        if self._ended:
            return None
        number = self._steps_run + 1
        if (
            number >= self._next
            or self._engine.calls != self._call
            or not any(spec == measured for measured in self._specs)
        ):
            return number
        return None

    def measured(self, number: int, spec: Any, again: bool) -> None:
        """Notes the measurement of step `number`; `again`: whether later
        steps are measured."""
        self._call = self._engine.calls
        if not any(spec == measured for measured in self._specs):
            self._specs.append(spec)
        while self._next <= number:
            self._next *= 2
        self._ended = not again

    def ran(self, steps: int) -> None:
        """Counts the `steps` a call ran (at most)."""
        self._steps_run += steps
