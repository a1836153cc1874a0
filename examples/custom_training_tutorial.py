"""The TensorFlow tutorial "Custom training with tf.distribute".

Trains the tutorial's CNN as a `keras_ctl.CTLModel` under `MirroredStrategy`,
writes a `tf.train.Checkpoint` every 2 epochs with a `CheckpointManager`,
then restores the latest checkpoint into a model built *without* a strategy
and evaluates it: the accuracies match. Writes `--out/checkpoints/` and
`--out/report.json`.

Usage:
    python examples/custom_training_tutorial.py [--replicas 2] [--epochs 4] [--out DIR]
"""

import json
import os
import pathlib

from _args import parse_args


def compiled_cnn(input_shape):
    import keras

    from keras_ctl.demos import models as zoo

    model = zoo.tutorial_cnn(input_shape)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main():
    args = parse_args(
        __doc__, replicas=2, epochs=4, out="runs/custom_training_tutorial"
    )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    from keras_ctl import datasets
    from keras_ctl import strategies

    strategy = strategies.local_mirrored_strategy(args.replicas)
    (x_train, y_train), (x_test, y_test) = datasets.load("digits")
    out = pathlib.Path(args.out)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = compiled_cnn(x_train.shape[1:])
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    manager = tf.train.CheckpointManager(
        checkpoint, str(out / "checkpoints"), max_to_keep=3
    )

    class EveryTwoEpochs(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if (epoch + 1) % 2 == 0:
                manager.save(checkpoint_number=epoch + 1)

    model.fit(
        x_train,
        y_train,
        batch_size=32 * strategy.num_replicas_in_sync,
        epochs=args.epochs,
        callbacks=[EveryTwoEpochs()],
        verbose=2,
    )
    trained = model.evaluate(x_test, y_test, verbose=0, return_dict=True)

    # Restore into a model built without a strategy (the tutorial's last part).
    restored = compiled_cnn(x_train.shape[1:])
    restored.optimizer.build(restored.trainable_variables)
    latest = tf.train.latest_checkpoint(str(out / "checkpoints"))
    tf.train.Checkpoint(model=restored, optimizer=restored.optimizer).restore(
        latest
    ).assert_existing_objects_matched()
    evaluation = restored.evaluate(x_test, y_test, verbose=0, return_dict=True)
    report = {
        "latest_checkpoint": os.path.basename(latest),
        "checkpoints": sorted(os.path.basename(p) for p in manager.checkpoints),
        "trained_test_accuracy": trained["accuracy"],
        "restored_test_accuracy": evaluation["accuracy"],
    }
    (out / "report.json").write_text(json.dumps(report, indent=2))
    for key, value in report.items():
        print(f"{key:24} {value}")


if __name__ == "__main__":
    main()
