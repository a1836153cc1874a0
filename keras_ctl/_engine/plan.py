"""`StepPlan`: the decisions a step function is built with, made once."""

from __future__ import annotations

import dataclasses

import keras

XLA_MODES = ("off", "whole_step", "per_replica_pass")


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """How the train or test function of a `CTLModel` runs its steps.

    Attributes:
        steps_per_execution: Steps per call of the function (>= 1).
        run_eagerly: Run the steps as Python, without `tf.function`.
        xla: `"off"`; `"whole_step"`: one replica, so XLA compiles the whole
            step, collectives and optimizer included; or `"per_replica_pass"`:
            several replicas, so XLA compiles each replica's forward and
            backward pass and the collectives stay outside it (XLA cannot
            place a multi-device `strategy.run`).
    """

    steps_per_execution: int = 1
    run_eagerly: bool = False
    xla: str = "off"

    def __post_init__(self) -> None:
        if self.steps_per_execution < 1:
            raise ValueError(
                "Expected `steps_per_execution` >= 1. Received: "
                f"steps_per_execution={self.steps_per_execution}."
            )
        if self.xla not in XLA_MODES:
            raise ValueError(
                f"Expected `xla` in {XLA_MODES}. Received: xla={self.xla!r}."
            )
        if self.run_eagerly and self.xla != "off":
            raise ValueError(
                "`run_eagerly=True` runs steps as Python, which XLA cannot "
                f"compile. Received: xla={self.xla!r} with run_eagerly=True."
            )

    @classmethod
    def for_model(cls, model: keras.Model, default_loss: bool) -> StepPlan:
        """The plan for `model`'s compile options.

        Args:
            model: A compiled `CTLModel`.
            default_loss: Whether the model's loss is the compiled one (no
                `compute_loss` override): only that loss can be compiled per
                replica, because its collectives are known.
        """
        replicas = model.distribute_strategy.num_replicas_in_sync
        xla = "off"
        if model.jit_compile and not model.run_eagerly:
            if replicas == 1:
                xla = "whole_step"
            elif default_loss:
                xla = "per_replica_pass"
        return cls(
            steps_per_execution=int(model.steps_per_execution),
            run_eagerly=bool(model.run_eagerly),
            xla=xla,
        )
