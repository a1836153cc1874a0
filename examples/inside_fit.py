"""What `fit()` runs inside , written with keras_ctl's blocks.

A `CTLModel` subclass spells out its `train_step` with the building blocks:
forward pass, `scaled_regularization_loss` (the guide's
`ActivityRegularizationLayer` adds to `model.losses`), `global_mean` of the
per-example loss, `minimize`, and typed outputs. Trained on the bundled
digits under `MirroredStrategy` next to the default `CTLModel` step; with a
weight-only extra loss both end with the same weights. Writes
`--out/report.json`.

Usage:
    python examples/inside_fit.py [--replicas 2] [--epochs 3] [--out DIR]
"""

import json
import os
import pathlib

from _args import parse_args


def main():
    args = parse_args(__doc__, replicas=2, epochs=3, out="runs/inside_fit")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_ctl
    from keras_ctl import datasets
    from keras_ctl import strategies

    strategy = strategies.local_mirrored_strategy(args.replicas)

    class ActivityRegularizationLayer(keras.layers.Layer):
        """The guide's layer: adds `1e-2 * sum(inputs)` to `model.losses`.

        Here it regularizes a weight (exact on any split); on activations it
        would divide by each replica's own batch, which is not exact.
        """

        def build(self, input_shape):
            self.scale = self.add_weight(shape=(), initializer="ones", name="scale")

        def call(self, inputs):
            self.add_loss(1e-2 * keras.ops.square(self.scale))
            return inputs * self.scale

    class SpelledOut(keras_ctl.CTLModel):
        """`fit()`'s step, written out."""

        @keras_ctl.written_in_shares
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                logits = self(x, training=True)
                # Read layer losses first: replica threads share the layers.
                regularization = keras_ctl.scaled_regularization_loss(self.losses)
                per_example = keras.losses.sparse_categorical_crossentropy(
                    y, logits, from_logits=True
                )
                loss = keras_ctl.global_mean(per_example) + regularization
            keras_ctl.minimize(loss, self.trainable_weights, self.optimizer, tape)
            hits = tf.cast(
                tf.equal(tf.argmax(logits, -1, output_type=tf.int32), y), "float32"
            )
            # Values of this step; `history` keeps those of the epoch's last one.
            return {
                "batch_loss": keras_ctl.ReplicaSum(loss),
                "batch_accuracy": keras_ctl.ExampleMean(
                    tf.reduce_sum(hits), tf.cast(tf.size(hits), "float32")
                ),
            }

    def mlp(model_class):
        inputs = keras.Input((64,))
        x = keras.layers.Dense(64, activation="relu")(inputs)
        x = ActivityRegularizationLayer()(x)
        x = keras.layers.Dense(64, activation="relu")(x)
        return model_class(inputs, keras.layers.Dense(10)(x))

    (x_train, y_train), (x_test, y_test) = datasets.load("digits")
    x_train, x_test = x_train.reshape(-1, 64), x_test.reshape(-1, 64)
    results = {}
    keras.utils.set_random_seed(0)
    initial = mlp(keras.Model).get_weights()
    for name, model_class in (
        ("default step", keras_ctl.CTLModel),
        ("spelled out", SpelledOut),
    ):
        with strategy.scope():
            model = mlp(model_class)
            model.set_weights(initial)
            model.compile(
                optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        history = model.fit(
            x_train,
            y_train,
            batch_size=64,
            epochs=args.epochs,
            shuffle=False,
            verbose=0,
        ).history
        results[name] = (model, history)
        rounded = {
            key: [round(v, 4) for v in values] for key, values in history.items()
        }
        print(f"{name:13} history: {rounded}")
    (default, default_history), (spelled, spelled_history) = results.values()
    report = {
        "max_weight_difference": max(
            float(np.abs(a - b).max())
            for a, b in zip(default.get_weights(), spelled.get_weights())
        ),
        "default_epoch_loss": default_history["loss"],
        "spelled_out_last_batch_loss": spelled_history["batch_loss"],
        "test_accuracy": float(
            np.mean(np.argmax(spelled.predict(x_test, verbose=0), -1) == y_test)
        ),
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(
        f"max weight difference: {report['max_weight_difference']:.2e}, "
        f"test accuracy {report['test_accuracy']:.3f}"
    )


if __name__ == "__main__":
    main()
