"""Which code of a model is the user's own, and how keras_ctl reads it:
one answer for the engine, building from the first step, and the parity
kit.

The reading of a step of one's own is decided from what runs, never from
how it is spelled. It is one device's code (`_replicas.Reading`) unless
`keras_ctl.written_in_shares` runs as part of it before any loss is read
as one device's (`declare_in_shares`). Replica arithmetic called from the
user's code (`keras_ctl.num_replicas`, `keras_ctl.all_reduce_sum`,
`tf.nn.compute_average_loss`, a replica context's `all_reduce`, a
strategy's `num_replicas_in_sync`, ...), whatever module, alias, decorator
or partial it is called through, is seen as it is called
(`replica_arithmetic` for keras_ctl's, `watching_replica_arithmetic` for
TensorFlow's): in code read as one device's it is refused by name
(`StepReadingError`), because one device has no replicas to count or sum
over. `keras_ctl.all_gather` is one device's batch in either reading.
"""

import ast
import contextlib
import functools
import inspect
import sys
import textwrap
import types
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any
from typing import TypeVar

import tensorflow as tf

from keras_ctl._keras.access import tensorflow_wrapper_modules
from keras_ctl._replicas import current_reading


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


def marked_in_shares(owner: Any, method: str) -> bool:
    """Whether `owner.method` is the function `keras_ctl.written_in_shares`
    returned (or wraps it, `functools.wraps` copying its mark): the engine
    then runs it in shares from its first line, without the fraction's
    collective. A step that declares itself otherwise (a decorated helper,
    a `functools.partial`) is found when it runs (`declare_in_shares`)."""
    function = getattr(owner, method, None)
    for candidate in (function, getattr(function, "__func__", None)):
        if candidate is not None and getattr(candidate, IN_SHARES_MARK, False):
            return True
    return False


# The attribute `keras_ctl.written_in_shares` sets on what it returns.
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


class StepReadingError(ValueError):
    """Code of one's own does what its reading forbids: replica arithmetic
    in one device's code, or `written_in_shares` after a loss was read as
    one device's."""


_F = TypeVar("_F", bound=Callable[..., Any])


def replica_arithmetic(name: str) -> Callable[[_F], _F]:
    """Decorates keras_ctl's public replica arithmetic (`all_gather`, ...):
    called from the user's code read as one device's, it is refused
    (`StepReadingError`). Called from keras_ctl's or Keras's own code, it
    is theirs."""

    def decorate(function: _F) -> _F:
        @functools.wraps(function)
        def called(*args: Any, **kwargs: Any) -> Any:
            _check_called(name, _caller(inspect.currentframe()))
            return function(*args, **kwargs)

        # AutoGraph leaves it as written, so the frame above it is its caller.
        return tf.autograph.experimental.do_not_convert(called)

    return decorate


def declare_in_shares(owner: str) -> None:
    """`keras_ctl.written_in_shares` runs: the code of one's own running on
    this thread is in shares from now on (its gradients and logs summed as
    they are). Refused once a loss was read as one device's."""
    reading = current_reading()
    if reading is None or reading.in_shares:
        return
    if reading.kind != "step":
        raise StepReadingError(
            f"`keras_ctl.written_in_shares` ({owner}) runs inside "
            f"{reading.owner}, a `compute_loss` of one's own, which keras_ctl "
            "always reads as one device's code (the step weighs its loss by "
            "the replica's part of the batch). Decorate the `train_step` that "
            "computes shares instead, or leave the decorator out and return one "
            "device's loss."
        )
    if reading.consulted:
        raise StepReadingError(
            f"`keras_ctl.written_in_shares` ({owner}) runs in the middle of "
            f"{reading.owner}, after the step already computed a loss or a "
            "gradient as one device's code, so the step would be half one "
            "device's code and half shares. Decorate the step itself "
            "(`@keras_ctl.written_in_shares` above `def train_step`), or a "
            "function it calls before it computes any loss."
        )
    reading.in_shares = True


def _check_called(name: str, caller: types.FrameType | None) -> None:
    reading = current_reading()
    if reading is None or reading.in_shares or not _is_users_frame(caller):
        return
    where = (
        ""
        if caller is None
        else (f" (at {caller.f_code.co_filename}:{caller.f_lineno})")
    )
    raise StepReadingError(
        f"{reading.owner} is read as one device's code, but it calls "
        f"`{name}`{where}, replica arithmetic: one device has no replicas to "
        "count or sum over, and keras_ctl cannot tell from the code whether "
        "it computes this replica's share of the loss or only logs. "
        + (_FIX_IN_COMPUTE_LOSS if reading.kind == "compute_loss" else _FIX_IN_STEP)
    )


_KEEP_ONE_DEVICES = (
    "gather rows with `keras_ctl.all_gather` for a loss or a statistic of "
    "the whole batch (one device's batch, in any step), return "
    "`keras_ctl.ReplicaSum(value)` to log a sum over replicas, and read "
    "`keras_ctl.num_replicas()` outside the step (in `__init__` or "
    "`compile`: `self.replicas = keras_ctl.num_replicas()`) to log it."
)

