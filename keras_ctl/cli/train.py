"""`keras-ctl train {classifier,gan,multihead}`: train and write the run's files.

Writes into `--out`: `history.json`, `history.csv`, `learning_curves.png`,
`model.keras` (the GAN: `gan.keras`; multihead: `trunk.keras`), for the GAN a
`samples_epoch_NNN.png` grid per epoch, TensorBoard logs in `logs/`, and a
backup in `backup/` while training (kept if the run is interrupted, so that
`--resume` continues it).
"""

import pathlib
import shutil

from keras_ctl.cli import common


def run(args):
    strategy = common.make_strategy(args.strategy, args.replicas)  # first
    import keras
    import tensorflow as tf

    from keras_ctl import strategies

    keras.utils.set_random_seed(args.seed)
    if args.mixed_precision:
        gpu = bool(tf.config.list_physical_devices("GPU"))
        keras.config.set_dtype_policy("mixed_float16" if gpu else "mixed_bfloat16")
    data = common.load_data(args.dataset)
    # Other workers write to a temporary folder (TF multi-worker convention).
    out = pathlib.Path(strategies.write_path(args.out, strategy))
    out.mkdir(parents=True, exist_ok=True)
    trainer = {"classifier": _classifier, "gan": _gan, "multihead": _multihead}[
        args.task
    ]
    history, saved, final = trainer(args, strategy, data, out)
    history.learning_curves(
        f"{args.task} on {args.dataset}: {type(strategy).__name__}, "
        f"{strategy.num_replicas_in_sync} replica(s)"
    )
    if not strategies.is_chief(strategy):
        shutil.rmtree(out, ignore_errors=True)
        return 0
    print(
        f"\nDone: {args.task} on {args.dataset}, {args.epochs} epoch(s), "
        f"{type(strategy).__name__}, {strategy.num_replicas_in_sync} replica(s)."
    )
    for name, value in final.items():
        print(f"  {name}: {value:.4f}")
    print(f"Files in {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    print(
        f"Open {out / 'learning_curves.png'}"
        + (f" and {out}/samples_epoch_*.png" if args.task == "gan" else "")
        + f"; `{saved}` loads with keras.models.load_model."
    )
    return 0


def _callbacks(out, history, name="backup"):
    import keras

    from keras_ctl import callbacks

    return [
        callbacks.BackupAndRestore(str(out / name), double_checkpoint=True),
        keras.callbacks.TensorBoard(str(out / "logs")),
        history,
    ]


def _classifier(args, strategy, data, out):
    import keras

    from keras_ctl.demos import models

    (x_train, y_train), (x_test, y_test) = data
    (x_train, y_train), validation = common.validation_split(x_train, y_train)
    with strategy.scope():
        model = models.tutorial_cnn(x_train.shape[1:])
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    history = common.HistoryFiles(out)
    model.fit(
        x_train,
        y_train,
        batch_size=args.batch_size * strategy.num_replicas_in_sync,
        epochs=args.epochs,
        validation_data=validation,
        callbacks=_callbacks(out, history),
    )
    model.save(out / "model.keras")
    final = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
    return history, "model.keras", {f"test_{k}": v for k, v in final.items()}


def _gan(args, strategy, data, out):
    import numpy as np

    from keras_ctl.demos import models
    from keras_ctl.demos import plots

    (x_train, _), (x_test, _) = data
    images = np.concatenate([x_train, x_test])
    with strategy.scope():
        gan = models.gan(images.shape[1:], latent_dim=32, seed=0)
    latents = np.random.default_rng(0).normal(size=(16, 32)).astype("float32")
    history = common.HistoryFiles(out)
    gan.fit(
        images,
        batch_size=args.batch_size * strategy.num_replicas_in_sync,
        epochs=args.epochs,
        callbacks=_callbacks(out, history) + [plots.image_grid_callback(out, latents)],
    )
    gan.save(out / "gan.keras")
    return history, "gan.keras", {k: v[-1] for k, v in history.history.items()}


def _multihead(args, strategy, data, out):
    """A trunk + class head (variable groups), then a parity head on the
    frozen trunk; the trunk is saved alone."""
    import keras

    from keras_ctl.demos import models as zoo

    (x_train, y_train), (x_test, y_test) = data
    batch = args.batch_size * strategy.num_replicas_in_sync
    with strategy.scope():
        trunk = zoo.trunk(x_train.shape[1:])
        inputs = keras.Input(x_train.shape[1:])
        classes = zoo.class_head_model(trunk, inputs)
    print("Phase 1 of 2: the trunk and the class head, with variable groups")
    classes.fit(
        x_train,
        y_train,
        batch_size=batch,
        epochs=args.epochs,
        callbacks=_callbacks(out, common.HistoryFiles(out, "class_"), "backup_classes"),
    )
    with strategy.scope():
        parity = zoo.parity_head_model(trunk, inputs)
    history = common.HistoryFiles(out, "parity_")
    print("Phase 2 of 2: a parity head on the frozen trunk")
    parity.fit(
        x_train,
        (y_train % 2).astype("float32"),
        batch_size=batch,
        epochs=args.epochs,
        callbacks=_callbacks(out, history, "backup_parity"),
    )
    trunk.save(out / "trunk.keras")
    final = {
        "test_class_accuracy": classes.evaluate(
            x_test, y_test, verbose=0, return_dict=True
        )["accuracy"],
        "test_parity_accuracy": parity.evaluate(
            x_test, (y_test % 2).astype("float32"), verbose=0, return_dict=True
        )["accuracy"],
    }
    return history, "trunk.keras", final
