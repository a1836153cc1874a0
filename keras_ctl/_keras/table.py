"""Every attribute of Keras or TensorFlow that keras_ctl replaces, in one
table: its owner, looked up through `names`, the behaviour that replaces
it (`behaviours`) and why no public hook carries the change. Checked on
Keras 3.12.0 and 3.15.1 (3.16 moved some owners).
"""

import random as python_random

import keras

from keras_ctl._keras import names
from keras_ctl._keras.behaviours import Replacement
from keras_ctl._keras.random import PARAMETERIZED
from keras_ctl._keras.random import PYTHON_DRAWS
from keras_ctl._keras.random import SHAPED


def _tf_nn():
    return names.module("keras.src.backend.tensorflow.nn")


def _tf_random():
    return names.module("keras.src.backend.tensorflow.random")


def _tf_variable():
    return names.member("keras.src.backend.tensorflow.core", "Variable")


def _tf_optimizer():
    return names.member("keras.src.backend.tensorflow.optimizer", "TFOptimizer")


def _base_optimizer():
    return names.member("keras.src.optimizers.base_optimizer", "BaseOptimizer")


def _loss_module():
    return names.module("keras.src.losses.loss")


_APPLY_CLIPS = (
    "a step of one's own calls `optimizer.apply` on the user's optimizer, "
    "which clips before it sums across replicas"
)

