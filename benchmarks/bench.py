"""Speed of CTLModel.fit against keras.Model.fit and hand-written loops.

Candidates, on the Keras guide's MLP (784-64-64-10), the TensorFlow
tutorial's CNN (28x28x1) and one transformer block (16 tokens of 64, with
`--models`), global batch 64, Adam, for each of `--replicas`
(1, 2, 4 or 8; `MirroredStrategy`, logical CPU devices when there are no
GPUs; at most one count above 1 per run),
`steps_per_execution` 1 and 32, XLA off and on:

- `CTLModel.fit` and `keras.Model.fit` with an accuracy metric;
- the hand-written `@tf.function` loop: the Keras guide's ("Writing a
  training loop from scratch") on one replica, the TensorFlow tutorial's
  `strategy.run` loop ("Custom training with tf.distribute.Strategy") on two.
  It has no `steps_per_execution`; with XLA it compiles the forward and
  backward pass (the optimizer's cross-replica update cannot be compiled).

Then what exactness costs on several replicas: the all-reduce of the global
count (two custom steps that differ only in the loss denominator,
`keras_ctl.global_mean`, all-reduced every step, and
`tf.nn.compute_average_loss(..., global_batch_size=64)`, a constant), and
clipping the summed gradient (`CTLModel.fit` with and without
`global_clipnorm`), gradient accumulation (steps/s with
`gradient_accumulation_steps=4` against without, and the collectives of an
accumulating and of an updating step, counted in the traced graph), and
what a `fit()` call costs beyond its steps.

Then the collectives per step (round trips between workers) of
`CTLModel.fit`, `evaluate` and `GAN.fit` against the hand-written loops,
counted in the traced step graphs and weighted by how often each runs, at
`steps_per_execution` 1, 8 and 32, on each `--replicas` count and under
`--workers` local worker processes (`benchmarks/collectives.py`):
deterministic where timings of several worker processes on a few cores are
not; the workers' timings (`CTLModel.fit` with and without a metric
against the hand loop, `--rounds` interleaved rounds) are reported beside
them.

Last, `CTLModel.fit` steps/s under `ParameterServerStrategy` with
`--ps-workers` local workers and one parameter server (each cluster in its
own processes: these rates are not interleaved with the others; compare
them with the MLP's 2-replica `CTLModel.fit` row).

These machines are noisy, so the candidates of one configuration are
interleaved within each round (one epoch each, after a warm-up epoch that
traces and compiles), the rounds are repeated, and the tables quote median
steps/s and the median of the per-round ratios.

Usage (from the repository's root; the code stays out of the installed
package):

    python benchmarks/bench.py [--models mlp,cnn,transformer_block]
        [--replicas 1,2|1,4|1,8] [--workers 2,4] [--ps-workers 1,2]
        [--fit-only] [--rounds 5] [--steps 50] [--out DIR]
"""

import argparse
import datetime
import os
import pathlib
import platform
import statistics
import sys
import time
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

from keras_ctl import blocks
from keras_ctl import strategies
from keras_ctl.demos import models
from keras_ctl.demos import plots
from keras_ctl.model import CTLModel
from keras_ctl.outputs import ReplicaSum

HERE = pathlib.Path(__file__).resolve().parent
BATCH = 64
ACCUMULATION = 4  # gradient_accumulation_steps of the accumulation rows


def cnn(model_class):
    inputs = keras.Input((28, 28, 1))
    x = keras.layers.Conv2D(32, 3, activation="relu")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(64, 3, activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    return model_class(inputs, keras.layers.Dense(10)(x))


mlp = models.guide_mlp
transformer_block = models.transformer_block
MODELS = {
    "mlp": (mlp, (784,)),
    "cnn": (cnn, (28, 28, 1)),
    "transformer_block": (transformer_block, (16, 64)),
}


class ExactCount(CTLModel):
    """Divides the loss by the all-reduced global count (exact)."""

    def mean_loss(self, per_example):
        return blocks.global_mean(per_example)

    @blocks.written_in_shares
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            per_example = keras.losses.sparse_categorical_crossentropy(
                y, self(x, training=True), from_logits=True
            )
            loss = self.mean_loss(per_example)
        blocks.minimize(loss, self.trainable_weights, self.optimizer, tape)
        return {"step_loss": ReplicaSum(loss)}


class FixedBatch(ExactCount):
    """Divides by a constant global batch size: no collective."""

    def mean_loss(self, per_example):
        return tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)


