"""What each `fit()` call costs against keras.Model's: the first (traced
in the call), the second and third (reusing what the first traced), and
the steady step.

Candidates, on an MLP (784-256-256-10) and a transformer of `--blocks`
blocks (`keras_ctl.demos.models.transformer_block`, 16 tokens of 64),
Adam, sparse categorical cross-entropy from logits, an accuracy metric,
global batch `--batch`, under `MirroredStrategy` on `--replicas` logical
CPU devices (1: no strategy; one device set per process, so one count a
run):

- `keras`: `keras.Model`, its default step (the baseline), and
  `keras_again`, the same again (an A/A control: the noise floor);
- `ctl_default`: `CTLModel`'s default step;
- `ctl_train_step`: `CTLModel` with the `train_step` of the keras.io guide
  "Customizing what happens in fit()" (`compute_loss`,
  `optimizer.apply`, its metrics), measured as the run goes under
  several replicas (`keras_ctl/_engine/loss_mean.py`);
- `ctl_compute_loss`: `CTLModel` with a `compute_loss` of its own
  (`super().compute_loss` plus a mean penalty), measured likewise;
- with `--keras-own`, `keras_train_step`: `keras.Model` with the same
  `train_step`.

Each round builds a new model of each candidate, interleaved, and times
four `fit()` calls of one epoch on it: the first, second and third of
`--steps` steps, then one of `--long` steps, whose median step (timed by
Keras's batch callbacks) is the steady step. Reported:
each call's median wall time and the median of the per-round ratios
against `keras`; and, from the schedule itself
(`keras_ctl/_engine/measurement_schedule.py`), the share of steps
measured over a run of `--run` steps in one `fit()` call and in `fit()`
calls of `--steps` steps.

    python benchmarks/fit_calls.py [--replicas 2] [--models mlp,transformer]
        [--rounds 5] [--steps 16] [--long 80] [--batch 64] [--blocks 4]
        [--keras-own] [--out FILE.json]
"""

import argparse
import json
import os
import statistics
import sys
import time

# The keras.io guide's step as the suite's corpus holds it.
import step_size

CANDIDATES = (
    "keras",
    "ctl_default",
    "ctl_train_step",
    "ctl_compute_loss",
    "keras_again",
)
CALLS = ("first", "second", "third")


def parse():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--models", default="mlp,transformer")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--long", type=int, default=80)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--run", type=int, default=1000)
    parser.add_argument("--keras-own", action="store_true")
    parser.add_argument("--candidates", help="a comma-separated subset")
    parser.add_argument("--out")
    return parser.parse_args()


def model_class(candidate):
    import keras

    import keras_ctl

    if candidate in ("keras", "keras_again"):
        return keras.Model
    if candidate == "keras_train_step":
        return step_size.own_step(keras.Model)
    if candidate == "ctl_default":
        return keras_ctl.CTLModel
    if candidate == "ctl_train_step":
        return step_size.own_step(keras_ctl.CTLModel)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, **kw):
        loss = keras_ctl.CTLModel.compute_loss(self, x, y, y_pred, sample_weight, **kw)
        return loss + 1e-3 * keras.ops.mean(keras.ops.square(y_pred))

    return type("WithPenalty", (keras_ctl.CTLModel,), {"compute_loss": compute_loss})