REPLACEMENTS = (
    Replacement(
        _loss_module,
        "reduce_weighted_values",
        "exact_reduction",
        "`Loss.__call__` divides by the replica's own count and the replica "
        "count inside one call; a step of one's own calls its `Loss` objects "
        "directly, past any wrapper keras_ctl could give the model",
    ),
    Replacement(
        _loss_module,
        "unscale_loss_for_distribution",
        "logged_as_reduced",
        "Keras's `CompileLoss` and `train_step` multiply a reduced loss by the "
        "replica count before logging it, inside their own calls",
    ),
    Replacement(
        _tf_nn,
        "sparse_categorical_crossentropy",
        "crossentropy_over_no_class",
        "TensorFlow's kernel refuses an empty replica's (0, 0) scores, inside "
        "a `Loss` the user built",
    ),
    Replacement(
        lambda: names.module("keras.src.backend.tensorflow.numpy"),
        "argmax",
        "argmax_over_no_class",
        "as above, for the in-batch accuracy a metric computes",
    ),
    Replacement(
        lambda: keras.metrics.Mean,
        "update_state",
        "weighed_by_batch",
        "a tracker updated inside a `compute_loss` of one's own adds one "
        "value a step on every replica; no hook weighs it by the replica's "
        "examples",
    ),
    Replacement(
        _tf_nn,
        "_compute_moments_sync",
        "exact_sync_moments",
        "synchronized BatchNorm has no hook for its moments' counts",
    ),
    Replacement(
        _tf_nn,
        "moments",
        "moments_over_global_batch",
        "BatchNorm reads `synchronized` from each layer's own attribute; no "
        "hook makes every layer's batch moments global for one call",
    ),
    Replacement(
        lambda: keras.Layer,
        "__call__",
        "layers_of_empty_batches",
        "a step of one's own calls its layers on an empty replica batch; "
        "no call context reaches every layer it calls",
    ),
    Replacement(
        lambda: names.module("keras.src.random.seed_generator"),
        "global_seed_generator",
        "per_replica_generators",
        "Keras keeps one global seed generator per thread, created on first "
        "use: each replica thread would create its own inside the trace",
    ),
    *(
        Replacement(
            _tf_random,
            name,
            "shaped_as_one_device",
            "Keras's random functions draw this replica's rows with the seed "
            "every replica shares, so replicas repeat each other's numbers; "
            "layers (`GaussianNoise`, augmentation) call them directly",
        )
        for name in SHAPED
    ),
    Replacement(
        _tf_random,
        "dropout",
        "dropout_as_one_device",
        "as above, for `Dropout` and every layer's dropout",
    ),
    *(
        Replacement(
            _tf_random,
            name,
            "parameterized_as_one_device",
            "as above, for draws whose parameters may hold a value per row",
            arguments=(("parameters", parameters),),
        )
        for name, parameters in PARAMETERIZED.items()
    ),
    Replacement(
        _tf_random,
        "categorical",
        "categorical_as_one_device",
        "as above, for a draw per row of the logits",
    ),
    *(
        Replacement(
            lambda: python_random,
            name,
            "python_draw_refused_as_one_device",
            "a step's draw of Python's `random` (AugMix's augmentations) is "
            "each replica thread's own, and nothing hooks it",
        )
        for name in PYTHON_DRAWS
    ),
    Replacement(
        lambda: names.module("keras.src.backend.tensorflow.image"),
        "elastic_transform",
        "image_draw_refused_as_one_device",
        "it draws with TensorFlow's own random ops, which no Keras hook reaches",
        fallback=(
            lambda: getattr(keras.layers, "RandomElasticTransform", None),
            "transform_images",
        ),
    ),
    Replacement(
        lambda: getattr(keras.layers, "Mosaic", None),  # >= 3.16
        "get_random_transformation",
        "batch_mixing_refused_as_one_device",
        "it indexes the batch with a draw bounded by the batch's size, which "
        "no draw of a replica's rows can make one device's",
    ),
    Replacement(
        _tf_random,
        "shuffle",
        "shuffle_refused_as_one_device",
        "a permutation of the global batch cannot be drawn from a replica's "
        "rows, so a shuffle of them is refused by name",
    ),
    Replacement(
        lambda: names.member(
            "tensorflow.python.eager.polymorphic_function.polymorphic_function",
            "Function",
        ),
        "__call__",
        "inlined_in_replica_steps",
        "TensorFlow refuses a collective in a `tf.function` nested in a "
        "replica step (a `train_step` decorated with `@tf.function`), and "
        "no option of `tf.function` inlines it",
    ),
    Replacement(
        lambda: keras.Layer,
        "_get_own_losses",
        "own_losses_of_this_replica",
        "replica threads share a layer's one list of losses, which another "
        "replica's forward pass replaces while this one waits on a "
        "collective",
    ),
    *(
        Replacement(owner, "apply", "summing_apply", why)
        for owner, why in (
            (_base_optimizer, _APPLY_CLIPS),
            (lambda: keras.optimizers.LossScaleOptimizer, "as above (its own `apply`)"),
            # >= 3.15
            (lambda: getattr(keras.optimizers, "MultiOptimizer", None), "as above"),
        )
    ),
    Replacement(
        _tf_optimizer,
        "_all_reduce_sum_gradients",
        "summed_gradients_switch",
        "Keras 3 has no switch to skip its all-reduce of gradients "
        "(`skip_gradients_aggregation` was dropped)",
    ),
    Replacement(
        _tf_optimizer,
        "_distributed_tf_update_step",
        "sharded_updates",
        "`strategy.extended.update` refuses a variable sharded across "
        "parameter servers",
    ),
    Replacement(
        _tf_variable,
        "_direct_assign",
        "write_records",
        "no hook tells which metric variables a traced step assigns",
    ),
    *(
        Replacement(
            _tf_variable,
            native,
            "atomic_update",
            "Keras's `assign_add` and `assign_sub` are a read and a write, "
            "which lose updates between parameter-server workers",
            arguments=(("native", native),),
        )
        for native in ("assign_add", "assign_sub")
    ),
    Replacement(
        _tf_variable,
        "__array__",
        "whole_sharded_array",
        "a variable sharded across parameter servers has no `__array__`",
    ),
    Replacement(
        _tf_variable,
        "_serialize_to_tensors",
        "whole_sharded_checkpoint",
        "a variable sharded across parameter servers has no tensor to save",
    ),
)
