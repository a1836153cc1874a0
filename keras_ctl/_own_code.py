"""Which code of a model is the user's own, and how keras_ctl reads it:
one answer for the engine, building from the first step, and the parity
kit."""

import types

# Names of the replica arithmetic of keras_ctl and TensorFlow. A step that
# uses one of them is written in replica shares, and runs as written.
REPLICA_ARITHMETIC = frozenset(
    {
        "num_replicas",
        "num_replicas_in_sync",
        "get_replica_context",
        "all_reduce",
        "all_reduce_sum",
        "all_gather",
        "row_offset",
        "global_mean",
        "scaled_regularization_loss",
        "minimize",
        "ReplicaSum",
        "ExampleMean",
        "compute_average_loss",
        "scale_regularization_loss",
    }
)


def is_users_own(model_class, method):
    """Whether `model_class.method` (`"train_step"`, `"test_step"`,
    `"compute_loss"`) is the user's: defined outside Keras and keras_ctl
    (keras_ctl's `CTLModel` and `GAN` steps are exact as written)."""
    function = getattr(model_class, method, None)
    return function is not None and is_users_function(function)


def is_users_function(function):
    """Whether `function` (a `tf.function`'s Python function included) is
    defined outside Keras, TensorFlow and keras_ctl."""
    function = getattr(function, "python_function", function)
    module = getattr(function, "__module__", None) or ""
    return module.split(".")[0] not in ("keras", "keras_ctl", "tensorflow")


def reads_as_one_device(model_class, method):
    """Whether the user's own `model_class.method` is read as one device's
    code (`keras_ctl._engine.own_step`): it is the user's, and names none
    of `REPLICA_ARITHMETIC`."""
    return is_users_own(model_class, method) and not replica_arithmetic_named(
        model_class, method
    )


def replica_arithmetic_named(model_class, method):
    """The names of `REPLICA_ARITHMETIC` that `model_class.method` uses, in
    its body or in functions defined in it, sorted."""
    function = getattr(model_class, method, None)
    function = getattr(function, "python_function", function)  # a tf.function
    code = getattr(function, "__code__", None)
    if code is None:
        return []
    return sorted(_names_in(code) & REPLICA_ARITHMETIC)


def _names_in(code):
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names_in(constant)
    return names
