"""Where a training step's time goes, and each candidate's peak memory.

For `CTLModel.fit`, `keras.Model.fit` and the TensorFlow tutorial's hand
loop (`bench.loop_candidate`: a `tf.function` step called from a Python
`for` over the distributed dataset), MLP 784-64-64-10 (`--model`: or
`bench.py`'s CNN or transformer block) with an accuracy metric, Adam,
global batch 64, `--steps-per-execution` (default 1: the hand loop has
none), on `--replicas` local replicas (MirroredStrategy; 1: the default
strategy). Each step's wall time is split, with two timers and no profiler, into:

- graph: TensorFlow running the traced step (`execute.execute`, which
  every traced function call goes through): the arithmetic, the input
  pipeline's reads inside the graph, the collectives;
- opening: opening the epoch's iterator over the distributed dataset
  (`iter()`, once an epoch), spread over the epoch's steps;
- call: the step function's call around its graph (`fit()`'s
  `train_function`, the hand loop's `tf.function`): dispatch, arguments,
  what keras_ctl does before and after a step;
- loop: the rest. For `fit()`, Keras's loop: the epoch iterator, the
  callbacks (which read the logs on the host), the stop check; for the
  hand loop, `next()` on the distributed iterator, run eagerly.

The candidates are interleaved within each of `--rounds` rounds (one
epoch of `--steps` steps each, after an epoch that traces); medians are
reported, in microseconds per step, with the median per-round ratios of
CTLModel.fit's speed to the others'. With `--memory` each candidate also
trains alone in a fresh process, and the peak resident memory (RSS,
Linux's `VmHWM`) of 3 epochs after its first is reported: the median of 3
processes.

    python benchmarks/per_step.py --replicas 2 [--rounds 9] [--steps 64]
        [--steps-per-execution 1] [--model mlp] [--memory] [--out FILE.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CANDIDATES = ("CTLModel.fit", "keras.Model.fit", "hand loop")


class Timer:
    """Seconds spent in the calls of the functions it wrapped; a call
    counts when `counts()` says so as it starts, and not inside another."""

    def __init__(self, counts=lambda: True):
        self.seconds = 0.0
        self.active = 0
        self._counts = counts

    def wrap(self, function):
        def timed(*args, **kwargs):
            counted = not self.active and self._counts()
            self.active += 1
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.active -= 1
                if counted:
                    self.seconds += time.perf_counter() - start

        return timed


def make_candidates(strategy, steps, call, names=CANDIDATES, spe=1, model="mlp"):
    """`{name: run one epoch}` of `names`, each traced already; `call`
    times each step function's calls; `fit()` runs `spe` steps a call."""
    import bench
    import keras

    from keras_ctl.model import CTLModel

    build, shape = bench.MODELS[model]
    dataset = bench.make_data(shape, steps)
    made = {}
    for name, model_class in (
        ("CTLModel.fit", CTLModel),
        ("keras.Model.fit", keras.Model),
    ):
        if name not in names:
            continue
        model = bench.compiled(model_class, build, strategy, spe, xla=False)
        try:
            model.fit(dataset, epochs=1, verbose=0)  # traces
        except Exception as error:  # stock Keras fails at some spe
            print(f"{name} fails: {type(error).__name__}", file=sys.stderr)
            continue
        # `fit()` reuses the train function it made.
        model.train_function = call.wrap(model.train_function)
        made[name] = _epoch_of(model, dataset)
    if "hand loop" in names:
        made["hand loop"] = bench.loop_candidate(
            build, dataset, strategy, False, call.wrap
        )
    return made


def _epoch_of(model, dataset):
    return lambda: model.fit(dataset, epochs=1, verbose=0)


PARTS = ("total", "graph", "opening", "call", "loop")


