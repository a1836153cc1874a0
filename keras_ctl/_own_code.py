"""Which code of a model is the user's own, and how keras_ctl reads it:
one answer for the engine, building from the first step, and the parity
kit."""

import ast
import inspect
import textwrap
import types
from typing import Any

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


def is_users_own(owner: Any, method: str) -> bool:
    """Whether `owner.method` (`"train_step"`, `"test_step"`,
    `"compute_loss"`; `owner` a model or its class) is the user's: defined
    outside Keras and keras_ctl (keras_ctl's `CTLModel` and `GAN` steps are
    exact as written)."""
    function = getattr(owner, method, None)
    return function is not None and is_users_function(function)


def is_keras_ctls(owner: Any, method: str) -> bool:
    """Whether `owner.method` is keras_ctl's own (`CTLModel.compute_loss`),
    exact as written. An override is not, the user's or a Keras model's
    (`keras.distillation.Distiller.compute_loss`, which a converted model
    keeps): the engine reads it as one device's code."""
    function = getattr(owner, method, None)
    function = getattr(function, "python_function", function)
    module = getattr(function, "__module__", None) or ""
    return module.split(".")[0] == "keras_ctl"


def is_users_function(function: Any) -> bool:
    """Whether `function` (a `tf.function`'s Python function included) is
    defined outside Keras, TensorFlow and keras_ctl."""
    function = getattr(function, "python_function", function)
    module = getattr(function, "__module__", None) or ""
    return module.split(".")[0] not in ("keras", "keras_ctl", "tensorflow")


def reads_as_one_device(owner: Any, method: str) -> bool:
    """Whether the user's own `owner.method` is read as one device's code
    (`keras_ctl._engine.own_step`): it is the user's, and names none of
    `REPLICA_ARITHMETIC`."""
    return is_users_own(owner, method) and not replica_arithmetic_named(owner, method)


def replica_arithmetic_named(owner: Any, method: str) -> list[str]:
    """The names of `REPLICA_ARITHMETIC` that `owner.method` uses, in
    its body, in functions defined in it, and in the model's code it calls
    (`functions_read_by`), sorted; `written_in_shares` for a step so
    marked (`keras_ctl.written_in_shares`)."""
    names: set[str] = set()
    for function in functions_read_by(owner, method):
        names |= _names_in(function.__code__) & REPLICA_ARITHMETIC
        if getattr(function, IN_SHARES_MARK, False):
            names.add("written_in_shares")
    return sorted(names)


# The attribute `keras_ctl.written_in_shares` sets on a step.
IN_SHARES_MARK = "__keras_ctl_written_in_shares__"


def functions_read_by(owner: Any, method: str) -> list[types.FunctionType]:
    """The user's own functions `owner.method` runs (`owner` a model or its
    class): itself, the same method of a base class it calls through
    `super()`, and the model's methods it calls on `self`, followed through
    each (Keras's and keras_ctl's own code is not followed). A step set on
    the instance (`self.train_step = self.train_step_tf`) is read too."""
    mro = owner.__mro__ if isinstance(owner, type) else type(owner).__mro__
    found, seen = [], set()

    def defined(name, start):
        """`(function, index)` of the first definition of `name` in
        `mro[start:]`, or `(None, None)`."""
        for index in range(start, len(mro)):
            if name in vars(mro[index]):
                return _python_function(vars(mro[index])[name]), index
        return None, None

    def visit(function, index):
        if function is None or id(function) in seen:
            return
        seen.add(id(function))
        if not is_users_function(function):
            return
        found.append(function)
        name = function.__name__
        names = _names_in(function.__code__)
        if "super" in names and name in names:
            visit(*defined(name, index + 1))
        for other in sorted(names - {name}):
            visit(*defined(other, 0))

    first = _python_function(getattr(owner, method, None))
    if first is not None:
        at = [i for i, c in enumerate(mro) if vars(c).get(first.__name__)]
        visit(first, at[0] if at else 0)
    return found


def _python_function(value):
    """The Python function of a method, static or class method, or
    `tf.function`; `None` for anything else."""
    value = getattr(value, "__func__", value)
    value = getattr(value, "python_function", value)
    return value if isinstance(value, types.FunctionType) else None


def _names_in(code):
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names_in(constant)
    return names


# Reductions and products that may take a statistic of the whole batch:
# over every axis, or over axis 0, they see only the replica's examples.
_BATCH_REDUCTIONS = frozenset(
    {
        "sum",
        "reduce_sum",
        "amax",
        "max",
        "reduce_max",
        "amin",
        "min",
        "reduce_min",
        "std",
        "reduce_std",
        "var",
        "reduce_variance",
        "logsumexp",
        "reduce_logsumexp",
        "moments",
        "top_k",
        "sort",
        "argsort",
        "cumsum",
    }
)


def batch_statistics_in(owner: Any, method: str) -> list[tuple[str, int, str]]:
    """`[(file, line, code)]`: calls in the user's own `owner.method`
    and the model's code it calls (`functions_read_by`) that may take a
    statistic of the whole batch, which a replica computes on its part
    only: a reduction from `_BATCH_REDUCTIONS` with no `axis` or with axis
    0 (`ops.sum(self.losses)`, a list of terms, excepted), and a product of
    a tensor with a transposed one (a similarity matrix across examples).
    A hint for the parity kit: the axes of a tensor are not known here."""
    found: list[tuple[str, int, str]] = []
    for function in functions_read_by(owner, method):
        try:
            lines, first = inspect.getsourcelines(function)
            filename = inspect.getsourcefile(function)
        except (OSError, TypeError):
            continue
        if filename is None:
            continue
        source = textwrap.dedent("".join(lines))
        for node in ast.walk(ast.parse(source)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and _may_take_a_batch_statistic(node.func.attr, node)
            ):
                segment = ast.get_source_segment(source, node) or ""
                code = segment.splitlines()[0] if segment else ""
                found.append((filename, first + node.lineno - 1, code))
    return sorted(found)


def _may_take_a_batch_statistic(name, call):
    keywords = {k.arg: k.value for k in call.keywords}
    if name in ("matmul", "dot"):
        return any(
            k in keywords and _is_true(keywords[k])
            for k in ("transpose_b", "transpose_a")
        ) or any(isinstance(a, ast.Attribute) and a.attr == "T" for a in call.args)
    if name not in _BATCH_REDUCTIONS:
        return False
    if call.args and isinstance(call.args[0], ast.Attribute):
        if call.args[0].attr == "losses":  # a list of terms, summed once
            return False
    axis = keywords.get("axis", call.args[1] if len(call.args) > 1 else None)
    if axis is None or (isinstance(axis, ast.Constant) and axis.value is None):
        return name not in ("top_k", "sort", "argsort", "cumsum")
    values = axis.elts if isinstance(axis, (ast.Tuple, ast.List)) else [axis]
    return any(isinstance(v, ast.Constant) and v.value == 0 for v in values)


def _is_true(node):
    return isinstance(node, ast.Constant) and node.value is True
