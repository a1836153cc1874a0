"""A CTLModel trained by Ray Train on 2 workers, resumed after a worker dies.

Ray's `TensorflowTrainer` gives each worker its `TF_CONFIG` and runs the
training function there under `MultiWorkerMirroredStrategy`, which stock
Keras 3 `fit()` cannot use; `CTLModel.fit` can. The function trains with
`keras_ctl.callbacks.BackupAndRestore` in a folder every worker reads, and
reports the chief's model to Ray as a checkpoint. With `--fail-once`, worker
1 kills itself once in epoch 2: Ray starts the workers again
(`FailureConfig(max_failures=1)`) and the run resumes from the backup.

The local Ray cluster binds to 127.0.0.1 only, without its dashboard or
usage statistics. Writes `--out/result.json` (the trained weights, the
one-device run's, and the checkpoint Ray holds) and `--out/model.keras`.

Usage:
    python examples/ray_train.py [--epochs 3] [--out DIR] [--fail-once]
"""

import argparse
import json
import os
import pathlib
import shutil
import signal
import tempfile

EXAMPLES, BATCH = 96, 16


def data():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.random((EXAMPLES, 8), dtype=np.float32)
    return x, (x.sum(axis=1) > 4).astype("int32")


def build_and_compile(keras_ctl):
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    model = keras_ctl.CTLModel(inputs, keras.layers.Dense(2)(hidden))
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def train_function(config):
    """Runs on every Ray worker."""
    from ray import train

    import keras_ctl

    strategy = keras_ctl.strategies.multi_worker_strategy()  # Ray's TF_CONFIG
    with strategy.scope():
        model = build_and_compile(keras_ctl)
    callbacks = [
        # Ray runs the function outside the main thread: no signal handlers.
        keras_ctl.callbacks.BackupAndRestore(
            config["backup"], save_freq=2, save_on_signals=()
        )
    ]
    if config["fail_once"]:
        callbacks.append(FailOnce(config["failed_marker"]))
    counted = BatchCount()
    callbacks.append(counted)
    x, y = data()
    history = model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=config["epochs"],
        shuffle=False,
        callbacks=callbacks,
        verbose=0,
    )
    # Every worker saves (saving may take part in collectives); the chief's
    # folder is the checkpoint Ray keeps.
    with tempfile.TemporaryDirectory() as folder:
        model.save(os.path.join(folder, "model.keras"))
        chief = train.get_context().get_world_rank() == 0
        train.report(
            {
                "loss": float(history.history["loss"][-1]),
                "batches_trained_since_the_last_start": counted.batches,
            },
            checkpoint=train.Checkpoint.from_directory(folder) if chief else None,
        )


class BatchCount:
    """Counts the batches this start of the function trains."""

    def __new__(cls):
        import keras

        class BatchCountCallback(keras.callbacks.Callback):
            batches = 0

            def on_train_batch_end(self, batch, logs=None):
                self.batches += 1

        return BatchCountCallback()


class FailOnce:
    """Kills worker 1 at epoch 2, batch 3, once: a machine that dies."""

    def __new__(cls, marker):
        import keras

        class FailOnceCallback(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self.epoch = epoch

            def on_train_batch_end(self, batch, logs=None):
                import keras_ctl

                dies = keras_ctl.strategies.task_index() == 1
                if dies and (self.epoch, batch) == (1, 2):
                    if not os.path.exists(marker):
                        pathlib.Path(marker).touch()
                        os.kill(os.getpid(), signal.SIGKILL)

        return FailOnceCallback()


def one_device_weights(epochs):
    import keras_ctl

    x, y = data()
    model = build_and_compile(keras_ctl)
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    return model.get_weights()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3, help="Default: 3.")
    parser.add_argument(
        "--out", default="runs/ray_train", help="Default: runs/ray_train."
    )
    parser.add_argument(
        "--fail-once",
        action="store_true",
        help="Kill worker 1 once in epoch 2, to show the restart. Default: off.",
    )
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error(f"--epochs must be >= 2. Received: --epochs {args.epochs}")
    out = pathlib.Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    # A local cluster on 127.0.0.1 only (TF_CONFIG gets loopback addresses).
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import ray
        from ray.train import FailureConfig
        from ray.train import RunConfig
        from ray.train import ScalingConfig
        from ray.train.tensorflow import TensorflowTrainer
    except ImportError as error:
        raise SystemExit(
            'This example needs Ray Train: pip install "keras-ctl[ray]"'
        ) from error

    ray.init(
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        num_cpus=2,
        log_to_driver=False,
    )
    try:
        trainer = TensorflowTrainer(
            train_function,
            train_loop_config={
                "backup": str(out / "backup"),
                "epochs": args.epochs,
                "fail_once": args.fail_once,
                "failed_marker": str(out / "worker_1_failed"),
            },
            scaling_config=ScalingConfig(
                num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}
            ),
            run_config=RunConfig(
                storage_path=str(out / "ray"),
                name="ray_train",
                failure_config=FailureConfig(max_failures=1),
            ),
        )
        result = trainer.fit()
    finally:
        ray.shutdown()

    import keras
    import numpy as np

    import keras_ctl  # noqa: F401 (registers CTLModel for loading)

    with result.checkpoint.as_directory() as folder:
        shutil.copy(os.path.join(folder, "model.keras"), out / "model.keras")
    trained = keras.saving.load_model(out / "model.keras").get_weights()
    reference = one_device_weights(args.epochs)
    difference = max(
        float(np.max(np.abs(a - b))) for a, b in zip(trained, reference, strict=True)
    )
    report = {
        "max_weight_difference_from_one_device": difference,
        "worker_failed_and_resumed": (out / "worker_1_failed").exists(),
        "checkpoint": result.checkpoint.path,
        "loss": result.metrics["loss"],
        "batches_trained_since_the_last_start": result.metrics[
            "batches_trained_since_the_last_start"
        ],
        "batches_per_epoch": -(-EXAMPLES // BATCH),
    }
    (out / "result.json").write_text(json.dumps(report, indent=2))
    print(
        f"Ray Train, 2 workers: weights within {difference:.1e} of one device"
        + (", after a worker died and the run resumed" if args.fail_once else "")
    )


if __name__ == "__main__":
    main()
