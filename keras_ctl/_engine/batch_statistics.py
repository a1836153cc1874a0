"""Batch statistics kept in state: what a training step under several
replicas assigns to the model's variables from its replica's examples.

On one device a `BatchNormalization`'s moving statistics, an EMA
codebook or a running mean are statistics of the global batch; under R
replicas each replica computes its own part's. Which values those are is
read from what runs (`_example_dependence`): a value assigned to one of
the model's weights that follows the replica's examples, not through a
collective. `compile(batch_statistics=...)` decides:

- `"global"`: moments over the examples' axis are the global batch's
  (every `BatchNormalization`, its moving statistics with them); a
  statistic still computed from the replica's examples alone is refused
  by name, because keras_ctl cannot compute it over the global batch.
- `"per_replica"`: each replica's own, as Keras computes them.
- `None` (the default): each replica's own, with a warning that names the
  variables and both choices, once a model.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from keras_ctl._example_dependence import follows_the_examples

MODES = (None, "global", "per_replica")
# What makes a statistic of the user's own global.
_OWN_STATISTIC = (
    "Compute the statistic from values summed or gathered across replicas "
    "(`keras_ctl.all_reduce_sum`, `keras_ctl.all_gather`)"
)


def check(
    assigned: Iterable[tuple[Any, Any]],
    weights: Iterable[Any],
    mode: str | None,
    state: Any,
    replicas: int,
) -> None:
    """Warns of (or, with `mode="global"`, refuses) the batch statistics
    among `assigned`, this replica step's `(variable, value)` writes.

    Args:
        assigned: The writes of one training replica step.
        weights: The model's weights: only they hold a layer's statistics
            (an optimizer's or a metric's variables are not among them).
        mode: `compile(batch_statistics=...)`.
        state: The model's `EngineState` (a warning is given once).
        replicas: The number of replicas.
    """
    if mode == "per_replica" or (mode is None and state.batch_statistics_warned):
        return
    found = per_replica(assigned, weights)
    if not found:
        return
    names = ", ".join(f"`{path}`" for path in found)
    if mode == "global":
        raise ValueError(
            'compile(batch_statistics="global") computes the moments of '
            "`BatchNormalization` over the global batch, but this training "
            f"step also assigns {names} from each replica's own examples "
            f"(under {replicas} replicas), which keras_ctl cannot compute "
            f"over the global batch. {_OWN_STATISTIC}, or compile with "
            'batch_statistics="per_replica" to keep each replica\'s.'
        )
    state.batch_statistics_warned = True
    warnings.warn(
        f"Under {replicas} replicas, this training step assigns {names} from "
        "each replica's own examples: batch statistics (moving statistics, "
        "an EMA) that one device computes over the global batch. Compile with "
        'batch_statistics="global" for the global batch\'s: every '
        "`BatchNormalization` then synchronizes its moments (one all-reduce a "
        "layer and step), and a statistic of your own is refused by name: "
        f"{_OWN_STATISTIC.lower()}. Or compile with "
        'batch_statistics="per_replica" to keep each replica\'s and silence '
        "this warning.",
        stacklevel=2,
    )


def per_replica(
    assigned: Iterable[tuple[Any, Any]], weights: Iterable[Any]
) -> list[str]:
    """The paths of the `weights` assigned a value that follows the
    replica's examples, in the order first assigned."""
    watched = {id(w): w for w in weights}
    found: dict[int, str] = {}
    for variable, value in assigned:
        if id(variable) in watched and id(variable) not in found:
            if follows_the_examples(value):
                found[id(variable)] = variable.path
    return list(found.values())
