"""The one place where keras_ctl looks up a private Keras or TensorFlow name.

Every private name the seam reads goes through `module`, `member` or
`attribute`; the inventory of them is read off these calls in the source
(`inventory()`), and a test checks each against the installed Keras. When
Keras moves a name, the lookup raises `KerasInternalMissing`, which names
it, the installed Keras and the versions keras_ctl was checked on, instead
of an `ImportError` at import or an `AttributeError` deep in a step.

Known moves are in `MOVED`: Keras 3.16 moved the TensorFlow backend's op
modules (`nn`, `numpy`, `core`, `image`, ...) into `backend/tensorflow/ops/`.
"""

import ast
import importlib
import pathlib

import keras

# The Keras versions the seam was read against and the fast tier passed on
# (`.ci/compat`).
CHECKED_ON = ("3.12.0", "3.15.1", "3.16.0.dev2026102704")

# The package of an old path -> where a later Keras keeps its modules.
MOVED = {"keras.src.backend.tensorflow": "keras.src.backend.tensorflow.ops"}


_REQUIRED = object()


class KerasInternalMissing(ImportError):
    """A private Keras or TensorFlow name that keras_ctl needs is gone."""

    def __init__(self, name):
        super().__init__(
            f"keras_ctl needs `{name}`, a private name of Keras or TensorFlow "
            f"that is missing in the installed Keras {keras.__version__} "
            f"({_checked_on(keras.__version__)}). Install a Keras "
            "that keras_ctl supports (see its `pip show keras-ctl` requirements) "
            "or a keras_ctl release made for this Keras."
        )
        self.name = name


def _checked_on(installed):
    """What the error says of the versions checked, given the `installed`
    one: a checked version that lacks a name is not the copy checked."""
    others = [v for v in CHECKED_ON if v != installed]
    checked = f"keras_ctl was checked on Keras {', '.join(others)}"
    if installed in CHECKED_ON:
        return f"{checked}, and on a copy of {installed} that had it"
    return checked


def module(path):
    """The module at `path`, or where a later Keras moved it (`MOVED`)."""
    package, _, leaf = path.rpartition(".")
    for candidate in (path, f"{MOVED[package]}.{leaf}" if package in MOVED else None):
        if candidate is None:
            continue
        try:
            return importlib.import_module(candidate)
        except ImportError:
            continue
    raise KerasInternalMissing(path)


def member(path, name):
    """`name` of the module at `path` (a function, a class, a constant)."""
    found = getattr(module(path), name, _REQUIRED)
    if found is _REQUIRED:
        raise KerasInternalMissing(f"{path}.{name}")
    return found


def attribute(obj, name, default=_REQUIRED):
    """`obj.name` for a private attribute of a Keras or TensorFlow object.

    With `default`, an object without it gives `default` (Keras sets some
    only on some paths, such as `_initial_epoch`); without, it is required.
    """
    try:
        return getattr(obj, name)
    except AttributeError:
        if default is not _REQUIRED:
            return default
        raise KerasInternalMissing(f"{type(obj).__qualname__}.{name}") from None


def set_attribute(obj, name, value):
    """Sets a private attribute that Keras reads (it must exist already, or
    Keras no longer reads it)."""
    attribute(obj, name)
    setattr(obj, name, value)


_LOOKUPS = {"module", "member", "attribute", "set_attribute"}


def inventory():
    """`[(kind, where, name)]`: every private name the seam looks up, read
    off the calls in its source (`kind`: "module", "member" or
    "attribute"; `where`: the module path, or `None` for an attribute of
    an object)."""
    found: set[tuple[str, object, object]] = set()
    for path in sorted(pathlib.Path(__file__).parent.glob("*.py")):
        if path.name == "names.py":
            continue  # the lookups themselves
        for node in ast.walk(ast.parse(path.read_text())):
            call = _lookup_call(node)
            if call is None:
                continue
            kind, args = call
            literals = [a.value if isinstance(a, ast.Constant) else None for a in args]
            if kind == "module":
                found.add(("module", literals[0], None))
            elif kind == "member":
                found.add(("member", literals[0], literals[1]))
            else:
                found.add(("attribute", None, literals[1]))
    return sorted(found, key=lambda item: tuple(str(part) for part in item))


def _lookup_call(node):
    """`(kind, args)` when `node` calls a lookup of this module, else `None`."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in _LOOKUPS:
        return None
    if isinstance(func, ast.Attribute) and getattr(func.value, "id", None) != "names":
        return None
    kind = "attribute" if name == "set_attribute" else name
    return kind, node.args
