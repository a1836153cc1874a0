"""Train the tutorial's CNN under MirroredStrategy on the bundled digits.

The main demo of keras_ctl. It trains the same model three times from the
same initial weights, with `shuffle=False` so each run sees the same
batches:

1. `keras.Model` on one device (the reference);
2. `keras_ctl.CTLModel` under `MirroredStrategy` with N replicas;
3. `keras.Model` under the same strategy (stock Keras).

and prints how far each distributed run ends from the reference. The digits
train split has 1,438 images: with 3 replicas of 32, the last global batch
of 94 splits 32/31/31. Stock Keras drifts or crashes, CTLModel does not.
Written to `--out`: the CTLModel, its history, the comparison table, and
`weight_difference.png`, each distributed run's distance from the reference
after every epoch.

Usage:
    python examples/mirrored_digits.py [--replicas 3] [--epochs 5] [--out DIR]
"""

import json
import os
import pathlib
import re

from _args import parse_args


def tutorial_cnn(model_class, input_shape):
    from keras_ctl.demos import models as zoo

    return zoo.tutorial_cnn(input_shape, model_class=model_class)


def train(model_class, strategy, data, initial_weights, args, global_batch):
    """Returns `(model, history, evaluation, weights after each epoch)`, or
    the error it crashed with."""
    try:
        return _train(model_class, strategy, data, initial_weights, args, global_batch)
    except Exception as error:  # stock Keras crashes on some uneven batches
        return error


def _train(model_class, strategy, data, initial_weights, args, global_batch):
    import keras

    (x_train, y_train), (x_test, y_test) = data
    with strategy.scope():
        model = tutorial_cnn(model_class, x_train.shape[1:])
        model.set_weights(initial_weights)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    epoch_weights = []
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: epoch_weights.append(model.get_weights())
    )
    history = model.fit(
        x_train,
        y_train,
        batch_size=global_batch,
        epochs=args.epochs,
        shuffle=False,
        verbose=0,
        callbacks=[record],
    )
    evaluation = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
    return model, history.history, evaluation, epoch_weights


def max_difference(weights, reference):
    import numpy as np

    return max(float(np.max(np.abs(a - b))) for a, b in zip(weights, reference))


def plot_differences(runs, reference, path, replicas):
    """Writes each distributed run's weight difference per epoch to `path`."""
    from keras_ctl.demos import plots

    plt = plots.pyplot()
    figure, axis = plt.subplots(figsize=(6, 3.5))
    for name, result in runs.items():
        if isinstance(result, Exception):
            axis.plot([], [], " ", label=f"{name}: crashed ({type(result).__name__})")
            continue
        differences = [
            max(max_difference(w, r), 1e-12) for w, r in zip(result[3], reference)
        ]
        axis.plot(range(1, len(differences) + 1), differences, marker="o", label=name)
    axis.set_yscale("log")
    axis.set_ylim(1e-10, 1.0)
    axis.axhspan(1e-10, 1e-6, color="green", alpha=0.08, label="float32 round-off")
    axis.set_xticks(range(1, len(reference) + 1))
    axis.set_xlabel("epoch")
    axis.set_ylabel("max |w - w_1device| (floor 1e-12)")
    axis.set_title(f"Tutorial CNN, MirroredStrategy, {replicas} replicas vs 1 device")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main():
    args = parse_args(
        __doc__,
        replicas=3,
        epochs=5,
        out="runs/mirrored_digits",
        extra=[("--batch-size", 32, "per replica")],
    )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import keras_ctl
    from keras_ctl import datasets
    from keras_ctl import strategies

    strategy = strategies.local_mirrored_strategy(args.replicas)
    print(
        f"Training the tutorial's CNN three times for {args.epochs} epochs: "
        f"keras.Model on 1 device, then CTLModel and keras.Model under "
        f"MirroredStrategy with {args.replicas} replicas ...",
        flush=True,
    )

    data = datasets.load("digits")
    global_batch = args.batch_size * strategy.num_replicas_in_sync
    keras.utils.set_random_seed(0)
    initial = tutorial_cnn(keras.Model, data[0][0].shape[1:]).get_weights()
    one_device = tf.distribute.get_strategy()
    runs = {
        "keras.Model, 1 device": train(
            keras.Model, one_device, data, initial, args, global_batch
        ),
        f"CTLModel, {args.replicas} replicas": train(
            keras_ctl.CTLModel, strategy, data, initial, args, global_batch
        ),
        f"keras.Model, {args.replicas} replicas": train(
            keras.Model, strategy, data, initial, args, global_batch
        ),
    }
    reference = runs.pop("keras.Model, 1 device")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(
        "\nEach distributed run below saw the same batches as one device, from "
        "the same initial weights: an exact run ends with one device's weights "
        "(a difference near float32 round-off, 1e-7) and test results."
    )
    rows = [_row("keras.Model, 1 device", reference, reference[0].get_weights())]
    print(f"\n{'run':28} {'max |w - w_1device|':>20} {'test loss':>10} {'test acc':>9}")
    _print_row(rows[0])
    for name, result in runs.items():
        if isinstance(result, Exception):
            message = re.sub(r"\{\{.*?\}\}|\s+", " ", str(result)).strip()
            rows.append({"run": name, "error": f"{type(result).__name__}: {message}"})
            print(f"{name:28} crashed: {rows[-1]['error']}")
            continue
        rows.append(_row(name, result, reference[0].get_weights()))
        _print_row(rows[-1])
    plot_differences(runs, reference[3], out / "weight_difference.png", args.replicas)
    ctl_model, ctl_history, _, _ = runs[f"CTLModel, {args.replicas} replicas"]
    ctl_model.save(out / "model.keras")
    (out / "history.json").write_text(json.dumps(ctl_history, indent=2))
    (out / "comparison.json").write_text(json.dumps(rows, indent=2))
    print(
        f"\nWrote {out / 'model.keras'}, {out / 'history.json'}, "
        f"{out / 'comparison.json'} and {out / 'weight_difference.png'}"
    )


def _row(name, result, reference_weights):
    model, _, evaluation, _ = result
    return {
        "run": name,
        "max_weight_difference": max_difference(model.get_weights(), reference_weights),
        "test_loss": evaluation["loss"],
        "test_accuracy": evaluation["accuracy"],
    }


def _print_row(row):
    print(
        f"{row['run']:28} {row['max_weight_difference']:20.3g} "
        f"{row['test_loss']:10.4f} {row['test_accuracy']:9.4f}"
    )


if __name__ == "__main__":
    main()
