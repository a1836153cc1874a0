"""Collectives per training step, counted in the traced step graphs.

Each collective is a round trip between workers, so on a cluster their
number per step, not the arithmetic, sets the pace of a small model. Timing
worker processes on a 2-core machine cannot tell 5 % apart; this count is
deterministic. Run it as 2 or more workers (MultiWorkerMirroredStrategy):

    keras-ctl launch --workers 2 -- python benchmarks/collectives.py OUT.json

or in one process on `--replicas` local replicas (MirroredStrategy).

The chief writes `{candidate: {steps_per_execution: collectives per step}}`
to OUT.json, for `steps_per_execution` 1, 8 and 32, each collective
weighted by how often it runs (`weighted`), for: `CTLModel.fit` (with and
without an accuracy metric, on data of unknown length, and with Dropout
drawing one device's numbers, the default, and each replica's own),
`CTLModel.evaluate` and `GAN.fit` (`d_steps=1`), and the hand-written
loops they replace, each taking its batch from the distributed iterator
inside its step function as `fit()` does (the iterator's own "has data"
all-reduce counts for both). A hand loop runs one step per call, so its
count is the same at every `steps_per_execution`.

With `--timings TIMINGS.json [--rounds 11] [--steps 128]` it also times
`CTLModel.fit` (with and without the metric) against the hand loop,
interleaved in rounds of one `fit()` call each, and writes median steps/s
and the median per-round ratios.
"""

import argparse
import functools
import json
import sys

BATCH = 64
STEPS = 4
STEPS_PER_EXECUTION = (1, 8, 32)
_LOOPS = ("While", "StatelessWhile")
_CONDS = ("If", "StatelessIf")


def weighted(graph, steps_per_execution, replicas=1):
    """Collectives per step of the step function traced as `graph`.

    Each is weighted by how often it runs: one in a `tf.while_loop`'s body
    (the steps after an execution's first) `steps_per_execution - 1` times
    per execution, one outside it once; of a `tf.cond`'s branches, the
    one with more counts (so an upper bound where the branch taken
    varies). On one machine a collective is one op per replica, so the
    ops are divided by `replicas`.
    """
    graph_def = graph.as_graph_def()
    functions = {f.signature.name: f.node_def for f in graph_def.library.function}

    def runs(nodes):
        total = 0
        for node in nodes:
            called = {
                key: functions[value.func.name]
                for key, value in node.attr.items()
                if value.func.name in functions
            }
            if node.op.startswith("Collective"):
                total += 1
            elif node.op in _LOOPS:
                body = runs(called["body"]) + runs(called["cond"])
                total += (steps_per_execution - 1) * body + runs(called["cond"])
            elif node.op in _CONDS:
                total += max(runs(branch) for branch in called.values())
            else:
                total += sum(runs(function) for function in called.values())
        return total

    return runs(graph_def.node) / replicas / steps_per_execution


