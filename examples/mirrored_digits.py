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
The CTLModel, its history and a comparison table are written to `--out`.

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
    """Returns `(model, history, evaluation)`, or the error it crashed with."""
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
    history = model.fit(
        x_train,
        y_train,
        batch_size=global_batch,
        epochs=args.epochs,
        shuffle=False,
        verbose=0,
    )
    evaluation = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
    return model, history.history, evaluation


def max_difference(model, reference):
    import numpy as np

    return max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(model.get_weights(), reference.get_weights())
    )


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
    reference = runs["keras.Model, 1 device"][0]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"\n{'run':28} {'max |w - w_1device|':>20} {'test loss':>10} {'test acc':>9}")
    for name, result in runs.items():
        if isinstance(result, Exception):
            message = re.sub(r"\{\{.*?\}\}|\s+", " ", str(result)).strip()[:70]
            rows.append({"run": name, "error": f"{type(result).__name__}: {message}"})
            print(f"{name:28} crashed: {rows[-1]['error']}")
            continue
        model, _, evaluation = result
        row = {
            "run": name,
            "max_weight_difference": max_difference(model, reference),
            "test_loss": evaluation["loss"],
            "test_accuracy": evaluation["accuracy"],
        }
        rows.append(row)
        print(
            f"{name:28} {row['max_weight_difference']:20.3g} "
            f"{row['test_loss']:10.4f} {row['test_accuracy']:9.4f}"
        )
    ctl_model, ctl_history, _ = runs[f"CTLModel, {args.replicas} replicas"]
    ctl_model.save(out / "model.keras")
    (out / "history.json").write_text(json.dumps(ctl_history, indent=2))
    (out / "comparison.json").write_text(json.dumps(rows, indent=2))
    print(
        f"\nWrote {out / 'model.keras'}, {out / 'history.json'} and "
        f"{out / 'comparison.json'}"
    )


if __name__ == "__main__":
    main()
