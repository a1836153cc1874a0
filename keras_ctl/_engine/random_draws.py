"""The random numbers of a training step under several replicas:
`compile(random_draws=...)`.

- `"as_one_device"`: each example gets the numbers one device draws for
  it (`_replaced.random_rows.draw_rows_as_one_device`). Refused with XLA under several
  replicas: XLA draws other numbers than TensorFlow's kernels, and one
  device with `jit_compile=True` draws XLA's, which a replica cannot draw
  for its rows inside its compiled pass.
- `"per_replica"`: each replica draws its own, as Keras does.
- `None` (the default): one device's, except where XLA compiles the step
  under several replicas: each replica's own there, with a warning at the
  first training step that draws, once a compile.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from keras_ctl import _keras
from keras_ctl._engine import state as engine_state

MODES = (None, "as_one_device", "per_replica")


def as_one_device(model: Any) -> bool:
    """Whether `model`'s training steps draw one device's numbers."""
    mode = engine_state.of(model).random_draws
    if mode is None:
        return not _xla_under_replicas(model)
    return mode == "as_one_device"


def warns_of_replica_draws(model: Any) -> bool:
    """Whether a training step that draws is warned of: the default, which
    XLA under several replicas leaves each replica's own."""
    return engine_state.of(model).random_draws is None and _xla_under_replicas(model)


def check_with_xla(model: Any) -> None:
    """Refuses `"as_one_device"` where XLA compiles the step under several
    replicas."""
    if engine_state.of(model).random_draws != "as_one_device":
        return
    if not _xla_under_replicas(model):
        return
    replicas = model.distribute_strategy.num_replicas_in_sync
    raise ValueError(
        'compile(random_draws="as_one_device") draws one device\'s random '
        "numbers with TensorFlow's kernels; with XLA one device draws "
        "XLA's, which a replica cannot draw for its rows. Received: "
        f"jit_compile=True under {replicas} replicas. Pass "
        "jit_compile=False to draw as one device, or random_draws="
        '"per_replica" to keep XLA with each replica\'s own draws.'
    )


def warn_if_drawn(
    assigned: Iterable[tuple[Any, Any]], state: Any, replicas: int
) -> None:
    """Warns, once a compile, when `assigned` (a training replica step's
    `(variable, value)` writes) advances a seed generator: the step draws,
    and each replica draws its own numbers."""
    if state.random_draws_warned:
        return
    if not any(_keras.is_seed_state(variable) for variable, _ in assigned):
        return
    state.random_draws_warned = True
    warnings.warn(
        f"With jit_compile=True under {replicas} replicas, each replica draws "
        "its own random numbers in this training step (Dropout, noise, "
        "random augmentation, `keras.random` with a seed generator), so a "
        "seeded run ends elsewhere than on one device: XLA draws other "
        "numbers than TensorFlow's kernels, and a replica cannot draw one "
        "device's for its rows inside its compiled pass. Compile with "
        "jit_compile=False for one device's numbers, or with "
        'random_draws="per_replica" to keep XLA and silence this warning.',
        stacklevel=2,
    )


def _xla_under_replicas(model: Any) -> bool:
    xla = bool(model.jit_compile) and not model.run_eagerly
    return xla and model.distribute_strategy.num_replicas_in_sync > 1