_FIX_IN_STEP = (
    "If the step computes each replica's share itself (the global-batch "
    "guide's recipe: a loss of gathered rows and 1 / keras_ctl.num_replicas() "
    "of it, or tf.nn.compute_average_loss), decorate it with "
    "`@keras_ctl.written_in_shares`. To keep it one device's code, " + _KEEP_ONE_DEVICES
)

_FIX_IN_COMPUTE_LOSS = (
    "A `compute_loss` of one's own is one device's code (the step weighs its "
    "loss by the replica's part of the batch): return one device's loss. To "
    "keep it so, " + _KEEP_ONE_DEVICES
)

_LIBRARIES = ("keras", "keras_ctl", "tensorflow")


def _caller(frame: types.FrameType | None) -> types.FrameType | None:
    """The frame that called the function running in `frame`, past
    TensorFlow's wrappers (`_keras.access.tensorflow_wrapper_modules`)."""
    wrappers = tensorflow_wrapper_modules()
    frame = frame.f_back if frame is not None else None
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith(
        wrappers
    ):
        frame = frame.f_back
    return frame


def _package(frame: types.FrameType) -> str:
    return str(frame.f_globals.get("__name__", "")).split(".")[0]


def _is_users_frame(frame: types.FrameType | None) -> bool:
    return frame is not None and _package(frame) not in _LIBRARIES


@contextlib.contextmanager
def watching_replica_arithmetic() -> Iterator[None]:
    """Within it (this thread), TensorFlow's replica arithmetic called from
    the user's code (`tf.nn.compute_average_loss`,
    `tf.nn.scale_regularization_loss`, a replica context's `all_reduce` and
    `all_gather`) is checked against the reading as it is called, whatever
    name it is called by: a profile function sees the code that runs. The
    previous profile function is back on every exit."""
    with _calls_of(_tensorflows_replica_arithmetic(), _check_called):
        yield


@contextlib.contextmanager
def replica_arithmetic_noted() -> Iterator[list[str]]:
    """Within it (this thread), the names of the replica arithmetic the
    user's code calls (TensorFlow's, `_tensorflows_replica_arithmetic`, and
    keras_ctl's collectives and replica count), in a list it yields,
    whatever name they are called by (Keras's own reads, such as its loss
    scaling's replica count, are not the user's). The previous profile
    function is back on every exit."""
    import keras_ctl

    watched = _tensorflows_replica_arithmetic()
    for name in _KERAS_CTLS_REPLICA_ARITHMETIC:
        code = _code_of(getattr(keras_ctl, name))
        if code is not None:
            watched[code] = f"keras_ctl.{name}"
    noted: list[str] = []

    def note(name: str, reader: types.FrameType | None) -> None:
        if _is_users_frame(reader):
            noted.append(name)

    with _calls_of(watched, note):
        yield noted


@contextlib.contextmanager
def _calls_of(
    watched: dict[types.CodeType, str],
    called: Callable[[str, types.FrameType | None], None],
) -> Iterator[None]:
    """Within it (this thread), `called(name, reader)` for every call of a
    code in `watched` (`{code: name}`), with the frame that called it
    (`reader`), through a profile function chained to the previous one,
    which is back on every exit."""
    previous: Any = sys.getprofile()

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        if previous is not None and callable(previous):
            previous(frame, event, arg)
        if event == "call":
            name = watched.get(frame.f_code)
            if name is not None:
                # A property is read by its reader's own frame (TensorFlow's
                # code that reads it, from a variable's assign, is its own).
                reader = frame.f_back if name.endswith("_in_sync") else _caller(frame)
                called(name, reader)

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(previous)


_KERAS_CTLS_REPLICA_ARITHMETIC = (
    "all_gather",
    "all_reduce_sum",
    "global_mean",
    "num_replicas",
    "row_offset",
)


def _tensorflows_replica_arithmetic() -> dict[types.CodeType, str]:
    """`{code: name}` of TensorFlow's replica arithmetic: the two loss
    scalings of `tf.nn`, the collectives of every replica context class
    loaded (strategies define their own), and the replica count of
    strategies and replica contexts."""
    found = {}
    for name in ("compute_average_loss", "scale_regularization_loss"):
        function = inspect.unwrap(getattr(tf.nn, name))
        found[function.__code__] = f"tf.nn.{name}"
    members = {
        tf.distribute.ReplicaContext: (
            "all_reduce",
            "all_gather",
            "num_replicas_in_sync",
        ),
        tf.distribute.Strategy: ("num_replicas_in_sync",),
    }
    for root, names in members.items():
        for cls in _with_subclasses(root):
            for member in names:
                code = _code_of(vars(cls).get(member))
                if code is not None:
                    found[code] = f"tf.distribute.{root.__name__}.{member}"
    return found


def _with_subclasses(root: type) -> list[type]:
    """`root`, its bases up to `object` and every subclass loaded."""
    found, todo = list(root.__mro__[:-1]), [root]
    while todo:
        subclasses: list[type] = todo.pop().__subclasses__()
        found += subclasses
        todo += subclasses
    return found


def _code_of(member: Any) -> types.CodeType | None:
    """The code a method or a property's getter runs."""
    if isinstance(member, property):
        member = member.fget
    if member is None:
        return None
    return getattr(inspect.unwrap(member), "__code__", None)