def measure(strategy, replicas=1):
    """`{candidate: {steps_per_execution: collectives per step}}`."""
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_ctl.demos import models

    rng = np.random.default_rng(0)
    x = rng.random((STEPS * BATCH, 784), dtype=np.float32)
    y = rng.integers(0, 10, STEPS * BATCH).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    unknown_length = dataset.filter(lambda x, y: True)
    images = rng.random((STEPS * BATCH, 8, 8, 1), dtype=np.float32)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    counts = {}

    def record(name, spe, function):
        value = weighted(function.graphs()[0], spe, replicas)
        counts.setdefault(name, {})[str(spe)] = value

    for spe in STEPS_PER_EXECUTION:
        for metrics in (["accuracy"], None):
            with strategy.scope():
                model = models.guide_mlp()
                model.compile(
                    optimizer="adam",
                    loss=loss,
                    metrics=metrics,
                    steps_per_execution=spe,
                )
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
            model.evaluate(x, y, batch_size=BATCH, verbose=0)
            name = "CTLModel.{}" + (", accuracy" if metrics else "")
            record(name.format("fit"), spe, model.train_function)
            record(name.format("evaluate"), spe, model.test_function)
        for draws, suffix in ((None, ""), ("per_replica", ", per-replica draws")):
            with strategy.scope():
                model = _mlp_with_dropout()
                model.compile(
                    optimizer="adam",
                    loss=loss,
                    steps_per_execution=spe,
                    random_draws=draws,
                )
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
            record("CTLModel.fit, Dropout" + suffix, spe, model.train_function)
        with strategy.scope():
            model = models.guide_mlp()
            model.compile(optimizer="adam", loss=loss, steps_per_execution=spe)
        model.fit(unknown_length, epochs=1, verbose=0)
        record("CTLModel.fit, data of unknown length", spe, model.train_function)
        with strategy.scope():
            gan = models.gan((8, 8, 1), latent_dim=8, seed=0)
            gan.compile(gan.d_optimizer, gan.g_optimizer, steps_per_execution=spe)
        gan.fit(images, batch_size=BATCH, epochs=1, verbose=0)
        record("GAN.fit", spe, gan.train_function)
    train, evaluate = _hand_loop(strategy)
    with strategy.scope():
        hand_gan = models.gan((8, 8, 1), latent_dim=8, seed=0)
    images = tf.data.Dataset.from_tensor_slices(images).batch(BATCH)
    hand = {
        "hand loop train step, accuracy": _count_hand(train, strategy, dataset),
        "hand loop eval step, accuracy": _count_hand(evaluate, strategy, dataset),
        "hand GAN step": _count_hand(_hand_gan(hand_gan, strategy), strategy, images),
    }
    for name, graph in hand.items():
        # One step per call at any steps_per_execution.
        counts[name] = dict.fromkeys(
            map(str, STEPS_PER_EXECUTION), weighted(graph, 1, replicas)
        )
    return counts


def _mlp_with_dropout():
    """The guide's MLP with `Dropout(0.2)` after each hidden layer."""
    import keras

    import keras_ctl

    inputs = keras.Input((784,))
    x = inputs
    for seed in range(2):
        x = keras.layers.Dense(64, activation="relu")(x)
        x = keras.layers.Dropout(0.2, seed=seed)(x)
    return keras_ctl.CTLModel(inputs, keras.layers.Dense(10)(x))


def time_candidates(strategy, rounds, steps=128):
    """`{candidate: median steps/s}` and the median CTLModel / loop ratios."""
    import statistics
    import time

    import keras
    import numpy as np
    import tensorflow as tf

    from keras_ctl.demos import models

    rng = np.random.default_rng(1)
    x = rng.random((steps * BATCH, 784), dtype=np.float32)
    y = rng.integers(0, 10, steps * BATCH).astype("int32")
    candidates = {}
    for name, metrics in (
        ("CTLModel.fit, accuracy", ["accuracy"]),
        ("CTLModel.fit", None),
    ):
        with strategy.scope():
            model = models.guide_mlp()
            model.compile(
                optimizer="adam",
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=metrics,
            )
        candidates[name] = functools.partial(
            model.fit, x, y, batch_size=BATCH, epochs=1, verbose=0
        )
    train, _ = _hand_loop(strategy)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    def hand_loop_epoch():
        for _ in range(steps):
            train(iterator)

    candidates["hand loop"] = hand_loop_epoch
    rates = {name: [] for name in candidates}
    for round_ in range(rounds + 1):  # round 0 traces
        for name, run in candidates.items():
            start = time.perf_counter()
            run()
            if round_:
                rates[name].append(steps / (time.perf_counter() - start))
    result = {name: statistics.median(r) for name, r in rates.items()}
    for name in ("CTLModel.fit, accuracy", "CTLModel.fit"):
        ratios = [a / b for a, b in zip(rates[name], rates["hand loop"])]
        result[f"{name} / hand loop"] = statistics.median(ratios)
    return result


def _count_hand(step, strategy, dataset):
    """The graph of the hand loop's `step`, traced on `dataset`."""
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    step(iterator)
    return step.get_concrete_function(iterator).graph


