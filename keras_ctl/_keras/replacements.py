"""Every attribute of Keras or TensorFlow that keras_ctl replaces, in one
table, and the scope in which the replacements are in place.

Nothing is replaced on import. `in_effect()` puts the whole table in place
when the outermost keras_ctl call starts (in any thread) and puts Keras's
own attributes back when the last one ends: on return, on an exception, on
`KeyboardInterrupt`. The one exception is `SHARDED_READS`, kept for the
process once a CTLModel is made under a `ParameterServerStrategy`. While
in place, each replacement does what Keras does unless this thread runs a
replica step of keras_ctl (`replica_step`) or an object keras_ctl marked
asks otherwise, so plain Keras in another thread keeps Keras's
behaviour. Checked on Keras 3.12.0 and 3.15.1; the owners are looked up
through `names` (3.16 moved some).
"""

import contextlib
import functools
import random as python_random
import threading
from collections.abc import Iterator
from typing import Any
from typing import Callable
from typing import NamedTuple

import keras

from keras_ctl._keras import functions
from keras_ctl._keras import layers
from keras_ctl._keras import losses
from keras_ctl._keras import metrics
from keras_ctl._keras import names
from keras_ctl._keras import optimizers
from keras_ctl._keras import random
from keras_ctl._keras import variables
from keras_ctl._keras.state import _in_step


class Replacement(NamedTuple):
    """`owner().name` replaced by `make(original)` while keras_ctl runs.

    `owner` returns the module or class (or `None` where this Keras has
    none); `why` says why no public hook carries the change. A row that
    one feature needs names a public `fallback`, `(owner, name)`: where
    this Keras lacks the private owner, `make` wraps the fallback instead,
    so the feature's users are still caught, by the public class that
    calls the private one, and nothing else of keras_ctl depends on the
    private name.
    """

    owner: Callable[[], object]
    name: str
    make: Callable[[object], object]
    why: str
    fallback: tuple[Callable[[], object], str] | None = None


def _where(replacement: Replacement) -> tuple[object, str]:
    """`(owner, name)` the row replaces in this Keras: its own, else its
    fallback's where Keras lacks the private owner."""
    try:
        return replacement.owner(), replacement.name
    except names.KerasInternalMissing:
        if replacement.fallback is None:
            raise
        owner, name = replacement.fallback
        return owner(), name


def _tf_nn():
    return names.module("keras.src.backend.tensorflow.nn")


def _tf_random():
    return names.module("keras.src.backend.tensorflow.random")


def _tf_variable():
    return names.member("keras.src.backend.tensorflow.core", "Variable")


def _tf_optimizer():
    return names.member("keras.src.backend.tensorflow.optimizer", "TFOptimizer")


def _tf_function():
    return names.member(
        "tensorflow.python.eager.polymorphic_function.polymorphic_function", "Function"
    )


def _base_optimizer():
    return names.member("keras.src.optimizers.base_optimizer", "BaseOptimizer")


