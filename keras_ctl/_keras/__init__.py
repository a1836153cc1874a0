"""The one package that reads Keras internals (the seam).

Everything else in keras_ctl uses public Keras only, and this package
imports nothing of keras_ctl but the replica arithmetic below it
(`keras_ctl._replicas`). Each accessor says why no public hook does the
job; every change of Keras behaviour is listed in `steps.PATCHES` and
active only inside keras_ctl's own steps; `KERAS_INTERNALS` lists what the
seam reads, and a test checks that each still exists. The supported range
is declared in pyproject.toml (checked on import by `keras_ctl._compat`),
and `.ci/compat` runs the fast tests at both of its ends. When a new Keras
minor comes out, re-read the Keras code each accessor names, then widen
the range.

Modules: `access` (plain accessors), `models` (building from shapes,
pickling, registration), `optimizers`, `losses`, `layers`, `variables`
(the patched behaviours, by what they change), `state` (the replica
step's thread record, `_patch_once`), `steps` (the table of patches and
`replica_step`), `iterators` (distributed iterators opened on first use,
counting the batches they have left).

Checked on Keras 3.12.0 and 3.15.1 unless an accessor says otherwise.
"""

# Keras's functional class and the test `Model.__new__` applies to a
# constructor's arguments (no public name for either).
from keras.src.models.functional import Functional
from keras.src.models.model import functional_init_arguments

from keras_ctl._keras.access import RAN_OUT_OF_DATA
from keras_ctl._keras.access import add_metric_update
from keras_ctl._keras.access import add_to_mean
from keras_ctl._keras.access import all_layers
from keras_ctl._keras.access import compile_loss
from keras_ctl._keras.access import compile_loss_terms
from keras_ctl._keras.access import compile_metrics
from keras_ctl._keras.access import end_epoch_early
from keras_ctl._keras.access import initial_epoch
from keras_ctl._keras.access import loss_tracker
from keras_ctl._keras.access import pack_like_compile_loss
from keras_ctl._keras.access import per_output_loss_trackers
from keras_ctl._keras.access import set_initial_epoch
from keras_ctl._keras.access import user_compute_loss
from keras_ctl._keras.access import user_loss
from keras_ctl._keras.losses import LossParts
from keras_ctl._keras.losses import loss_parts
from keras_ctl._keras.models import SymbolicBuildFromFirstReplica
from keras_ctl._keras.models import build_from_spec
from keras_ctl._keras.models import reduce_as_saved_model
from keras_ctl._keras.models import register_under_name
from keras_ctl._keras.models import strategy_created_under
from keras_ctl._keras.models import without_strategy
from keras_ctl._keras.optimizers import EmaAfterStep
from keras_ctl._keras.optimizers import count_micro_batch
from keras_ctl._keras.optimizers import gradients_already_summed
from keras_ctl._keras.optimizers import keras_accumulators
from keras_ctl._keras.optimizers import micro_batch_iterations
from keras_ctl._keras.optimizers import one_update_of_accumulated_steps
from keras_ctl._keras.state import count_only_real_examples
from keras_ctl._keras.steps import PATCHES
from keras_ctl._keras.steps import replica_step
from keras_ctl._keras.steps import updated_metrics
from keras_ctl._keras.variables import gradients
from keras_ctl._keras.variables import install_sharded_reads

__all__ = [
    "EmaAfterStep",
    "Functional",
    "KERAS_INTERNALS",
    "LossParts",
    "PATCHES",
    "RAN_OUT_OF_DATA",
    "SymbolicBuildFromFirstReplica",
    "add_metric_update",
    "add_to_mean",
    "all_layers",
    "build_from_spec",
    "compile_loss",
    "compile_loss_terms",
    "compile_metrics",
    "count_micro_batch",
    "count_only_real_examples",
    "end_epoch_early",
    "functional_init_arguments",
    "gradients",
    "gradients_already_summed",
    "initial_epoch",
    "install_sharded_reads",
    "keras_accumulators",
    "loss_parts",
    "loss_tracker",
    "micro_batch_iterations",
    "one_update_of_accumulated_steps",
    "pack_like_compile_loss",
    "per_output_loss_trackers",
    "reduce_as_saved_model",
    "register_under_name",
    "replica_step",
    "set_initial_epoch",
    "strategy_created_under",
    "updated_metrics",
    "user_compute_loss",
    "user_loss",
    "without_strategy",
]

