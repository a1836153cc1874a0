"""The parity kit: prove that a model trains the same on 1 and on R replicas.

`assert_replica_invariant(build, x, y, batch_size=...)` trains the model
that `build()` returns on one device and under `MirroredStrategy` with each
replica count, each run in a fresh Python process (TensorFlow takes one
device set per process: logical CPU devices, or GPUs when there are
enough), and compares the weights, every `history` value and `evaluate()`.
It works from pytest and from a script.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import TypeAlias

import keras
import numpy as np

from keras_ctl._own_code import batch_statistics_in
from keras_ctl._own_code import is_users_own
from keras_ctl._own_code import marked_in_shares

__all__ = ["assert_replica_invariant", "known_to_differ"]

# A run's result, as `keras_ctl._parity_child` pickles it: `"weights"` (a
# list of arrays), `"history"` and `"evaluate"` (`{name: values}`) and
# `"known_to_differ"`.
_Result: TypeAlias = dict[str, Any]


def assert_replica_invariant(
    build: Callable[[], keras.Model],
    x: Any,
    y: Any = None,
    *,
    batch_size: int,
    replicas: Sequence[int] = (2, 3),
    epochs: int = 1,
    atol: float = 1e-5,
    floatx: str | None = None,
    seed: int = 0,
    timeout: float = 600,
    **fit_kwargs: Any,
) -> dict[int, dict[str, float]]:
    """Asserts that `build()`'s model trains the same on 1 and R replicas.

    Each run seeds Keras with `seed`, builds and compiles the model in the
    strategy's scope by calling `build()`, fits `x`/`y` with `batch_size` as
    the *global* batch (`shuffle=False`), then evaluates on the same data.
    float32 round-off grows with training (about 1e-4 after some hundred
    SGD steps on a CNN); pass `floatx="float64"` to tell round-off from a
    logic error: an exact step then differs by about 1e-15.

    Args:
        build: A module-level function with no arguments that returns a
            compiled model (called in each process, in the strategy scope).
            In a script, guard the script's own work with
            `if __name__ == "__main__":`.
        x: Training inputs: NumPy arrays (or dicts/lists of them).
        y: Training targets, like `x`. Defaults to `None` (in `x`).
        batch_size: Global batch size.
        replicas: Replica counts to compare with one device. Defaults to
            `(2, 3)`.
        epochs: Defaults to `1`.
        atol: Largest absolute difference allowed. Defaults to `1e-5`.
        floatx: Keras float type of every run (e.g. `"float64"`). Defaults
            to `None` (Keras's default).
        seed: Seed of every run. Defaults to `0`.
        timeout: Seconds each run may take. Defaults to `600`.
        **fit_kwargs: More `fit()` arguments (e.g. `sample_weight`).

    Returns:
        The report: `{replicas: {value: largest difference}}`, where a value
        is `"weights"`, `"history/<name>"` or `"evaluate/<name>"`.

    Raises:
        AssertionError: with a table of the values that differ by more than
            `atol` (replica count, value, one device, R replicas, difference),
            followed by the parts of the model known to differ from one
            device and what to do about each (`known_to_differ`).
        RuntimeError: when a run fails; its output ends the message.

    Example:

    ```python
    # test_parity.py
    import keras
    import numpy as np
    import keras_ctl
    from keras_ctl.testing import assert_replica_invariant

    def build():
        inputs = keras.Input((8,))
        outputs = keras.layers.Dense(3)(inputs)
        model = keras_ctl.CTLModel(inputs, outputs)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer="sgd", loss=loss)
        return model

    def test_my_model_is_replica_invariant():
        x = np.random.default_rng(0).random((101, 8), dtype="float32")
        y = (x[:, 0] * 3).astype("int32")
        assert_replica_invariant(build, x, y, batch_size=16, epochs=2)
    ```

    ```bash
    pytest test_parity.py
    ```
    """
    counts = [int(r) for r in replicas]
    if not counts or any(r < 1 for r in counts):
        raise ValueError(
            "Expected `replicas` to list replica counts >= 1. Received: "
            f"replicas={replicas!r}."
        )
    if batch_size < 1:
        raise ValueError(
            f"Expected `batch_size` >= 1. Received: batch_size={batch_size}."
        )
    with tempfile.TemporaryDirectory() as folder:
        job = {
            "build": _where(build),
            "x": x,
            "y": y,
            "batch_size": int(batch_size),
            "epochs": int(epochs),
            "floatx": floatx,
            "seed": int(seed),
            "fit_kwargs": fit_kwargs,
        }
        job_path = os.path.join(folder, "job.pkl")
        with open(job_path, "wb") as f:
            pickle.dump(job, f)
        runs = {r: _run(job_path, r, folder, timeout) for r in [1, *counts]}
    report = {r: _differences(runs[1], runs[r]) for r in counts}
    failures = [
        (r, value, runs[1], runs[r], difference)
        for r, differences in report.items()
        for value, difference in differences.items()
        if not difference <= atol  # NaN fails too
    ]
    if failures:
        raise AssertionError(
            _table(failures, atol) + _explained(runs[1].get("known_to_differ", []))
        )
    return report


def _where(build: Callable[[], keras.Model]) -> tuple[str, str | None, str]:
    """How a child process finds `build`: `(module, file, qualname)`."""
    if not callable(build) or "<locals>" in getattr(build, "__qualname__", "<locals>"):
        raise ValueError(
            "Expected `build` to be a module-level function (each run imports "
            f"it in a new process). Received: build={build!r}."
        )
    module = sys.modules.get(build.__module__)
    path = getattr(module, "__file__", None)
    return build.__module__, path, build.__qualname__


def _run(job_path: str, replicas: int, folder: str, timeout: float) -> _Result:
    out = os.path.join(folder, f"result_{replicas}.pkl")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    # The child finds the caller's modules where the caller does.
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    command = [
        sys.executable,
        "-m",
        "keras_ctl._parity_child",
        job_path,
        str(replicas),
        out,
    ]
    try:
        result = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as error:
        raise RuntimeError(
            f"The run on {replicas} replica(s) took more than timeout={timeout} s."
        ) from error
    if result.returncode != 0:
        raise RuntimeError(
            f"The run on {replicas} replica(s) failed (exit code "
            f"{result.returncode}):\n{result.stderr[-4000:]}"
        )
    with open(out, "rb") as f:
        loaded: _Result = pickle.load(f)
    return loaded


def _differences(expected: _Result, got: _Result) -> dict[str, float]:
    differences = {
        "weights": max(
            (
                float(np.max(np.abs(g - e)))
                for g, e in zip(got["weights"], expected["weights"])
            ),
            default=0.0,
        )
    }
    for part in ("history", "evaluate"):
        for name, value in expected[part].items():
            other = got[part].get(name)
            if other is None or np.shape(other) != np.shape(value):
                differences[f"{part}/{name}"] = float("inf")
            else:
                differences[f"{part}/{name}"] = float(
                    np.max(np.abs(np.asarray(other) - np.asarray(value)))
                )
    return differences


def _shown(run: _Result, value: str) -> str:
    if value == "weights":
        return "(all weights)"
    part, name = value.split("/", 1)
    found = run[part].get(name)
    if found is None:
        return "missing"
    return np.array2string(np.asarray(found), precision=6, separator=", ")


def _table(
    failures: Sequence[tuple[int, str, _Result, _Result, float]], atol: float
) -> str:
    lines = [
        f"Training differs from one device by more than atol={atol}:",
        "",
        "| replicas | value | one device | R replicas | difference |",
        "|---|---|---|---|---|",
    ]
    for replicas, value, one, run, difference in failures:
        lines.append(
            f"| {replicas} | {value} | {_shown(one, value)} | {_shown(run, value)} "
            f"| {difference:.3g} |"
        )
    return "\n".join(lines)


def known_to_differ(model: keras.Model, batch: Any = None) -> list[tuple[str, str]]:
    """The parts of `model` known to train differently on R replicas than
    on one device, each with what to do: `[(where, why and what to do)]`.

    The parity kit adds them to its failure message; a model may differ
    for other reasons too. Given a `batch`, a `compute_loss` of the model's
    own is also measured: its loss on the whole batch against its loss on
    each half, weighed by the halves' sizes, and their sum. A mean over
    examples, and a sum over examples (read in shares), replicas compute
    exactly; a loss that couples the batch's examples (in-batch negatives,
    a count of positives) is entered with the numbers measured and the
    remedy.

    Args:
        model: A built `keras.Model`.
        batch: Optional `(x, y)` or `(x, y, sample_weight)` of NumPy arrays
            or tensors (dicts and lists of them too), with at least two
            examples: the batch to measure `compute_loss` on. The model's
            variables and metrics are as they were afterwards.

    Returns:
        `[(where, why and what to do)]`, empty when nothing known differs.

    Example:

    ```python
    with strategy.scope():
        hidden = keras.layers.BatchNormalization()(keras.layers.Flatten()(inputs))
        model = keras_ctl.CTLModel(inputs, keras.layers.Dense(10)(hidden))
    for where, advice in keras_ctl.testing.known_to_differ(model, (x[:32], y[:32])):
        print(f"{where}: {advice}")  # batch_normalization (BatchNormalization): ...
    ```
    """
    from keras_ctl import _keras
    from keras_ctl._engine import random_draws
    from keras_ctl._engine import state as engine_state
    from keras_ctl.model import CTLModel

    found = []
    if not isinstance(model, CTLModel):
        found.append(
            (
                type(model).__name__,
                "a plain `keras.Model`: its loss is a mean over each replica's "
                "examples. Convert it with `keras_ctl.CTLModel.from_model(model)` "
                "or subclass `keras_ctl.CTLModel`.",
            )
        )
    else:
        methods = ["train_step", "test_step", "compute_loss"]
        if engine_state.of(model).compute_loss_over == "global_batch":
            methods.remove("compute_loss")  # it computes one device's loss
        for method in methods:
            if is_users_own(model, method):
                found.append(
                    (f"{type(model).__name__}.{method}", _own(model, method, batch))
                )
    engine = engine_state.of(model)
    global_statistics = engine.batch_statistics == "global"
    for layer in _keras.all_layers(model):
        one_device = random_draws.as_one_device(model)
        why = _layer_difference(layer, one_device, global_statistics)
        if why:
            found.append((f"{layer.name} ({type(layer).__name__})", why))
    return found


def _own(model: keras.Model, method: str, batch: Any) -> str:
    """Why the user's own `method` of `model` may differ, and what to do."""
    if method == "compute_loss":
        measured = _measured_loss(model, batch) if batch is not None else None
        return measured or _OWN_LOSS
    if marked_in_shares(model, method):
        return "a step of your own declared `written_in_shares`, " + _SHARES
    return _OWN_STEP + _statistics_named(model, method)


