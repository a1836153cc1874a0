"""A trunk shared by two heads: train one path, fine-tune the other head,
save the trunk alone, under MirroredStrategy.

1. Train trunk + class head (10 digit classes) with variable groups: the
   trunk by SGD with momentum, the head by Adam, through
   `keras.optimizers.MultiOptimizer`.
2. Freeze the trunk and fine-tune a parity head (even / odd digit) alone.
3. Save the trunk alone and load it into a new model.

Per-epoch losses go to TensorBoard logs through `tf.summary`. Writes to
`--out`: `trunk.keras`, `report.json` (what moved and what did not) and
`logs/`.

Usage:
    python examples/trunk_and_heads.py [--replicas 2] [--epochs 3] [--out DIR]
"""

import json
import os
import pathlib

from _args import parse_args


class SummaryLogger:
    """Writes each epoch's logs as `tf.summary` scalars under `logs/<phase>`."""

    def __init__(self, logdir):
        self.logdir = logdir

    def callback(self, phase):
        import keras
        import tensorflow as tf

        writer = tf.summary.create_file_writer(str(self.logdir / phase))

        class Logger(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                with writer.as_default():
                    for name, value in (logs or {}).items():
                        tf.summary.scalar(name, value, step=epoch)
                writer.flush()

        return Logger()


def main():
    args = parse_args(__doc__, replicas=2, epochs=3, out="runs/trunk_and_heads")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np

    import keras_ctl
    from keras_ctl import datasets
    from keras_ctl import strategies
    from keras_ctl.demos import models as zoo

    strategy = strategies.local_mirrored_strategy(args.replicas)
    (x_train, y_train), (x_test, y_test) = datasets.load("digits")
    parity_train = (y_train % 2).astype("float32")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logger = SummaryLogger(out / "logs")
    global_batch = 32 * strategy.num_replicas_in_sync
    keras.utils.set_random_seed(0)

    with strategy.scope():
        trunk = zoo.trunk((8, 8, 1))
        inputs = keras.Input((8, 8, 1))
        classes = zoo.class_head_model(trunk, inputs)
    classes.fit(
        x_train,
        y_train,
        batch_size=global_batch,
        epochs=args.epochs,
        verbose=2,
        callbacks=[logger.callback("class_path")],
    )
    class_eval = classes.evaluate(x_test, y_test, verbose=0, return_dict=True)

    trunk_before = [w.copy() for w in trunk.get_weights()]
    with strategy.scope():
        parity = zoo.parity_head_model(trunk, inputs)
    head_before = [w.copy() for w in parity.get_layer("parity_head").get_weights()]
    parity.fit(
        x_train,
        parity_train,
        batch_size=global_batch,
        epochs=args.epochs,
        verbose=2,
        callbacks=[logger.callback("parity_head")],
    )

    trunk.save(out / "trunk.keras")
    reloaded = keras.models.load_model(out / "trunk.keras")
    new_inputs = keras.Input((8, 8, 1))
    new_model = keras_ctl.CTLModel(
        new_inputs, keras.layers.Dense(10)(reloaded(new_inputs))
    )
    report = {
        "class_test_accuracy": class_eval["accuracy"],
        "trunk_change_while_fine_tuning": max(
            float(np.abs(a - b).max())
            for a, b in zip(trunk.get_weights(), trunk_before)
        ),
        "parity_head_change": max(
            float(np.abs(a - b).max())
            for a, b in zip(parity.get_layer("parity_head").get_weights(), head_before)
        ),
        "reloaded_trunk_feature_difference": float(
            np.abs(
                reloaded.predict(x_test, verbose=0) - trunk.predict(x_test, verbose=0)
            ).max()
        ),
        "new_model_parameters": int(new_model.count_params()),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2))
    for key, value in report.items():
        print(f"{key:36} {value}")
    print(f"Wrote trunk.keras, report.json and logs/ to {out}")


if __name__ == "__main__":
    main()