_TF_OPTIMIZER = "keras.src.backend.tensorflow.optimizer.TFOptimizer"
# Every Keras internal the seam reads or replaces, as (owner, attribute);
# `tests/unit/seam_test.py` checks each against the installed Keras.
KERAS_INTERNALS = (
    ("keras.src.losses.loss", "reduce_weighted_values"),
    ("keras.src.backend.tensorflow.nn", "_compute_moments_sync"),
    ("keras.src.backend.tensorflow.nn", "sparse_categorical_crossentropy"),
    ("keras.src.backend.tensorflow.numpy", "argmax"),
    ("keras.src.backend.tensorflow.core.Variable", "__array__"),
    ("keras.src.backend.tensorflow.core.Variable", "_serialize_to_tensors"),
    ("keras.src.backend.tensorflow.core.Variable", "_value"),
    ("keras.src.backend.tensorflow.core.Variable", "_direct_assign"),
    ("keras.src.backend.tensorflow.optimizer.TFOptimizer", "_all_reduce_sum_gradients"),
    (
        "keras.src.backend.tensorflow.optimizer.TFOptimizer",
        "_distributed_tf_update_step",
    ),
    ("keras.src.backend.tensorflow.optimizer.TFOptimizer", "_backend_update_step"),
    ("keras.src.optimizers.base_optimizer.BaseOptimizer", "_backend_apply_gradients"),
    ("keras.src.optimizers.base_optimizer.BaseOptimizer", "_clip_gradients"),
    ("keras.src.optimizers.base_optimizer.BaseOptimizer", "_apply_weight_decay"),
    ("keras.src.optimizers.base_optimizer.BaseOptimizer", "_iterations"),
    ("keras.src.optimizers.base_optimizer.BaseOptimizer", "_trainable_variables"),
    (
        "keras.src.optimizers.base_optimizer.BaseOptimizer",
        "_overwrite_model_variables_with_average_value",
    ),
    ("keras.src.layers.layer.Layer", "_flatten_layers"),
    ("keras.src.trainers.trainer.Trainer", "_symbolic_build"),
    ("keras.src.trainers.trainer.Trainer", "_compute_loss"),
    ("keras.src.trainers.trainer.Trainer", "_compile_loss"),
    ("keras.src.trainers.trainer.Trainer", "_compile_metrics"),
    ("keras.src.trainers.trainer.Trainer", "_loss_tracker"),
    ("keras.src.trainers.trainer.Trainer", "_initial_epoch"),
    ("keras.src.trainers.trainer.Trainer", "_distribute_strategy"),
    ("keras.src.trainers.compile_utils.CompileLoss", "_user_loss"),
    ("keras.src.trainers.compile_utils.CompileLoss", "_flat_losses"),
    ("keras.src.trainers.compile_utils.CompileLoss", "_y_true_build_structure"),
    ("keras.src.trainers.compile_utils.CompileLoss", "_y_pred_build_structure"),
    ("keras.src.backend.tensorflow.trainer.TensorFlowTrainer", "_maybe_symbolic_build"),
    ("keras.src.backend.tensorflow.trainer.TFEpochIterator", "_distributed_dataset"),
    ("keras.src.models.model", "functional_init_arguments"),
    ("keras.src.models.functional", "Functional"),
    ("keras.src.saving.keras_saveable", "KerasSaveable"),
    # TensorFlow's (2.21), read by `iterators.next_batch`.
    (
        "tensorflow.python.distribute.input_lib.DistributedIteratorBase",
        "_get_next_no_partial_batch_handling",
    ),
)