def _statistics_named(model: keras.Model, method: str) -> str:
    """The lines of the step that may take a statistic of the whole batch."""
    import os

    found = batch_statistics_in(model, method)
    if not found:
        return ""
    lines = "; ".join(
        f"{os.path.basename(file)}:{line} `{code}`" for file, line, code in found
    )
    return (
        " Lines that may take a statistic of the whole batch, which each "
        f"replica takes of its part only: {lines}. For one device's, gather "
        "the rows with `keras_ctl.all_gather`, or reduce with "
        "`keras_ctl.global_mean`."
    )


_OWN_STEP = (
    "a step of your own is read as one device's code on each replica's "
    "part of the batch, weighed by that part: means over the batch, Keras "
    "`Loss` objects, `self.compute_loss`, `self.losses` and metrics are one "
    "device's. A sum over examples, or a statistic coupling the batch's "
    "examples (in-batch negatives, a masked mean over a count of entries), "
    "covers the replica's part only: use `keras_ctl.global_mean` with "
    "weights, or gather the rows with `keras_ctl.all_gather`."
)

_SHARES = (
    "runs as written: a mean over this replica's examples (`ops.mean`, "
    "`tf.reduce_mean`) is not one device's mean. Use Keras `Loss` objects, "
    "`self.compute_loss(...)` or `keras_ctl.global_mean`; log values with "
    "`keras_ctl.ReplicaSum`/`ExampleMean` or Keras metrics. A loss coupling "
    "the batch's examples (in-batch negatives, a batch statistic) sees the "
    "replica's only: gather them with `keras_ctl.all_gather`. Without the "
    "declaration, the step is read as one device's code."
)

