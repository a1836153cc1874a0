"""The behaviours the replacements' table names, registered by name.

A row of `table.REPLACEMENTS` says which attribute of Keras or TensorFlow
is replaced, and why; what the replacement does is a behaviour,
`make(original) -> replacement`, registered under its function's name by
the module that defines it (`@behaviours.registered`). The seam registers
the few that only adapt Keras's own types (sharded variables, its
all-reduce switch); what keras_ctl decides (the exact reduction, one
device's draws, ...) is registered by `keras_ctl._replaced`, which the
seam never imports. A row whose behaviour nobody registered fails when the
table is put in place, naming it.
"""

from collections.abc import Callable
from typing import NamedTuple

Make = Callable[..., object]

_registered: dict[str, Make] = {}


class BehaviourMissing(LookupError):
    """A row of the replacements' table names a behaviour nobody registered."""


def registered(make: Make) -> Make:
    """Registers `make` under its own name, for the rows naming it."""
    name = make.__name__
    if _registered.get(name, make) is not make:
        raise ValueError(f"Two behaviours are registered as `{name}`.")
    _registered[name] = make
    return make


def named(name: str) -> Make:
    """The behaviour registered as `name`."""
    try:
        return _registered[name]
    except KeyError:
        raise BehaviourMissing(
            f"The replacements' table names the behaviour `{name}`, which no "
            "module registered: import `keras_ctl` (its `_replaced` package "
            "registers keras_ctl's behaviours) before putting the table in "
            "place."
        ) from None


class Replacement(NamedTuple):
    """`owner().name` replaced by `make(original)` while keras_ctl runs.

    `owner` returns the module or class (or `None` where this Keras has
    none); `behaviour` names the registered behaviour that makes the
    replacement, given `arguments` too; `why` says why no public hook
    carries the change. A row that one feature needs names a public
    `fallback`, `(owner, name)`: where this Keras lacks the private owner,
    `make` wraps the fallback instead, so the feature's users are still
    caught, by the public class that calls the private one, and nothing
    else of keras_ctl depends on the private name.
    """

    owner: Callable[[], object]
    name: str
    behaviour: str
    why: str
    fallback: tuple[Callable[[], object], str] | None = None
    arguments: tuple[tuple[str, object], ...] = ()

    def make(self, original: object) -> object:
        """The replacement of `original`, made by the row's behaviour."""
        return named(self.behaviour)(original, **dict(self.arguments))