REPLACEMENTS = (
    Replacement(
        lambda: names.module("keras.src.losses.loss"),
        "reduce_weighted_values",
        losses.exact_reduction,
        "`Loss.__call__` divides by the replica's own count and the replica "
        "count inside one call; a step of one's own calls its `Loss` objects "
        "directly, past any wrapper keras_ctl could give the model",
    ),
    Replacement(
        lambda: names.module("keras.src.losses.loss"),
        "unscale_loss_for_distribution",
        losses.logged_as_reduced,
        "Keras's `CompileLoss` and `train_step` multiply a reduced loss by the "
        "replica count before logging it, inside their own calls",
    ),
    Replacement(
        _tf_nn,
        "sparse_categorical_crossentropy",
        losses.crossentropy_over_no_class,
        "TensorFlow's kernel refuses an empty replica's (0, 0) scores, inside "
        "a `Loss` the user built",
    ),
    Replacement(
        lambda: names.module("keras.src.backend.tensorflow.numpy"),
        "argmax",
        losses.argmax_over_no_class,
        "as above, for the in-batch accuracy a metric computes",
    ),
    Replacement(
        lambda: keras.metrics.Mean,
        "update_state",
        metrics.weighed_by_batch,
        "a tracker updated inside a `compute_loss` of one's own adds one "
        "value a step on every replica; no hook weighs it by the replica's "
        "examples",
    ),
    Replacement(
        _tf_nn,
        "_compute_moments_sync",
        layers.exact_sync_moments,
        "synchronized BatchNorm has no hook for its moments' counts",
    ),
    Replacement(
        _tf_nn,
        "moments",
        layers.moments_over_global_batch,
        "BatchNorm reads `synchronized` from each layer's own attribute; no "
        "hook makes every layer's batch moments global for one call",
    ),
    Replacement(
        lambda: keras.Layer,
        "__call__",
        layers.layers_of_empty_batches,
        "a step of one's own calls its layers on an empty replica batch; "
        "no call context reaches every layer it calls",
    ),
    Replacement(
        lambda: names.module("keras.src.random.seed_generator"),
        "global_seed_generator",
        random.per_replica_generators,
        "Keras keeps one global seed generator per thread, created on first "
        "use: each replica thread would create its own inside the trace",
    ),
    *(
        Replacement(
            _tf_random,
            name,
            random.shaped_as_one_device,
            "Keras's random functions draw this replica's rows with the seed "
            "every replica shares, so replicas repeat each other's numbers; "
            "layers (`GaussianNoise`, augmentation) call them directly",
        )
        for name in random.SHAPED
    ),
    Replacement(
        _tf_random,
        "dropout",
        random.dropout_as_one_device,
        "as above, for `Dropout` and every layer's dropout",
    ),
    *(
        Replacement(
            _tf_random,
            name,
            functools.partial(random.parameterized_as_one_device, parameters=names_),
            "as above, for draws whose parameters may hold a value per row",
        )
        for name, names_ in random.PARAMETERIZED.items()
    ),
    Replacement(
        _tf_random,
        "categorical",
        random.categorical_as_one_device,
        "as above, for a draw per row of the logits",
    ),
    *(
        Replacement(
            lambda: python_random,
            name,
            random.python_draw_refused_as_one_device,
            "a step's draw of Python's `random` (AugMix's augmentations) is "
            "each replica thread's own, and nothing hooks it",
        )
        for name in random.PYTHON_DRAWS
    ),
    Replacement(
        lambda: names.module("keras.src.backend.tensorflow.image"),
        "elastic_transform",
        random.image_draw_refused_as_one_device,
        "it draws with TensorFlow's own random ops, which no Keras hook reaches",
        fallback=(
            lambda: getattr(keras.layers, "RandomElasticTransform", None),
            "transform_images",
        ),
    ),
    Replacement(
        lambda: getattr(keras.layers, "Mosaic", None),  # >= 3.16
        "get_random_transformation",
        random.batch_mixing_refused_as_one_device,
        "it indexes the batch with a draw bounded by the batch's size, which "
        "no draw of a replica's rows can make one device's",
    ),
    Replacement(
        _tf_random,
        "shuffle",
        random.shuffle_refused_as_one_device,
        "a permutation of the global batch cannot be drawn from a replica's "
        "rows, so a shuffle of them is refused by name",
    ),
    Replacement(
        _tf_function,
        "__call__",
        functions.inlined_in_replica_steps,
        "TensorFlow refuses a collective in a `tf.function` nested in a "
        "replica step (a `train_step` decorated with `@tf.function`), and "
        "no option of `tf.function` inlines it",
    ),
    Replacement(
        lambda: keras.Layer,
        "_get_own_losses",
        layers.own_losses_of_this_replica,
        "replica threads share a layer's one list of losses, which another "
        "replica's forward pass replaces while this one waits on a "
        "collective",
    ),
    Replacement(
        _base_optimizer,
        "apply",
        optimizers.summing_apply,
        "a step of one's own calls `optimizer.apply` on the user's "
        "optimizer, which clips before it sums across replicas",
    ),
    Replacement(
        lambda: keras.optimizers.LossScaleOptimizer,
        "apply",
        optimizers.summing_apply,
        "as above (its own `apply`)",
    ),
    Replacement(
        lambda: getattr(keras.optimizers, "MultiOptimizer", None),  # >= 3.15
        "apply",
        optimizers.summing_apply,
        "as above (its own `apply`)",
    ),
    Replacement(
        _tf_optimizer,
        "_all_reduce_sum_gradients",
        optimizers.summed_gradients_switch,
        "Keras 3 has no switch to skip its all-reduce of gradients "
        "(`skip_gradients_aggregation` was dropped)",
    ),
    Replacement(
        _tf_optimizer,
        "_distributed_tf_update_step",
        variables.sharded_updates,
        "`strategy.extended.update` refuses a variable sharded across "
        "parameter servers",
    ),
    Replacement(
        _tf_variable,
        "_direct_assign",
        variables.write_records,
        "no hook tells which metric variables a traced step assigns",
    ),
    Replacement(
        _tf_variable,
        "assign_add",
        functools.partial(variables.atomic_update, native="assign_add"),
        "Keras's `assign_add` is a read and a write, which loses updates "
        "between parameter-server workers",
    ),
    Replacement(
        _tf_variable,
        "assign_sub",
        functools.partial(variables.atomic_update, native="assign_sub"),
        "as above",
    ),
    Replacement(
        _tf_variable,
        "__array__",
        variables.whole_sharded_array,
        "a variable sharded across parameter servers has no `__array__`",
    ),
    Replacement(
        _tf_variable,
        "_serialize_to_tensors",
        variables.whole_sharded_checkpoint,
        "a variable sharded across parameter servers has no tensor to save",
    ),
)

