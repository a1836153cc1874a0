"""Every change of Keras behaviour, in one table, and the replica step that
switches them on.

Each replacement does what Keras does unless the thread runs a replica step
of keras_ctl (`replica_step`) or an object keras_ctl marked asks otherwise;
none is installed on import. Checked on Keras 3.12.0 and 3.15.1.
"""

import contextlib

from keras_ctl._keras.layers import _install_exact_sync_moments
from keras_ctl._keras.layers import _install_layers_of_empty_batches
from keras_ctl._keras.losses import _install_exact_reduction
from keras_ctl._keras.losses import _install_scores_over_no_class
from keras_ctl._keras.optimizers import _install_summed_gradients_switch
from keras_ctl._keras.optimizers import _install_summing_apply
from keras_ctl._keras.state import _in_step
from keras_ctl._keras.variables import _install_atomic_updates
from keras_ctl._keras.variables import _install_sharded_updates
from keras_ctl._keras.variables import _install_write_records
from keras_ctl._keras.variables import install_sharded_reads

# (installer, what it replaces, when it is installed)
PATCHES = (
    (
        _install_exact_reduction,
        "keras.src.losses.loss.reduce_weighted_values",
        "every replica step; `loss_parts`",
    ),
    (
        _install_scores_over_no_class,
        "backend.tensorflow nn.sparse_categorical_crossentropy, numpy.argmax",
        "every replica step",
    ),
    (
        _install_exact_sync_moments,
        "keras.src.backend.tensorflow.nn._compute_moments_sync",
        "every replica step",
    ),
    (
        _install_layers_of_empty_batches,
        "keras.Layer.__call__",
        "every replica step",
    ),
    (
        _install_summing_apply,
        "BaseOptimizer.apply, LossScaleOptimizer.apply, MultiOptimizer.apply",
        "every replica step",
    ),
    (
        _install_write_records,
        "backend.tensorflow.core.Variable._direct_assign",
        "every replica step",
    ),
    (
        _install_atomic_updates,
        "backend.tensorflow.core.Variable.assign_add, assign_sub",
        "every replica step",
    ),
    (
        _install_sharded_updates,
        "TFOptimizer._distributed_tf_update_step",
        "every replica step",
    ),
    (
        _install_summed_gradients_switch,
        "TFOptimizer._all_reduce_sum_gradients",
        "`gradients_already_summed`",
    ),
    (
        install_sharded_reads,
        "backend.tensorflow.core.Variable.__array__, _serialize_to_tensors",
        "a CTLModel made under a ParameterServerStrategy",
    ),
)
IN_EVERY_STEP = [install for install, _, when in PATCHES if when.startswith("every")]


@contextlib.contextmanager
def replica_step(written=None):
    """Within it (in this thread), Keras code called by a replica step is
    exact across replicas: `Loss` objects, synchronized BatchNorm, layers of
    a replica without examples, `optimizer.apply`, and variables that
    workers share or parameter servers shard (`PATCHES`). The ids of the
    variables it assigns are added to the set `written`, when given."""
    for install in IN_EVERY_STEP:
        install()
    previous = vars(_in_step).copy()
    _in_step.active = True
    _in_step.real_examples = None
    _in_step.written = written
    try:
        yield
    finally:
        vars(_in_step).clear()
        vars(_in_step).update(previous)


def updated_metrics(metrics, written):
    """The `metrics` any of whose variables a step assigned (`written`)."""
    return [m for m in metrics if any(id(v) in written for v in m.variables)]
