"""Gradient accumulation under any strategy, one all-reduce per update.

Keras's `gradient_accumulation_steps=k` adds each step's gradient to an
accumulator and updates the variables every k-th step, in a `tf.cond`
inside `optimizer.apply`: a cross-replica update inside a replica step's
control flow, which fails under a strategy. Here the choice between
"accumulate" and "update" is made outside the replicas, per step:

    if (steps seen + 1) % k:   accumulate on every replica:
                                   each adds its part of the step's
                                   gradient to its own accumulator
                               steps seen += 1
    else:                      update on every replica:
                                   all-reduce (accumulator + this step's
                                   part): the update's one gradient
                                   collective; the optimizer applies it
                                   as one step; accumulators reset

The accumulators are per replica (`ON_READ` variables): no gradient crosses
replicas until the update (each step still all-reduces its number of
examples, which its loss is divided by).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from keras_ctl import _keras
from keras_ctl._engine import state as engine_state
from keras_ctl._engine import update
from keras_ctl._replicas import Gradient
from keras_ctl._replicas import assign_whole
from keras_ctl._replicas import sum_across_replicas
from keras_ctl.distribute import topology

# What a model's `optimizers_and_variables()` returns.
OptimizerPairs = Sequence[tuple[Any, Iterable[Any]]]

MODES = ("micro_batches", "examples")


def for_model(
    model: keras.Model, optimizers: OptimizerPairs, default_step: bool
) -> GradientAccumulation | None:
    """The `GradientAccumulation` of `model`'s train step, or `None` when
    no optimizer accumulates or Keras's own accumulation is exact (one
    device, `"micro_batches"`). `optimizers`: the model's
    `optimizers_and_variables()`.

    Raises:
        ValueError: when neither can run: under several replicas (or with
            `"examples"`) only the default step with one optimizer without
            EMA or loss scaling accumulates, with per-replica accumulators
            (which `CentralStorageStrategy` would share).
    """
    strategy = model.distribute_strategy
    replicas = strategy.num_replicas_in_sync
    mode = engine_state.of(model).gradient_accumulation
    pairs = [(o, list(v)) for o, v in optimizers if o]
    accumulating = [(o, v) for o, v in pairs if _steps(o)]
    if not accumulating or (replicas == 1 and mode == "micro_batches"):
        return None
    optimizer, variables = accumulating[0]
    problem = None
    if not default_step:
        problem = "a `train_step` of its own"
    elif len(pairs) > 1:
        problem = f"{len(pairs)} optimizers"
    elif type(optimizer).__name__ in ("LossScaleOptimizer", "MultiOptimizer"):
        problem = f"a {type(optimizer).__name__}"
    elif optimizer.use_ema:
        problem = "`use_ema=True`"
    elif topology.of(strategy).one_copy:
        problem = type(strategy).__name__
    elif not variables:
        problem = "no trainable weights yet (build the model before `fit()`)"
    if problem:
        raise ValueError(
            f"`gradient_accumulation_steps` under {replicas} replica(s) needs "
            "CTLModel's own `train_step`, one optimizer without EMA or loss "
            "scaling, and variables on every replica (not CentralStorage"
            f"Strategy). Received: gradient_accumulation_steps={_steps(optimizer)} "
            f"with {problem}, gradient_accumulation={mode!r}. Train on a "
            f"global batch {_steps(optimizer)} times larger instead (the same "
            "mean gradient per update), or on one device."
        )
    with strategy.scope():
        return GradientAccumulation(optimizer, variables, mode)


def _steps(optimizer: keras.optimizers.Optimizer) -> int | None:
    inner = getattr(optimizer, "inner_optimizer", None)  # LossScaleOptimizer
    return getattr(optimizer, "gradient_accumulation_steps", None) or (
        inner is not None and _steps(inner)
    )


class GradientAccumulation:
    """The accumulators of `optimizer` (one per variable) and the phase
    being traced.

    Args:
        optimizer: A Keras optimizer with `gradient_accumulation_steps`.
        variables: The variables it updates.
        mode: One of `MODES` (checked by `CTLModel.compile`):
            `"micro_batches"`, Keras's semantics, the mean of the k steps'
            mean gradients; `"examples"`, the mean gradient over every
            example of the k steps (differs when their batch sizes differ).
    """

    def __init__(
        self,
        optimizer: keras.optimizers.Optimizer,
        variables: Iterable[keras.Variable],
        mode: str = "micro_batches",
    ) -> None:
        self.optimizer = optimizer
        self.steps = int(optimizer.gradient_accumulation_steps)
        self.mode = mode
        self.variables = list(variables)
        self.sums = [_local_zeros(v.shape, v.dtype) for v in self.variables]
        self.examples = _local_zeros((), tf.float32)
        self.strategy = tf.distribute.get_strategy()  # built in its scope
        # "accumulate" or "update", while tracing.
        self.phase: str | None = None

    def run(self, run_step: Callable[[], Any]) -> Any:
        """The step: `run_step()` (the replicas' step) traced once per
        phase, one of them run (cross-replica context)."""
        iterations = _keras.micro_batch_iterations(self.optimizer)
        due = tf.equal((iterations + 1) % self.steps, 0)
        return tf.cond(
            due,
            lambda: self._traced("update", run_step),
            lambda: self._traced("accumulate", run_step),
        )

    def _traced(self, phase: str, run_step: Callable[[], Any]) -> Any:
        self.phase = phase
        try:
            if phase == "accumulate":
                outputs = run_step()
                with tf.control_dependencies(tf.nest.flatten(outputs)):
                    _keras.count_micro_batch(self.optimizer)
                return outputs
            with _keras.one_update_of_accumulated_steps(self.optimizer):
                return run_step()
        finally:
            self.phase = None

    def apply(
        self,
        gradients: Sequence[Gradient | None],
        global_batch_size: tf.Tensor,
        local_batch_size: tf.Tensor,
    ) -> None:
        """In a replica step: adds this replica's gradient (its share of the
        step's mean gradient) to its accumulator, or, in the update step,
        sums everything across replicas and applies it."""
        if self.mode == "examples":
            # Back to a sum over examples: the division comes at the update.
            gradients = [
                None if g is None else g * tf.cast(global_batch_size, g.dtype)
                for g in gradients
            ]
        totals = [
            None if g is None else total + g for g, total in zip(gradients, self.sums)
        ]
        examples = self.examples + tf.cast(local_batch_size, tf.float32)
        if self.phase == "accumulate":
            for total, variable_sum in zip(totals, self.sums):
                if total is not None:
                    variable_sum.assign(total)
            self.examples.assign(examples)
            return
        # After the count's collective: one order on every replica.
        with tf.control_dependencies([global_batch_size]):
            summed, (all_examples,) = sum_across_replicas(totals, [examples])
        divisor = all_examples if self.mode == "examples" else self.steps
        with tf.control_dependencies([g for g in summed if g is not None]):
            for variable_sum in [*self.sums, self.examples]:
                variable_sum.assign(tf.zeros_like(variable_sum))
        update.apply_summed(
            self.optimizer, update.divide(summed, divisor), self.variables
        )

    def save_into_optimizer(self) -> float:
        """Before a backup (cross-replica context): the replicas' summed
        accumulators into Keras's own (`_accumulated_gradients`, saved with
        the optimizer, where Keras's one-device accumulation keeps the same
        sum in `"micro_batches"` mode). Returns the examples accumulated so
        far, which the backup's metadata keeps."""
        for kept, own in zip(_keras.keras_accumulators(self.optimizer), self.sums):
            kept.assign(own.read_value())
        return float(self.examples.read_value())

    def load_from_optimizer(self, examples: float) -> None:
        """After a backup loaded: the accumulators again, whole on one
        replica (their sum is what counts; split evenly, it rounds)."""
        for kept, own in zip(_keras.keras_accumulators(self.optimizer), self.sums):
            assign_whole(own, kept.value, self.strategy)
        assign_whole(self.examples, float(examples), self.strategy)


def _local_zeros(
    shape: tf.TensorShape | Sequence[int], dtype: tf.DType | str
) -> tf.Variable:
    """A variable each replica keeps for itself (read across replicas, it
    is the sum of every replica's)."""
    return tf.Variable(
        tf.zeros(shape, dtype),
        trainable=False,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.SUM,
    )
