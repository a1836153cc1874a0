"""Checkpoints across strategies, SavedModel export, corrupted backups."""

import signal
import warnings

import devices
import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_ctl


def data(n=53):
    rng = np.random.default_rng(0)
    x = rng.random((n, 5), dtype=np.float32)
    return x, (x.sum(axis=1) > 2.5).astype("int32")


def make_model(kind, seed=1, metrics=None):
    keras.utils.set_random_seed(seed)
    with devices.get(kind).scope():
        inputs = keras.Input((5,))
        h = keras.layers.Dense(8, activation="relu")(inputs)
        model = keras_ctl.CTLModel(inputs, keras.layers.Dense(2)(h))
        model.compile(
            optimizer=keras.optimizers.Adam(1e-2),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=metrics,
        )
    return model


@pytest.mark.parametrize(
    "source, target", [("mirrored", "default"), ("default", "mirrored")]
)
def test_tf_checkpoint_restores_across_strategies(source, target, tmp_path):
    x, y = data()
    trained = make_model(source)
    trained.fit(x, y, batch_size=8, epochs=1, verbose=0)
    checkpoint = tf.train.Checkpoint(model=trained, optimizer=trained.optimizer)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=2)
    path = manager.save()
    assert tf.train.latest_checkpoint(str(tmp_path)) == path

    restored = make_model(target, seed=2)
    with devices.get(target).scope():
        restored.optimizer.build(restored.trainable_variables)
        status = tf.train.Checkpoint(
            model=restored, optimizer=restored.optimizer
        ).restore(path)
    status.assert_existing_objects_matched()
    np.testing.assert_allclose(
        restored.predict(x, verbose=0), trained.predict(x, verbose=0), atol=1e-6
    )
    assert int(restored.optimizer.iterations.numpy()) == 7


def test_keras_file_saved_under_mirrored_loads_without_a_strategy(tmp_path):
    x, y = data()
    model = make_model("mirrored")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert isinstance(loaded, keras_ctl.CTLModel)
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6
    )


def test_export_serving_signature_matches_predict(tmp_path):
    x, y = data()
    model = make_model("mirrored")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    model.export(str(tmp_path / "saved"), verbose=False)
    served = tf.saved_model.load(str(tmp_path / "saved"))
    np.testing.assert_allclose(
        served.serve(x).numpy(), model.predict(x, verbose=0), atol=1e-6
    )


def kept_backup(tmp_path, x, y, double_checkpoint, callback=None):
    """Trains 2 epochs with a backup kept after the run (by `callback`,
    keras_ctl's by default); returns its folder."""
    backup = tmp_path / "backup"
    callback = callback or keras_ctl.callbacks.BackupAndRestore
    make_model("default").fit(
        x,
        y,
        batch_size=8,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[
            callback(
                str(backup),
                double_checkpoint=double_checkpoint,
                delete_checkpoint=False,
            )
        ],
    )
    return backup