def make_data(shape, steps):
    rng = np.random.default_rng(0)
    x = rng.random((steps * BATCH, *shape), dtype=np.float32)
    y = rng.integers(0, 10, steps * BATCH).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).cache()


def fit_candidate(
    model_class, build, dataset, strategy, spe, xla, metrics=True, **optimizer_options
):
    """An epoch of `fit()`, or "fails (Error)" when the warm-up epoch fails."""
    model = compiled(
        model_class, build, strategy, spe, xla, metrics, **optimizer_options
    )
    return _warmed_up(lambda: model.fit(dataset, epochs=1, verbose=0))


def compiled(model_class, build, strategy, spe, xla, metrics=True, **optimizer_options):
    """`build(model_class)` compiled as every candidate is (Adam 1e-3)."""
    with strategy.scope():
        model = build(model_class)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3, **optimizer_options),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"] if metrics else None,
            steps_per_execution=spe,
            jit_compile=xla,
        )
    return model


def loop_candidate(build, dataset, strategy, xla, wrap_step=None):
    """The guides' hand-written loop, one `tf.function` call per step
    (`wrap_step(step)`, when given, is called instead: a timer)."""
    with strategy.scope():
        model = build(keras.Model)
        optimizer = keras.optimizers.Adam(1e-3)
        accuracy = keras.metrics.SparseCategoricalAccuracy()
        optimizer.build(model.trainable_weights)

    def forward_backward(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            per_example = keras.losses.sparse_categorical_crossentropy(
                y, logits, from_logits=True
            )
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)
        return loss, logits, tape.gradient(loss, model.trainable_weights)

    if xla:
        forward_backward = tf.function(forward_backward, jit_compile=True)

    def train_step(x, y):
        loss, logits, gradients = forward_backward(x, y)
        optimizer.apply(gradients, model.trainable_weights)
        accuracy.update_state(y, logits)
        return loss

    @tf.function
    def distributed_train_step(x, y):
        losses = strategy.run(train_step, args=(x, y))
        return strategy.reduce("SUM", losses, axis=None)

    batches = strategy.experimental_distribute_dataset(dataset)
    step = wrap_step(distributed_train_step) if wrap_step else distributed_train_step

    def run_epoch():
        for x, y in batches:
            step(x, y)
        accuracy.result()
        accuracy.reset_state()

    return _warmed_up(run_epoch)


def _warmed_up(run_epoch):
    try:
        run_epoch()  # trace and compile
    except Exception as error:  # stock Keras fails in some configurations
        return f"fails ({type(error).__name__})"
    return run_epoch


def race(candidates, steps, rounds):
    """Steps/s per round of each runnable candidate, interleaved."""
    runnable = {name: run for name, run in candidates.items() if callable(run)}
    rates = {name: [] for name in runnable}
    for _ in range(rounds):
        for name, run_epoch in runnable.items():
            start = time.perf_counter()
            run_epoch()
            rates[name].append(steps / (time.perf_counter() - start))
    return rates


def median_ratio(rates, a, b):
    if a not in rates or b not in rates:
        return None
    return statistics.median(x / y for x, y in zip(rates[a], rates[b]))


def measure_fit(args, strategy_for):
    """One row per model, replicas, steps_per_execution and XLA setting."""
    rows = []
    for model_name in args.models:
        build, shape = MODELS[model_name]
        dataset = make_data(shape, args.steps)
        for replicas in args.replicas:
            strategy = strategy_for[replicas]
            for spe in (1, 32):
                for xla in (False, True):
                    candidates = {
                        "ctl": fit_candidate(
                            CTLModel, build, dataset, strategy, spe, xla
                        ),
                        "keras": fit_candidate(
                            keras.Model, build, dataset, strategy, spe, xla
                        ),
                        "loop": loop_candidate(build, dataset, strategy, xla),
                    }
                    rates = race(candidates, args.steps, args.rounds)
                    row = {
                        "model": model_name,
                        "replicas": replicas,
                        "spe": spe,
                        "xla": xla,
                        "ctl/keras": median_ratio(rates, "ctl", "keras"),
                        "ctl/loop": median_ratio(rates, "ctl", "loop"),
                    }
                    for name, candidate in candidates.items():
                        row[name] = (
                            statistics.median(rates[name])
                            if name in rates
                            else candidate
                        )
                    rows.append(row)
                    print(format_fit_row(row), flush=True)
    return rows