_OWN_LOSS = (
    "a `compute_loss` of your own is read as on one device, the loss of "
    "the replica's batch, weighed by the replica's share of the global "
    "batch: means over the batch, Keras `Loss` objects, "
    "`super().compute_loss` and `self.losses` are one device's. A sum over "
    "examples (`ops.sum` of per-example losses) is read in shares where the "
    "first batch measures one (each replica's sum summed as it is). A "
    "statistic coupling the batch's examples (in-batch negatives, a count of "
    "positives) covers only the replica's and is refused when measured. "
    'Compiled with `compute_loss_over="global_batch"`, it sees the '
    "global batch and both are one device's."
)


def _measured_loss(model: keras.Model, batch: Any) -> str | None:
    """How the model's `compute_loss` on `batch` differs from a mean or a
    sum over examples (each read as one device's), with the remedy; `None`
    when it is one (to 1e-5)."""
    from keras_ctl._engine import loss_mean
    from keras_ctl._engine import measuring

    rows = measuring.examples_in(batch)
    if rows < 2:
        raise ValueError(
            "Expected `batch` to hold at least two examples (its halves are "
            f"compared). Received: a batch of {rows} example(s)."
        )
    measured = loss_mean.measure(model, batch)
    if measured is None or measured.is_mean or measured.is_sum:
        return None
    return (
        f"a `compute_loss` of your own: {measured}, which each replica "
        "computes on its part of the batch only. Compile with "
        '`compute_loss_over="global_batch"`: it then sees the global batch, '
        "and trains as on one device."
    )


def _layer_difference(
    layer: keras.layers.Layer,
    draws_as_one_device: bool = False,
    global_statistics: bool = False,
) -> str | None:
    import keras

    if (
        isinstance(layer, keras.layers.BatchNormalization)
        and not getattr(layer, "synchronized", False)
        and not global_statistics
    ):
        return (
            "batch statistics of each replica's examples in training. Compile "
            'with `batch_statistics="global"` (or pass `synchronized=True` to '
            "the layer) for the global batch's."
        )
    if hasattr(layer, "seed_generator") and not draws_as_one_device:
        return (
            "random draws (dropout, noise, augmentation), made on each "
            'replica. Compile with `random_draws="as_one_device"` (the '
            "default, without `jit_compile=True`) for one device's numbers on "
            "any replica count."
        )
    if getattr(layer, "activity_regularizer", None) is not None:
        return (
            "an activity regularizer, which Keras divides by the replica's own "
            "batch size. Use a weight regularizer or `add_loss` of a "
            "`keras_ctl.global_mean`."
        )
    return None


def _explained(known: Sequence[tuple[str, str]]) -> str:
    if not known:
        return ""
    lines = ["", "", "Known to differ from one device:"]
    lines += [f"- {where}: {why}" for where, why in known]
    return "\n".join(lines)
