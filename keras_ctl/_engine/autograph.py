"""Engine code that AutoGraph leaves as written."""

from collections.abc import Callable
from typing import Any
from typing import TypeVar
from typing import cast

import tensorflow as tf

_F = TypeVar("_F", bound=Callable[..., Any])


def not_converted(function: _F) -> _F:
    """`tf.autograph.experimental.do_not_convert(function)`, keeping its
    type: the engine's Python decides what a step traces (which loop, which
    reduction), so AutoGraph must not turn its `if`s into graph ops."""
    return cast(_F, tf.autograph.experimental.do_not_convert(function))