def _hand_loop(strategy):
    """The TensorFlow tutorial's train and test steps, MLP, accuracy."""
    import keras
    import tensorflow as tf

    from keras_ctl.demos import models

    with strategy.scope():
        model = models.guide_mlp(keras.Model)
        optimizer = keras.optimizers.Adam()
        optimizer.build(model.trainable_weights)
        train_accuracy = keras.metrics.SparseCategoricalAccuracy()
        test_accuracy = keras.metrics.SparseCategoricalAccuracy()
        test_loss = keras.metrics.Mean()

    def per_example(y, logits):
        return keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)

    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.nn.compute_average_loss(
                per_example(y, logits), global_batch_size=BATCH
            )
        gradients = tape.gradient(loss, model.trainable_weights)
        optimizer.apply_gradients(zip(gradients, model.trainable_weights))
        train_accuracy.update_state(y, logits)
        return loss

    def test_step(x, y):
        logits = model(x, training=False)
        test_loss.update_state(per_example(y, logits))
        test_accuracy.update_state(y, logits)

    @tf.function
    def distributed_train_step(iterator):
        losses = strategy.run(train_step, args=next(iterator))
        return strategy.reduce("SUM", losses, axis=None)

    @tf.function
    def distributed_test_step(iterator):
        strategy.run(test_step, args=next(iterator))

    return distributed_train_step, distributed_test_step


def _hand_gan(gan, strategy):
    """The Keras guide's GAN step as a hand loop: both losses reduced in one
    collective."""
    import keras
    import tensorflow as tf

    bce = keras.losses.BinaryCrossentropy(from_logits=True, reduction=None)

    def mean(per_example):
        return tf.nn.compute_average_loss(per_example, global_batch_size=2 * BATCH)

    def step(real):
        n = tf.shape(real)[0]
        latents = tf.random.normal((n, gan.latent_dim))
        with tf.GradientTape() as tape:
            combined = tf.concat([gan.generator(latents), real], axis=0)
            labels = tf.concat([tf.ones((n, 1)), tf.zeros((n, 1))], axis=0)
            d_loss = mean(bce(labels, gan.discriminator(combined)))
        d_vars = gan.discriminator.trainable_weights
        gan.d_optimizer.apply_gradients(zip(tape.gradient(d_loss, d_vars), d_vars))
        with tf.GradientTape() as tape:
            predictions = gan.discriminator(gan.generator(latents))
            g_loss = mean(bce(tf.zeros((n, 1)), predictions)) * 2.0
        g_vars = gan.generator.trainable_weights
        gan.g_optimizer.apply_gradients(zip(tape.gradient(g_loss, g_vars), g_vars))
        return tf.stack([d_loss, g_loss])

    @tf.function
    def distributed_step(iterator):
        losses = strategy.run(step, args=(next(iterator),))
        return strategy.reduce("SUM", losses, axis=None)

    return distributed_step


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    from keras_ctl import strategies

    parser = argparse.ArgumentParser(prog="python benchmarks/collectives.py")
    parser.add_argument("out")
    parser.add_argument(
        "--replicas",
        type=int,
        help="count in this process on that many local replicas "
        "(MirroredStrategy; 1: the default strategy), not as a worker",
    )
    parser.add_argument("--timings", help="also time the candidates, into this file")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--steps", type=int, default=128)
    args = parser.parse_args(argv)
    replicas = args.replicas
    if replicas is None:
        strategy = strategies.multi_worker_strategy()  # first: reads TF_CONFIG
    elif replicas == 1:
        import tensorflow as tf

        strategy = tf.distribute.get_strategy()
    else:
        strategy = strategies.local_mirrored_strategy(replicas)
    results = {args.out: measure(strategy, replicas or 1)}
    if args.timings:
        results[args.timings] = time_candidates(strategy, args.rounds, args.steps)
    if strategies.is_chief(strategy):
        for path, values in results.items():
            with open(path, "w") as f:
                json.dump(values, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