def test_corrupted_latest_backup_falls_back_to_the_previous_one(tmp_path):
    x, y = data()
    reference = make_model("default")
    reference.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)

    backup = kept_backup(tmp_path, x, y, double_checkpoint=True)
    latest = backup / "latest.weights.h5"
    assert latest.exists() and len(list(backup.iterdir())) == 4  # latest + previous
    latest.write_bytes(b"not an HDF5 file")  # a crash while writing, say

    second = make_model("default")
    with pytest.warns(
        UserWarning, match=r"latest backup .* could not be read.*previous"
    ):
        second.fit(
            x,
            y,
            batch_size=8,
            epochs=3,
            shuffle=False,
            verbose=0,
            callbacks=[keras_ctl.callbacks.BackupAndRestore(str(backup))],
        )
    # Resumed after epoch 1 from the previous backup: epochs 2 and 3 ran.
    for got, want in zip(second.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    assert not backup.exists()  # deleted after a successful run


def test_a_backup_after_an_epochs_last_batch_resumes_at_the_next_epoch(tmp_path):
    # 53 examples in batches of 8: 7 batches an epoch. A backup every 7
    # batches is taken after each epoch's last batch, before the epoch
    # ends: a restart there ran an epoch of no batch, which failed with a
    # compiled metric ("Cannot get result() since the metric has not yet
    # been built").
    x, y = data()
    reference = make_model("default")
    reference.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    backup = str(tmp_path / "backup")

    def fit(model, epochs):
        callback = keras_ctl.callbacks.BackupAndRestore(
            backup, save_freq=7, delete_checkpoint=False
        )
        return model.fit(
            x,
            y,
            batch_size=8,
            epochs=epochs,
            shuffle=False,
            verbose=0,
            callbacks=[callback],
        )

    fit(make_model("default", metrics=["accuracy"]), epochs=2)
    resumed = make_model("default", metrics=["accuracy"])
    history = fit(resumed, epochs=3)
    assert len(history.history["loss"]) == 1  # epoch 3 only
    for got, want in zip(resumed.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


def test_a_resume_says_when_it_cannot_replay_the_datas_order(tmp_path):
    x, y = data()

    def batches():
        for start in range(0, len(x), 8):
            yield x[start : start + 8], y[start : start + 8]

    def resume(fit_data):
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        backup = kept_backup(folder, x, y, double_checkpoint=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            make_model("default").fit(
                *fit_data,
                epochs=3,
                verbose=0,
                callbacks=[keras_ctl.callbacks.BackupAndRestore(str(backup))],
            )
        return [str(w.message) for w in caught if "cannot replay" in str(w.message)]

    # Arrays replay their shuffled order; a generator orders itself.
    assert resume((x, y)) == []
    (said,) = resume((batches(),))
    assert "Python generator or a `keras.utils.PyDataset`" in said


@pytest.mark.parametrize("stale", [b"", b'{"epoch": 0, "batches_done": 3}'])
def test_the_position_is_read_from_the_weights_file(tmp_path, stale):
    # One rename commits weights and position: the json beside them is a
    # copy, so a stale or torn one (a kill between two renames, before)
    # changes nothing.
    x, y = data()
    reference = make_model("default")
    reference.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    backup = kept_backup(tmp_path, x, y, double_checkpoint=False)
    assert sorted(p.name for p in backup.iterdir()) == [
        "latest.weights.h5",
        "training_metadata.json",
    ]
    (backup / "training_metadata.json").write_bytes(stale)

    resumed = make_model("default")
    history = resumed.fit(
        x,
        y,
        batch_size=8,
        epochs=3,
        shuffle=False,
        verbose=0,
        callbacks=[keras_ctl.callbacks.BackupAndRestore(str(backup))],
    )
    assert len(history.history["loss"]) == 1  # epoch 3 only
    for got, want in zip(resumed.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "damage, which, writer",
    [
        ({"latest.weights.h5": b"torn"}, "the backup", "keras_ctl"),
        # Keras's own callback keeps the position beside the weights only.
        ({"training_metadata.json": b""}, "the backup", "keras"),
        (
            {"latest.weights.h5": b"torn", "latest.weights.h5.bkp": b"torn"},
            "both the latest and the previous backup",
            "keras_ctl",
        ),
    ],
    ids=["weights", "keras_metadata", "every_copy"],
)
def test_a_damaged_backup_says_where_and_what_to_do(tmp_path, damage, which, writer):
    x, y = data()
    double = "latest.weights.h5.bkp" in damage
    callback = {
        "keras_ctl": keras_ctl.callbacks.BackupAndRestore,
        "keras": keras.callbacks.BackupAndRestore,
    }[writer]
    backup = kept_backup(tmp_path, x, y, double_checkpoint=double, callback=callback)
    for name, content in damage.items():
        (backup / name).write_bytes(content)
    kept = sorted(p.name for p in backup.iterdir())
    with pytest.raises(
        ValueError,
        match=rf"Cannot resume from the backup in {backup}: {which} cannot be "
        r"read .*Delete that folder to start training over, or pass another "
        r"`backup_dir`",
    ):
        make_model("default").fit(
            x,
            y,
            batch_size=8,
            epochs=3,
            verbose=0,
            callbacks=[keras_ctl.callbacks.BackupAndRestore(str(backup))],
        )
    # Nothing was deleted.
    assert sorted(p.name for p in backup.iterdir()) == kept


def test_backup_dir_is_required():
    with pytest.raises(ValueError, match=r"Received: backup_dir=''"):
        keras_ctl.callbacks.BackupAndRestore("")


def test_save_on_signals_names_the_signals_it_takes():
    with pytest.raises(ValueError, match=r"Received: save_on_signals=\('SIGKILL',\)"):
        keras_ctl.callbacks.BackupAndRestore("backup", save_on_signals=("SIGKILL",))
    both = keras_ctl.callbacks.BackupAndRestore(
        "backup", save_on_signals=["SIGTERM", "SIGINT"]
    )
    assert both.save_on_signals == ("SIGTERM", "SIGINT")
    assert (
        keras_ctl.callbacks.BackupAndRestore("b", save_on_signals=()).save_on_signals
        == ()
    )


def test_signal_handlers_are_given_back_when_fit_ends(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    x, y = np.zeros((8, 4), "float32"), np.zeros((8,), "int32")
    inputs = keras.Input((4,))
    model = keras_ctl.CTLModel(inputs, keras.layers.Dense(2)(inputs))
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    seen = []

    class Spy(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(signal.getsignal(signal.SIGTERM))

    backup = keras_ctl.callbacks.BackupAndRestore(str(tmp_path / "b"))
    model.fit(x, y, batch_size=4, verbose=0, callbacks=[backup, Spy()])
    assert seen and all(handler not in (before, signal.SIG_DFL) for handler in seen)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_plain_keras_model_resumes_its_epoch_whole(tmp_path):
    # keras_ctl's callback on a `keras.Model` restores its weights and epoch;
    # the model has no engine to skip batches or add a mid-epoch backup's
    # metric state, so the resumed epoch trains and logs whole, as a fresh
    # epoch from the restored weights does.
    x, y = data()
    backup = str(tmp_path / "backup")

    def plain():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
        model.compile(
            optimizer="sgd",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        return model

    class StopAfter(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 4:
                raise KeyboardInterrupt

    def callback():
        return keras_ctl.callbacks.BackupAndRestore(
            backup, save_freq=3, delete_checkpoint=False
        )

    with pytest.raises(KeyboardInterrupt):  # a backup 3 batches into epoch 1
        plain().fit(
            x,
            y,
            batch_size=8,
            epochs=1,
            shuffle=False,
            verbose=0,
            callbacks=[callback(), StopAfter()],
        )
    fresh = plain()
    fresh.build((None, 5))
    fresh.optimizer.build(fresh.trainable_variables)
    fresh.load_weights(f"{backup}/latest.weights.h5")
    expected = fresh.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    resumed = plain().fit(
        x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[callback()]
    )
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(
            resumed.history[key], expected.history[key], rtol=1e-6
        )