_lock = threading.Lock()
_users = 0
# (owner, name, Keras's own entry of `vars(owner)` or `_ABSENT`, replacement)
_installed: list[tuple[object, str, object, object]] = []
# The same, for the rows `keep_sharded_reads` keeps in place.
_kept: list[tuple[object, str, object, object]] = []
_ABSENT = object()

# The one exception to "only while keras_ctl runs": reads of a variable
# sharded across parameter servers. A user's own `tf.train.Checkpoint(...)`
# or `np.asarray(variable)` after `fit()` reads it outside keras_ctl's
# calls, and fails without them. They change nothing for a variable that is
# not sharded, and plain Keras makes none (`keep_sharded_reads`).
SHARDED_READS = ("__array__", "_serialize_to_tensors")


def keep_sharded_reads():
    """Keeps the `SHARDED_READS` rows in place for the process: called when
    a CTLModel is made under a `ParameterServerStrategy`."""
    with _lock:
        if _kept:
            return
        for replacement in REPLACEMENTS:
            if replacement.name in SHARDED_READS:
                _kept.append(_put_in_place(replacement, *_where(replacement)))


@contextlib.contextmanager
def in_effect():
    """Within it, the replacements are in place, in every thread; they are
    Keras's own attributes again when the last `in_effect` of the process
    ends. Nests and may be entered from several threads at once."""
    global _users
    with _lock:
        if _users == 0:
            _install()
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                _restore()


def _install():
    try:
        for replacement in REPLACEMENTS:
            owner, name = _where(replacement)
            if owner is None:
                continue
            current = getattr(owner, name)
            if any(current is new for *_, new in _installed + _kept):
                continue  # inherited from a class replaced already, or kept
            _installed.append(_put_in_place(replacement, owner, name))
    except BaseException:
        _restore()
        raise


# Each replacement made once per original: the same function object every
# call, so what TensorFlow caches by function (autograph's conversions)
# stays valid from one keras_ctl call to the next.
_made: dict[tuple[Replacement, int], tuple[object, object]] = {}


def _put_in_place(replacement, owner, name):
    own = vars(owner).get(name, _ABSENT)
    current = getattr(owner, name)
    key = (replacement, id(current))
    if key not in _made:
        _made[key] = (current, replacement.make(current))
    new = _made[key][1]
    setattr(owner, name, new)
    return owner, name, own, new


def _restore():
    while _installed:
        owner, name, own, new = _installed.pop()
        if vars(owner).get(name) is not new:
            continue  # replaced again by someone else since: leave theirs
        if own is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, own)


def replaced():
    """`[(owner, name)]` of every attribute the table replaces in this Keras."""
    return [where for r in REPLACEMENTS if (where := _where(r))[0] is not None]


@contextlib.contextmanager
def replica_step(
    written=None, stands_for_trace=False, batch_statistics=None, assigned=None
):
    """Within it (in this thread), Keras code called by a replica step is
    exact across replicas: `Loss` objects, synchronized BatchNorm, layers of
    a replica without examples, `optimizer.apply`, and variables that
    workers share or parameter servers shard (`REPLACEMENTS`). The ids of
    the variables it assigns are added to the set `written`, when given,
    and `(variable, value)` to the list `assigned`.
    `stands_for_trace`: the step runs eagerly in place of a traced one, so
    shapes the trace would not know are taken as unknown
    (`metrics.weighed_by_batch`). `batch_statistics="global"`: moments
    over the examples' axis are the global batch's
    (`layers.moments_over_global_batch`)."""
    with in_effect():
        previous = vars(_in_step).copy()
        _in_step.active = True
        _in_step.real_examples = None
        _in_step.written = written
        _in_step.assigned = assigned
        _in_step.batch_statistics = batch_statistics
        _in_step.stands_for_trace = stands_for_trace
        try:
            yield
        finally:
            vars(_in_step).clear()
            vars(_in_step).update(previous)


def loss_parts(
    loss: Callable[..., Any],
    y_true: Any,
    y_pred: Any,
    sample_weight: Any = None,
    one_value: str = "mean",
) -> losses.LossParts | None:
    """`losses.loss_parts`, with the exact reduction in place."""
    with in_effect():
        return losses.loss_parts(loss, y_true, y_pred, sample_weight, one_value)


@contextlib.contextmanager
def gradients_already_summed(optimizer: keras.optimizers.Optimizer) -> Iterator[None]:
    """`optimizers.gradients_already_summed`, with Keras's all-reduce of
    gradients switchable."""
    with in_effect(), optimizers.gradients_already_summed(optimizer):
        yield


def updated_metrics(metrics: list[Any], written: set[int]) -> list[Any]:
    """The `metrics` any of whose variables a step assigned (`written`)."""
    return [m for m in metrics if any(id(v) in written for v in m.variables)]
