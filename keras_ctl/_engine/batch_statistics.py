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
from keras_ctl._example_dependence import marked_sources

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
    names = ", ".join(found)
    if mode == "global":
        raise ValueError(
            'compile(batch_statistics="global") computes the moments of '
            "`BatchNormalization` over the global batch, but this training "
            f"step also assigns {names} from each replica's own examples "
            f"(under {replicas} replicas), which keras_ctl cannot compute "
            f"over the global batch. {_OWN_STATISTIC}, or compile with "
            'batch_statistics="per_replica" to keep each replica\'s.'
            f"{_results_read(found)}"
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
        f"this warning.{_results_read(found)}",
        stacklevel=2,
    )


def _results_read(found: list[str]) -> str:
    """What the messages add when a metric's result read inside the step
    is among the sources of what `found` names."""
    if not any(_FROM in name for name in found):
        return ""
    return (
        " A metric's result read inside the step is the replica's own state "
        "(its variables hold the replica's examples' values): one device "
        "reads the global batch's. Read the metric's result in the logs the "
        "step returns (keras_ctl reduces them across replicas), or sum its "
        "state across replicas first (`keras_ctl.all_reduce_sum`)."
    )


_FROM = " (from the result of "


def _read_from(value: Any) -> str:
    """Which metrics' results read inside the step `value` is computed
    from, as the messages say it, or `""`."""
    sources = [s.removeprefix("the result of ") for s in marked_sources(value)]
    return f"{_FROM}{', '.join(sources)}, read inside the step)" if sources else ""


def from_metric_results(found: list[str]) -> list[str]:
    """Those of `found` (`per_replica`) read from metrics' results."""
    return [name for name in found if _FROM in name]


def per_replica(
    assigned: Iterable[tuple[Any, Any]], weights: Iterable[Any]
) -> list[str]:
    """The `weights` assigned a value that follows the replica's examples,
    in the order first assigned: each its path, and where the value was
    read from a metric inside the step, which metric
    (`_example_dependence.marked_sources`)."""
    watched = {id(w): w for w in weights}
    found: dict[int, str] = {}
    for variable, value in assigned:
        if id(variable) in watched and id(variable) not in found:
            if follows_the_examples(value):
                found[id(variable)] = f"`{variable.path}`" + _read_from(value)
    return list(found.values())
