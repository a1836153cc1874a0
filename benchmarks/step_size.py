"""The size of the traced train step: its ops (the graph and its function
library, every branch) and its collectives, CTLModel against keras.Model,
and what each option adds (issue: the exact step at Keras's size).

Deterministic, so one run is the figure. In one process, on 2 logical CPU
replicas and on one device, it prints two markdown tables: the step of
each model of `tests/support/step_size.py`, and the price of each option
on the MLP (2 replicas), against the same run without it:

    python benchmarks/step_size.py [--rows 64]

`--rows 70` leaves the last batch partial: the batches' size is then
unknown to the trace, which guards an empty replica. Under 2 worker
processes (one replica each) it prints CTLModel's step per worker
(keras.Model.fit fails there, Keras 3.15):

    python -m keras_ctl.launch --workers 2 -- python benchmarks/step_size.py --workers
"""

import argparse
import os
import sys

# The models and the counting the suite's test holds.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))


def own_step(base):
    """keras.io's "customizing what happens in fit()" step on `base`, as
    the suite's corpus holds it."""
    from keras_io import custom_train_step_guide

    return custom_train_step_guide.custom_model(base)


def own_loss(base, gather=False):
    """A `compute_loss` of one's own (a mean over examples), gathering
    `y` and `y_pred` across replicas when `gather`."""
    import keras

    import keras_ctl

    class OwnLoss(base):
        def compute_loss(self, x, y, y_pred, sample_weight=None, training=True):
            if gather:
                y, y_pred = keras_ctl.all_gather(y), keras_ctl.all_gather(y_pred)
            losses = keras.losses.sparse_categorical_crossentropy(
                y, y_pred, from_logits=True
            )
            return keras.ops.mean(losses)

    return OwnLoss


def options():
    """`[(option, with, without)]`: each a `(model class, trained options)`
    pair for the MLP (the Dropout MLP for random draws)."""
    import keras_ctl

    ctl = keras_ctl.CTLModel
    replica_batch = {"compute_loss_over": "replica_batch"}
    return [
        (
            "keras.io step of one's own (CTLModel / keras.Model)",
            (own_step(ctl), {}),
            None,
        ),
        (
            'compute_loss of one\'s own, compute_loss_over="global_batch"',
            (own_loss(ctl), {"compute_loss_over": "global_batch"}),
            (own_loss(ctl), replica_batch),
        ),
        (
            "compute_loss of one's own, keras_ctl.all_gather of y and y_pred",
            (own_loss(ctl, gather=True), replica_batch),
            (own_loss(ctl), replica_batch),
        ),
        (
            "compute_loss of one's own, read as one device's (the default)",
            (own_loss(ctl), {}),
            (own_loss(ctl), replica_batch),
        ),
        (
            'random_draws="as_one_device" (the default; MLP with Dropout)',
            (ctl, {"random_draws": "as_one_device"}),
            (ctl, {"random_draws": "per_replica"}),
        ),
        (
            "gradient accumulation (gradient_accumulation_steps=4)",
            (ctl, {"optimizer": {"gradient_accumulation_steps": 4}}),
            (ctl, {}),
        ),
        (
            "clipping after the all-reduce (clipnorm=1.0)",
            (ctl, {"optimizer": {"clipnorm": 1.0}}),
            (ctl, {}),
        ),
    ]


# Options keras.Model has too, priced on it the same way.
KERAS_HAS = ("gradient accumulation", "clipping")


def sizes_table(strategies, rows):
    import step_size

    lines = [
        "| model | "
        + " | ".join(f"{label}, Keras / CTLModel (ratio)" for label, _ in strategies)
        + " | collectives, "
        + strategies[-1][0]
        + ", Keras / CTLModel |",
        "|---" * (len(strategies) + 2) + "|",
    ]
    for name in step_size.MODELS:
        cells, collectives = [], ""
        for _, strategy in strategies:
            found = step_size.size(name, strategy, rows)
            (keras_ops, keras_collectives), (ops, ctl_collectives) = (
                found["keras"],
                found["ctl"],
            )
            cells.append(f"{keras_ops} / {ops} ({ops / keras_ops:.3f})")
            collectives = f"{keras_collectives} / {ctl_collectives}"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {collectives} |")
    return "\n".join(lines)


def options_table(strategy, rows):
    import keras
    import step_size

    lines = [
        "| option | ops with / without (added) | collectives with / without | "
        "keras.Model, ops with / without (added) | keras.Model, collectives |",
        "|---|---|---|---|---|",
    ]

    def priced(name, with_, without):
        found = []
        for model_class, trained_options in (with_, without):
            model = step_size.trained(
                name, model_class, strategy, rows, **trained_options
            )
            found.append(step_size.size_of(model))
        (ops, collectives), (base_ops, base_collectives) = found
        return (
            f"{ops} / {base_ops} ({ops - base_ops:+d}) | "
            f"{collectives} / {base_collectives}"
        )

    for option, with_, without in options():
        name = "mlp_dropout" if "Dropout" in option else "mlp"
        if without is None:
            without = (own_step(keras.Model), {})
        keras_price = "- | -"
        if option.startswith(KERAS_HAS):
            try:
                keras_price = priced(name, (keras.Model, with_[1]), (keras.Model, {}))
            except Exception as error:  # stock Keras fails in some settings
                keras_price = f"fails ({type(error).__name__}) | -"
        lines.append(f"| {option} | {priced(name, with_, without)} | {keras_price} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--workers", action="store_true")
    args = parser.parse_args()
    if args.workers:
        import tensorflow as tf

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        import step_size

        import keras_ctl

        for name in step_size.MODELS:
            model = step_size.trained(name, keras_ctl.CTLModel, strategy, args.rows)
            ops, collectives = step_size.size_of(model)
            print(f"| {name} | {ops} | {collectives} |", flush=True)
        return
    import devices

    devices.configure_logical_cpus()
    strategies = [
        ("1 device", devices.get("default")),
        ("2 replicas", devices.get("mirrored")),
    ]
    print(sizes_table(strategies, args.rows), flush=True)
    print()
    print(options_table(devices.get("mirrored"), args.rows), flush=True)


if __name__ == "__main__":
    main()