def breakdown(strategy, steps, rounds, spe=1, model="mlp"):
    """`{candidate: {part: median µs per step}}`, the parts of `PARTS`, and
    the median per-round ratios of CTLModel.fit's speed to the others'."""
    import tensorflow as tf
    from tensorflow.python.distribute import input_lib
    from tensorflow.python.eager import execute

    call, opening = Timer(), Timer()
    opening_in_call = Timer(counts=lambda: call.active)
    # The step's graph: functions run by a step function's call, not
    # those that open an iterator (a multi-device iterator runs some).
    graph = Timer(counts=lambda: call.active and not opening.active)
    # Every traced function call runs its graph through `execute.execute`
    # (`context.call_function`, TensorFlow 2.21).
    execute.execute = graph.wrap(execute.execute)
    for dataset_class in (input_lib.DistributedDataset, tf.data.Dataset):
        dataset_class.__iter__ = opening.wrap(
            opening_in_call.wrap(dataset_class.__iter__)
        )
    candidates = make_candidates(strategy, steps, call, spe=spe, model=model)
    parts = {name: {part: [] for part in PARTS} for name in candidates}
    for _ in range(rounds):
        for name, run_epoch in candidates.items():
            timers = (graph, opening, opening_in_call, call)
            before = [timer.seconds for timer in timers]
            start = time.perf_counter()
            run_epoch()
            total = time.perf_counter() - start
            in_graph, in_opening, opened_in_call, in_call = (
                timer.seconds - earlier for timer, earlier in zip(timers, before)
            )
            # keras_ctl opens the epoch's iterator in its first step's call,
            # the hand loop in its loop.
            for part, seconds in (
                ("total", total),
                ("graph", in_graph),
                ("opening", in_opening),
                ("call", in_call - in_graph - opened_in_call),
                ("loop", total - in_call - (in_opening - opened_in_call)),
            ):
                parts[name][part].append(seconds / steps * 1e6)
    result = {
        name: {part: statistics.median(values) for part, values in by_part.items()}
        for name, by_part in parts.items()
    }
    ctl = parts["CTLModel.fit"]["total"]
    for name in set(parts) - {"CTLModel.fit"}:
        ratios = [other / mine for mine, other in zip(ctl, parts[name]["total"])]
        result[f"CTLModel.fit / {name} (speed)"] = statistics.median(ratios)
    return result


def peak_memory(name, replicas, steps):
    """Median peak RSS (MiB) of 3 fresh processes training `name` alone."""
    peaks = []
    for _ in range(3):
        result = subprocess.run(
            [sys.executable, __file__, "--alone", name]
            + ["--replicas", str(replicas), "--steps", str(steps)],
            check=True,
            capture_output=True,
            text=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        )
        peaks.append(float(result.stdout.strip().splitlines()[-1]))
    return statistics.median(peaks)


def train_alone(name, strategy, steps):
    """Trains `name` for 3 epochs after its first; returns the peak RSS
    (MiB) of those 3 epochs."""
    run_epoch = make_candidates(strategy, steps, Timer(), names=(name,))[name]
    # Start the peak here: importing and starting TensorFlow peak higher
    # than training a small model (Linux: `clear_refs` 5 resets VmHWM).
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    for _ in range(3):
        run_epoch()
    with open("/proc/self/status") as f:
        peak = next(line for line in f if line.startswith("VmHWM:"))
    return int(peak.split()[1]) / 1024  # kB


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python benchmarks/per_step.py")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--model", choices=("mlp", "cnn", "transformer_block"))
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--alone", choices=CANDIDATES, help=argparse.SUPPRESS)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    import tensorflow as tf

    from keras_ctl import strategies

    strategy = (
        strategies.local_mirrored_strategy(args.replicas)
        if args.replicas > 1
        else tf.distribute.get_strategy()
    )
    if args.alone:
        print(train_alone(args.alone, strategy, args.steps))
        return 0
    result = {
        "per step (µs)": breakdown(
            strategy,
            args.steps,
            args.rounds,
            args.steps_per_execution,
            args.model or "mlp",
        )
    }
    if args.memory:
        result["peak RSS (MiB)"] = {
            name: peak_memory(name, args.replicas, args.steps) for name in CANDIDATES
        }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
