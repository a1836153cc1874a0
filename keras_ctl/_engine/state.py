"""`EngineState`: what the step engine keeps for one model between calls."""

import dataclasses


@dataclasses.dataclass
class EngineState:
    """The engine's state for one model, in one place.

    `CTLModel` holds one (`CTLModel._engine`); the step functions and
    `keras_ctl.callbacks.BackupAndRestore` read and write it there, and
    nowhere else.

    Attributes:
        accumulation: The train step's gradient accumulation
            (`accumulation.for_model`), or `None`.
        resume_plan: The batches of a resumed epoch to skip (`ResumePlan`),
            set when a mid-epoch backup is restored and cleared when that
            epoch is over, or `None`.
        epochs_to_replay: Epochs of data a resumed run opens and drops
            before its first epoch (`_keras.replay_epochs`), set when a
            backup is restored: the epochs trained before it; `None` when
            not resuming.
        train_pass: Each replica's XLA-compiled training pass
            (`forward.CompiledPass`), when the step plan uses one.
        test_pass: The same for evaluation.
    """

    accumulation: object = None
    resume_plan: object = None
    epochs_to_replay: object = None
    train_pass: object = None
    test_pass: object = None