def measure_all_reduce(args, strategy):
    """What exactness costs, MLP, several replicas: the global count's
    all-reduce (two custom steps differing only in the denominator) and
    clipping the summed gradient (`CTLModel.fit` with and without
    `global_clipnorm`), no metric."""
    rows = []
    dataset = make_data((784,), args.steps)
    for spe in (1, 32):

        def candidate(model_class, spe=spe, **options):
            return fit_candidate(
                model_class, mlp, dataset, strategy, spe, False, False, **options
            )

        candidates = {
            "exact": candidate(ExactCount),
            "fixed": candidate(FixedBatch),
            "plain": candidate(CTLModel),
            "clipped": candidate(CTLModel, global_clipnorm=1.0),
            "accumulated": candidate(
                CTLModel, gradient_accumulation_steps=ACCUMULATION
            ),
        }
        rates = race(candidates, args.steps, args.rounds)
        row = {name: statistics.median(rates[name]) for name in candidates}
        row.update(
            replicas=strategy.num_replicas_in_sync,
            spe=spe,
            cost=1.0 - median_ratio(rates, "exact", "fixed"),
            clipping_cost=1.0 - median_ratio(rates, "clipped", "plain"),
            accumulation_ratio=median_ratio(rates, "accumulated", "plain"),
        )
        rows.append(row)
        print(format_all_reduce_row(row), flush=True)
    return rows


def _reduces(nodes, replicas):
    """All-reduces among `nodes`: one op per replica each, on one machine."""
    ops = [node.op for node in nodes]
    return sum(op.startswith("CollectiveReduce") for op in ops) // replicas