def build(candidate, name, blocks, strategy):
    import contextlib

    import keras

    from keras_ctl.demos import models

    keras.utils.set_random_seed(0)
    scope = contextlib.nullcontext() if strategy is None else strategy.scope()
    with scope:
        cls = model_class(candidate)
        if name == "mlp":
            inputs = keras.Input((784,))
            h = keras.layers.Dense(256, activation="relu")(inputs)
            h = keras.layers.Dense(256, activation="relu")(h)
            model = cls(inputs, keras.layers.Dense(10)(h))
        else:
            model = models.transformer_block(cls, blocks=blocks)
        model.compile(
            keras.optimizers.Adam(1e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    return model


def data(name, rows):
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (784,) if name == "mlp" else (16, 64)
    x = rng.random((rows, *shape), dtype="float32")
    return x, rng.integers(0, 10, rows)


def fit_calls(model, x, y, batch, steps):
    """`([(wall, cpu)], (wall, cpu))`: the seconds of four `fit()` calls,
    three of `steps` steps and one of all of `x`, and the median seconds
    of a step of the fourth (from Keras's batch callbacks: the steps a
    measurement precedes are a few of many). CPU seconds are the
    process's (every thread's): on a shared machine they vary less than
    wall seconds."""
    import keras

    class StepTimes(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_train_batch_begin(self, batch, logs=None):
            self.start = (time.perf_counter(), time.process_time())

        def on_train_batch_end(self, batch, logs=None):
            now = (time.perf_counter(), time.process_time())
            self.times.append([b - a for a, b in zip(self.start, now)])

    times, step_times = [], StepTimes()
    for call, rows in enumerate((steps * batch,) * 3 + (len(x),)):
        wall, cpu = time.perf_counter(), time.process_time()
        model.fit(
            x[:rows],
            y[:rows],
            batch_size=batch,
            epochs=1,
            shuffle=False,
            verbose=0,
            callbacks=[step_times] if call == 3 else None,
        )
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    step = tuple(statistics.median(t[i] for t in step_times.times) for i in (0, 1))
    return times, step


def schedule_share(run, steps):
    """Steps measured over `run` steps: in one `fit()` call, and in calls
    of `steps` steps (the schedule's count)."""
    from keras_ctl._engine.measurement_schedule import MeasurementSchedule
    from keras_ctl._engine.state import EngineState

    counts = {}
    for label, per_call in (("one_call", run), ("calls_of_steps", steps)):
        engine = EngineState()
        schedule = MeasurementSchedule(engine)
        measured = 0
        for step in range(run):
            if step % per_call == 0:
                engine.calls += 1
            number = schedule.due("spec")
            if number is not None:
                measured += 1
                schedule.measured(number, "spec", True)
            schedule.ran(1)
        counts[label] = measured
    return counts


def main():
    args = parse()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    strategy = None
    if args.replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas
        )
        devices = [f"/cpu:{i}" for i in range(args.replicas)]
        strategy = tf.distribute.MirroredStrategy(devices)
    candidates = list(CANDIDATES)
    if args.keras_own:
        candidates.insert(1, "keras_train_step")
    if args.candidates:
        candidates = [c for c in candidates if c in args.candidates.split(",")]
    models = args.models.split(",")
    inputs = {name: data(name, args.long * args.batch) for name in models}
    kinds = (*CALLS, "step")
    times = {
        clock: {m: {c: {k: [] for k in kinds} for c in candidates} for m in models}
        for clock in ("wall", "cpu")
    }
    for r in range(args.rounds):
        for name in models:
            x, y = inputs[name]
            for candidate in candidates:
                model = build(candidate, name, args.blocks, strategy)
                calls, step = fit_calls(model, x, y, args.batch, args.steps)
                for i, clock in enumerate(("wall", "cpu")):
                    got = times[clock][name][candidate]
                    for call, seconds in zip(CALLS, calls):
                        got[call].append(seconds[i])
                    got["step"].append(step[i])
                del model
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr, flush=True)
        # Each round's report, so a run cut short keeps its rounds.
        report(args, models, candidates, times, r + 1)
    return 0


def report(args, models, candidates, times, rounds):
    kinds = (*CALLS, "step")
    shares = schedule_share(args.run, args.steps)
    summary = {}
    print(
        f"{args.replicas} replica(s), {rounds} rounds, fit() calls of "
        f"{args.steps} steps (steady step: the median of a call of {args.long}), "
        f"batch {args.batch}; median seconds (median of the per-round ratios "
        "to keras)"
    )
    for clock in ("wall", "cpu"):
        summary[clock] = {}
        for name in models:
            label = name if name == "mlp" else f"transformer ({args.blocks} blocks)"
            print(f"\n{label}, {clock} time")
            header = (*CALLS, "step (ms)")
            print(f"{'candidate':18}" + "".join(f"{k:>17}" for k in header))
            base = times[clock][name]["keras"]
            summary[clock][name] = {}
            for candidate in candidates:
                got = times[clock][name][candidate]
                row, cells = {}, []
                for kind in kinds:
                    median = statistics.median(got[kind])
                    ratio = statistics.median(
                        g / b for g, b in zip(got[kind], base[kind])
                    )
                    row[kind] = {"median_s": median, "ratio": ratio}
                    shown = median * 1e3 if kind == "step" else median
                    cells.append(f"{shown:.2f} (x{ratio:.2f})")
                summary[clock][name][candidate] = row
                print(f"{candidate:18}" + "".join(f"{c:>17}" for c in cells))
    print(
        f"\nsteps measured (a step of one's own, several replicas): "
        f"{shares['one_call']} of {args.run} in one fit() call "
        f"({shares['one_call'] / args.run:.1%}); {shares['calls_of_steps']} of "
        f"{args.run} in fit() calls of {args.steps} steps "
        f"({shares['calls_of_steps'] / args.run:.1%})"
    )
    if args.out:
        with open(args.out, "w") as f:
            result = {
                "args": vars(args),
                "rounds": rounds,
                "times": times,
                "summary": summary,
                "measured_steps": shares,
            }
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
