"""`EngineState`: what the step engine keeps for one model between calls."""

from __future__ import annotations

import dataclasses
import weakref
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from keras_ctl._engine.accumulation import GradientAccumulation
    from keras_ctl._engine.forward import CompiledPass
    from keras_ctl._engine.resume import ResumePlan


# The key of a `compute_loss` of one's own in `EngineState.loss_readings`.
COMPUTE_LOSS = "compute_loss"


@dataclasses.dataclass
class EngineState:
    """The engine's state for one model, in one place.

    The engine keeps it beside the model (`of(model)`), not in it: the step
    functions, `CTLModel` and `keras_ctl.callbacks.BackupAndRestore` read
    and write it there, and nothing of it is saved with the model.

    Attributes:
        gradient_accumulation: `compile(gradient_accumulation=...)`:
            `"micro_batches"` or `"examples"`.
        compute_loss_over: `compile(compute_loss_over=...)`: `None`,
            `"replica_batch"` or `"global_batch"`.
        random_draws: `compile(random_draws=...)`: `None`,
            `"as_one_device"` or `"per_replica"` (`random_draws.MODES`).
        random_draws_warned: Whether the model's per-replica draws under
            XLA were warned of since it was compiled.
        batch_statistics: `compile(batch_statistics=...)`: `None`,
            `"global"` or `"per_replica"` (`batch_statistics.MODES`).
        batch_statistics_warned: Whether the model's per-replica batch
            statistics were warned of since it was compiled.
        accumulation: The train step's gradient accumulation
            (`accumulation.for_model`), or `None`.
        resume_plan: The batches of a resumed epoch to skip, set when a
            mid-epoch backup is restored and cleared when that epoch is
            over, or `None`.
        epochs_to_replay: Epochs of data a resumed run opens and drops
            before its first epoch (`_keras.replay_epochs`), set when a
            backup is restored: the epochs trained before it; `None` when
            not resuming.
        train_pass: Each replica's XLA-compiled training pass, when the
            step plan uses one.
        test_pass: The same for evaluation.
        predicted_batches: The batches the predict function ran in the
            current `predict()`.
        logged_metric_names: The keys a `compute_metrics` of the model's
            own returned, noted as the step is traced (Keras logs those),
            or `None`.
        calls: The model's `fit()` and `evaluate()` calls so far (a
            validation within `fit()` is not one): a step function
            measures its step at each call's first step
            (`measurement_schedule`).
        loss_readings: How each compiled loss of the user's own (by its
            id) is read when it returns one value for the batch, as
            measured on the first batch measured
            (`loss_mean.read_compiled_losses`):
            `"mean"` or `"share"`; under `COMPUTE_LOSS`, how a
            `compute_loss` of one's own is read, as first measured
            (`loss_mean.refuse_unless_mean`).
    """

    gradient_accumulation: str = "micro_batches"
    compute_loss_over: str | None = None
    random_draws: str | None = None
    random_draws_warned: bool = False
    batch_statistics: str | None = None
    batch_statistics_warned: bool = False
    accumulation: GradientAccumulation | None = None
    resume_plan: ResumePlan | None = None
    epochs_to_replay: int | None = None
    train_pass: CompiledPass | None = None
    test_pass: CompiledPass | None = None
    logged_metric_names: list[str] | None = None
    calls: int = 0
    loss_readings: dict[int | str, str] = dataclasses.field(default_factory=dict)
    predicted_batches: int = 0


_STATES: weakref.WeakKeyDictionary[Any, EngineState] = weakref.WeakKeyDictionary()


def of(model: Any) -> EngineState:
    """`model`'s engine state: a CTLModel's own (`attach`), or, for any
    other model, a new empty one (what no keras_ctl step uses)."""
    return _STATES.get(model) or EngineState()


def kept_for(model: Any) -> bool:
    """Whether `model` has an engine state of its own (a CTLModel)."""
    return model in _STATES


def attach(model: Any) -> EngineState:
    """`model`'s engine state, made on first use: it lives as long as the
    model does."""
    return _STATES.setdefault(model, EngineState())