def count_accumulation_collectives(strategy, steps=ACCUMULATION):
    """Collectives of `CTLModel.fit`'s step, MLP, no metric, with
    `gradient_accumulation_steps` and without: `{"accumulating step",
    "updating step", "step without accumulation"}`, counted in the traced
    graph (one collective op per replica on one machine)."""
    dataset = make_data((784,), steps)
    counts = {}
    for options in ({"gradient_accumulation_steps": steps}, {}):
        with strategy.scope():
            model = mlp(CTLModel)
            model.compile(
                optimizer=keras.optimizers.Adam(1e-3, **options),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        model.fit(dataset, epochs=1, verbose=0)
        graph = model.train_function.graphs()[0].as_graph_def()
        replicas = strategy.num_replicas_in_sync
        # An accumulating step's logs; a plain step's one collective.
        top_level = _reduces(graph.node, replicas)
        if options:
            branches = [_reduces(f.node_def, replicas) for f in graph.library.function]
            counts["accumulating step"], counts["updating step"] = sorted(
                c for c in branches if c
            )
        else:
            counts["step without accumulation"] = top_level
    return counts


def measure_call_cost(args, strategy):
    """Seconds a one-epoch `fit()` call (a hand loop's epoch) costs beyond
    its steps, MLP: from epochs of 4 and of `4 + --steps` steps, interleaved.
    Mostly opening the multi-device iterator of the epoch."""
    sizes = {"short": 4, "long": 4 + args.steps}
    data = {size: make_data((784,), steps) for size, steps in sizes.items()}
    makers = {
        "ctl": lambda d: fit_candidate(CTLModel, mlp, d, strategy, 1, False),
        "keras": lambda d: fit_candidate(keras.Model, mlp, d, strategy, 1, False),
        "loop": lambda d: loop_candidate(mlp, d, strategy, False),
    }
    runs = {
        (name, size): make(data[size])
        for name, make in makers.items()
        for size in sizes
    }
    # One "step" per epoch: the race's rates are epochs per second.
    rates = race(runs, 1, args.rounds)
    row = {"replicas": strategy.num_replicas_in_sync}
    for name in makers:
        if (name, "short") not in rates or (name, "long") not in rates:
            row[name] = runs[(name, "short")]
            continue
        costs = []
        for short, long in zip(rates[(name, "short")], rates[(name, "long")]):
            per_step = (1 / long - 1 / short) / args.steps
            costs.append(1 / short - sizes["short"] * per_step)
        row[name] = statistics.median(costs)
    print(format_call_cost_row(row), flush=True)
    return [row]


FIT_HEADER = (
    "| model | replicas | steps_per_execution | XLA | CTLModel.fit steps/s | "
    "keras.Model.fit steps/s | hand loop steps/s | CTLModel / keras "
    "(median ratio) | CTLModel / hand loop (median ratio) |\n"
    "|---|---|---|---|---|---|---|---|---|"
)
ALL_REDUCE_HEADER = (
    "| replicas | steps_per_execution | exact count steps/s | fixed batch "
    "steps/s | all-reduce cost (1 - median ratio) | CTLModel.fit steps/s | "
    "with global_clipnorm steps/s | clipping cost (1 - median ratio) | "
    f"with gradient_accumulation_steps={ACCUMULATION} steps/s | accumulated / "
    "plain (median ratio) |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


CALL_COST_HEADER = (
    "| replicas | CTLModel.fit s per call | keras.Model.fit s per call | hand "
    "loop s per epoch |\n|---|---|---|---|"
)


def _cell(value, digits):
    if isinstance(value, str):
        return value
    return "-" if value is None else f"{value:.{digits}f}"


def _figure(value):
    """A rate or ratio to 3 significant digits: a slow round's 0.4 steps/s
    (or ratio 0.004) is not printed as 0."""
    if value is None or isinstance(value, str):
        return _cell(value, 0)
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def format_fit_row(row):
    return (
        f"| {row['model']} | {row['replicas']} | {row['spe']} | "
        f"{'on' if row['xla'] else 'off'} | {_figure(row['ctl'])} | "
        f"{_figure(row['keras'])} | {_figure(row['loop'])} | "
        f"{_figure(row['ctl/keras'])} | {_figure(row['ctl/loop'])} |"
    )


def format_all_reduce_row(row):
    return (
        f"| {row['replicas']} | {row['spe']} | {_figure(row['exact'])} | "
        f"{_figure(row['fixed'])} | {100 * row['cost']:.1f} % | "
        f"{_figure(row['plain'])} | "
        f"{_figure(row['clipped'])} | {100 * row['clipping_cost']:.1f} % | "
        f"{_figure(row['accumulated'])} | {row['accumulation_ratio']:.2f} |"
    )


def format_accumulation_counts(counts):
    return (
        f"Collectives of one step (CTLModel.fit, MLP, gradient_accumulation_steps"
        f"={ACCUMULATION}): accumulating {counts['accumulating step']} (the "
        f"count), updating {counts['updating step']} (the count, then the "
        f"gradients), without accumulation {counts['step without accumulation']}"
        " (gradients, count and logs together); besides, an accumulating "
        "step's logs take one per call. Gradient all-reduces per update: 1."
    )


def format_call_cost_row(row):
    return (
        f"| {row['replicas']} | {_cell(row['ctl'], 3)} | {_cell(row['keras'], 3)} "
        f"| {_cell(row['loop'], 3)} |"
    )


def measure_collectives(workers, rounds, steps):
    """Collectives per step, and timings of `rounds` interleaved rounds of
    `steps`, under `workers` local worker processes: `(counts, timings)`."""
    counts, timings = _run_job(
        ["--workers", workers],
        HERE / "collectives.py",
        lambda out: [out[0], "--timings", out[1]],
        outputs=2,
        rounds=rounds,
        steps=steps,
    )
    return counts, timings


def measure_parameter_servers(workers, rounds, steps):
    """Median steps/s of `CTLModel.fit` (MLP) under `ParameterServerStrategy`
    with `workers` local workers and one parameter server."""
    (result,) = _run_job(
        ["--workers", workers, "--ps", 1],
        HERE / "parameter_servers.py",
        lambda out: [out[0]],
        outputs=1,
        rounds=rounds,
        steps=steps,
    )
    return result["steps_per_s"]


def count_collectives(replicas):
    """Collectives per step on `replicas` local replicas, counted in a
    fresh process (one device set a process)."""
    (counts,) = _run_job(
        None,
        HERE / "collectives.py",
        lambda out: [out[0], "--replicas", replicas],
        outputs=1,
        rounds=1,
        steps=1,
    )
    return counts


def _run_job(cluster, script, output_args, outputs, rounds, steps):
    """Runs `python script` under the local launcher with `cluster` flags
    (alone when `None`); returns the JSON files it wrote (`output_args`
    places them)."""
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        paths = [os.path.join(folder, f"{i}.json") for i in range(outputs)]
        command = []
        if cluster is not None:
            command += [sys.executable, "-m", "keras_ctl_launch", *cluster]
            command += ["--timeout", 1200, "--"]
        command += [sys.executable, script]
        command += output_args(paths)
        command += ["--rounds", rounds, "--steps", steps]
        subprocess.run(
            [str(part) for part in command],
            check=True,
            capture_output=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        )
        results = []
        for path in paths:
            with open(path) as f:
                results.append(json.load(f))
        return results


PARAMETER_SERVERS_HEADER = (
    "| workers (1 parameter server) | CTLModel.fit steps/s |\n|---|---|"
)


COLLECTIVES_HEADER = (
    "| where | candidate | steps_per_execution 1 | 8 | 32 | its hand loop "
    "(any) |\n|---|---|---|---|---|---|"
)
HAND_LOOPS = {
    "CTLModel.fit, accuracy": "hand loop train step, accuracy",
    "CTLModel.fit": "hand loop train step, accuracy",
    "CTLModel.fit, data of unknown length": "hand loop train step, accuracy",
    "CTLModel.fit, Dropout": "hand loop train step, accuracy",
    "CTLModel.fit, Dropout, per-replica draws": "hand loop train step, accuracy",
    "CTLModel.evaluate, accuracy": "hand loop eval step, accuracy",
    "CTLModel.evaluate": "hand loop eval step, accuracy",
    "GAN.fit": "hand GAN step",
}


WORKER_TIMINGS_HEADER = (
    "| workers | CTLModel.fit, accuracy steps/s | CTLModel.fit steps/s | hand "
    "loop steps/s | CTLModel.fit, accuracy / hand loop (median ratio) | "
    "CTLModel.fit / hand loop (median ratio) |\n|---|---|---|---|---|---|"
)


def format_worker_timings_row(workers, t):
    return (
        f"| {workers} | {_figure(t['CTLModel.fit, accuracy'])} | "
        f"{_figure(t['CTLModel.fit'])} | {_figure(t['hand loop'])} | "
        f"{_figure(t['CTLModel.fit, accuracy / hand loop'])} "
        f"| {_figure(t['CTLModel.fit / hand loop'])} |"
    )


def format_collectives_rows(where, counts):
    """Table rows: each candidate's collectives per step at each
    `steps_per_execution`, weighted by how often each runs, and its hand
    loop's (one step per call)."""
    return [
        f"| {where} | {name} | "
        + " | ".join(f"{counts[name][spe]:.4g}" for spe in ("1", "8", "32"))
        + f" | {counts[loop]['1']:.4g} |"
        for name, loop in HAND_LOOPS.items()
    ]


class Measured(NamedTuple):
    """Everything one run of the benchmark measured, for `write_report`."""

    fit_rows: list
    all_reduce_rows: list
    call_cost_rows: list
    collective_rows: list  # formatted table rows, worker timings included
    accumulation: object
    worker_results: list  # (workers, collective counts, timings)


def write_report(args, measured):
    fit_rows, all_reduce_rows, call_cost_rows, collective_rows, accumulation, _ = (
        measured
    )
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    parts = [FIT_HEADER] + [format_fit_row(row) for row in fit_rows]
    if all_reduce_rows:
        parts += ["", ALL_REDUCE_HEADER]
        parts += [format_all_reduce_row(row) for row in all_reduce_rows]
        parts += ["", format_accumulation_counts(accumulation)]
    if call_cost_rows:
        parts += ["", CALL_COST_HEADER]
        parts += [format_call_cost_row(row) for row in call_cost_rows]
    if collective_rows:
        parts += ["", COLLECTIVES_HEADER, *collective_rows]
    parts.append(
        f"\n{device}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}; global batch "
        f"{BATCH}, {args.steps} steps per epoch, {args.rounds} interleaved rounds."
    )
    (out / "benchmark.md").write_text("\n".join(parts) + "\n")
    chart(fit_rows, measured.worker_results, out / "benchmark.png", parts[-1].strip())
    return out


def add_bench_arguments(parser):
    parser.add_argument(
        "--models",
        type=_list_of(str, tuple(MODELS)),
        default=["mlp", "cnn"],
    )
    parser.add_argument(
        "--replicas",
        type=_list_of(int, (1, 2, 4, 8)),
        default=[1, 2],
        help="replica counts; at most one above 1 per run (one device set a process)",
    )
    parser.add_argument(
        "--workers",
        type=_list_of(int, (2, 3, 4)),
        default=[2],
        help="worker processes for the collectives-per-step table",
    )
    parser.add_argument(
        "--ps-workers",
        type=_list_of(int, (1, 2, 3, 4)),
        default=[1, 2],
        help="workers of the parameter-server clusters timed (one server each)",
    )
    parser.add_argument(
        "--fit-only",
        action="store_true",
        help="time the fit() candidates only (the first table)",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50, help="steps per epoch")
    parser.add_argument(
        "--out",
        help="folder for benchmark.md and benchmark.png (default: a new one "
        "under runs/)",
    )


def _list_of(kind, choices):
    def parse(text):
        try:
            values = [kind(item) for item in text.split(",") if item]
        except ValueError:
            values = []
        if not values or any(value not in choices for value in values):
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {', '.join(map(str, choices))}. "
                f"Received: {text!r}"
            )
        return values

    return parse


def parse_args(argv=None):
    """The benchmark's flags, checked; a usage error names the flag."""
    parser = argparse.ArgumentParser(
        prog="python benchmarks/bench.py",
        description="Time CTLModel.fit against keras.Model.fit and hand loops.",
    )
    add_bench_arguments(parser)
    args = parser.parse_args(argv)
    for flag in ("rounds", "steps"):
        value = getattr(args, flag)
        if value < 1:
            parser.error(f"--{flag} must be >= 1. Received: --{flag} {value}")
    several = [r for r in args.replicas if r > 1]
    if len(several) > 1:
        parser.error(
            "--replicas takes at most one count above 1 per run: TensorFlow "
            "collides two device sets in one process. Received: --replicas "
            f"{','.join(map(str, args.replicas))}. Run once per count, e.g. "
            f"--replicas 1,{several[0]} then --replicas {several[1]}."
        )
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out = args.out or os.path.join("runs", f"bench-{stamp}")
    return args


def run(args):
    """Runs the benchmark for `args` (see `parse_args`)."""
    # The multi-replica strategy splits the CPU, so it comes before any op
    # runs; one device set per process (the command allows one count > 1).
    strategy_for = {1: tf.distribute.get_strategy()}
    several = [r for r in args.replicas if r > 1]
    for replicas in several:
        strategy_for[replicas] = strategies.local_mirrored_strategy(replicas)
    print(FIT_HEADER, flush=True)
    fit_rows = measure_fit(args, strategy_for)
    if args.fit_only:
        out = write_report(args, Measured(fit_rows, [], [], [], None, []))
        print(f"\nWrote {out / 'benchmark.md'} and {out / 'benchmark.png'}.")
        return 0
    all_reduce_rows, call_cost_rows, accumulation = [], [], None
    for replicas in several:
        print("\n" + ALL_REDUCE_HEADER, flush=True)
        all_reduce_rows = measure_all_reduce(args, strategy_for[replicas])
        accumulation = count_accumulation_collectives(strategy_for[replicas])
        print(format_accumulation_counts(accumulation), flush=True)
        print("\n" + CALL_COST_HEADER, flush=True)
        call_cost_rows = measure_call_cost(args, strategy_for[replicas])
    print("\n" + COLLECTIVES_HEADER, flush=True)
    collective_rows, timing_rows, worker_results = [], [], []
    for replicas in args.replicas:
        counts = count_collectives(replicas)
        rows = format_collectives_rows(_plural(replicas, "replica"), counts)
        print("\n".join(rows), flush=True)
        collective_rows += rows
    for workers in args.workers:
        counts, timings = measure_collectives(workers, args.rounds, args.steps)
        worker_results.append((workers, counts, timings))
        rows = format_collectives_rows(_plural(workers, "worker"), counts)
        print("\n".join(rows), flush=True)
        collective_rows += rows
        timing_rows.append(format_worker_timings_row(workers, timings))
    print("\n" + WORKER_TIMINGS_HEADER + "\n" + "\n".join(timing_rows), flush=True)
    collective_rows += ["", WORKER_TIMINGS_HEADER, *timing_rows]
    if args.ps_workers:
        print("\n" + PARAMETER_SERVERS_HEADER, flush=True)
        collective_rows += ["", PARAMETER_SERVERS_HEADER]
        for workers in args.ps_workers:
            rate = measure_parameter_servers(workers, args.rounds, args.steps)
            row = f"| {workers} | {_figure(rate)} |"
            print(row, flush=True)
            collective_rows.append(row)
    measured = Measured(
        fit_rows,
        all_reduce_rows,
        call_cost_rows,
        collective_rows,
        accumulation,
        worker_results,
    )
    out = write_report(args, measured)
    print(f"\nWrote {out / 'benchmark.md'} and {out / 'benchmark.png'}.")
    return 0


def _plural(count, noun):
    return f"{count} {noun}" + ("s" if count > 1 else "")


def chart(rows, worker_results, path, machine):
    """The chart: CTLModel.fit's speed against keras.Model.fit and the hand
    loop (median ratios), then, per worker count, the collectives per step
    of each candidate next to its hand loop's."""
    plt = plots.pyplot()
    panels = 1 + len(worker_results)
    width = max(7, 1.0 * len(rows)) + 5 * len(worker_results)
    figure, axes = plt.subplots(
        1,
        panels,
        figsize=(width, 4.5),
        squeeze=False,
        gridspec_kw={"width_ratios": [max(7, len(rows))] + [5] * len(worker_results)},
    )
    _ratio_bars(axes[0][0], rows)
    for axis, (workers, counts, timings) in zip(axes[0][1:], worker_results):
        _collective_bars(axis, workers, counts, timings)
    figure.suptitle(machine, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _ratio_bars(axis, rows):
    labels = [
        f"{row['model']} {row['replicas']}r\nspe {row['spe']}"
        f"{' xla' if row['xla'] else ''}"
        for row in rows
    ]
    positions = range(len(rows))
    for offset, key, label in (
        (-0.2, "ctl/keras", "CTLModel.fit / keras.Model.fit"),
        (0.2, "ctl/loop", "CTLModel.fit / hand loop"),
    ):
        values = [row[key] or 0.0 for row in rows]
        axis.bar([p + offset for p in positions], values, width=0.4, label=label)
    for position, row in zip(positions, rows):
        if row["ctl/keras"] is None:  # keras.Model.fit failed there
            axis.text(position - 0.2, 0.05, "keras fails", rotation=90, fontsize=9)
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_ylim(0, 1.3 * max([row["ctl/loop"] or 0 for row in rows] + [1.0]))
    axis.set_xticks(list(positions), labels, fontsize=9)
    axis.tick_params(axis="y", labelsize=9)
    axis.set_ylabel("steps/s ratio (median)", fontsize=10)
    axis.set_title("speed of CTLModel.fit (above 1: faster)", fontsize=10)
    axis.legend(fontsize=9)


def _collective_bars(axis, workers, counts, timings):
    names = list(HAND_LOOPS)
    positions = range(len(names))
    for offset, label, values in (
        (-0.27, "keras_ctl, steps_per_execution 1", [counts[n]["1"] for n in names]),
        (0.0, "keras_ctl, steps_per_execution 8", [counts[n]["8"] for n in names]),
        (0.27, "hand loop", [counts[HAND_LOOPS[n]]["1"] for n in names]),
    ):
        axis.bar([p + offset for p in positions], values, width=0.27, label=label)
    labels = [
        n.removeprefix("CTLModel.").replace("data of unknown length", "unknown length")
        for n in names
    ]
    labels = [label.replace(", ", "\n+") for label in labels]
    axis.set_xticks(list(positions), labels, fontsize=8)
    axis.set_ylim(0, 1.5 * max(value["1"] for value in counts.values()))
    axis.tick_params(axis="y", labelsize=9)
    axis.set_ylabel("collectives per step (weighted)", fontsize=10)
    ratio = timings["CTLModel.fit / hand loop"]
    axis.set_title(
        f"{workers} worker processes (fit / hand loop speed: {ratio:.2f})",
        fontsize=10,
    )
    axis.legend(fontsize=8)


if __name__ == "__main__":
    sys.exit(run(parse_args()))
