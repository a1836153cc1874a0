"""A generated topology move in this process, between one
device and its 2 replicas, in float32 (`topology_moves.py`; the 30 float64
moves on 1, 2 and 3 replicas are `tests/end_to_end/topology_moves_test.py`:
Keras keeps dtypes across a change of `floatx` in one process)."""

import warnings

import devices
import keras
import pytest
import topology_moves

import keras_ctl

MOVES = topology_moves.draw(seed=5, count=1, replica_counts=(1, 2))
WEIGHTS_TOLERANCE, LOGS_TOLERANCE = 1e-6, 1e-5  # float32


def strategy(replicas):
    return devices.get("default" if replicas == 1 else "mirrored")


@pytest.mark.parametrize("move", MOVES, ids=[m["name"] for m in MOVES])
def test_a_move_ends_and_logs_as_one_device(move, tmp_path):
    topology_moves.run_before(move, strategy(move["before"]), str(tmp_path))
    run = topology_moves.run_after(move, strategy(move["after"]), str(tmp_path))
    reference = topology_moves.run_reference(move, strategy(1))
    assert topology_moves.batches_trained(run) == topology_moves.batches_left(move)
    weights, logs = topology_moves.largest_differences(run, reference)
    assert weights <= WEIGHTS_TOLERANCE, move
    assert logs <= LOGS_TOLERANCE, move


def dropout_model(strategy, random_draws):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        inputs = keras.Input((5,))
        hidden = keras.layers.Dropout(0.3)(keras.layers.Dense(4)(inputs))
        model = keras_ctl.CTLModel(inputs, keras.layers.Dense(1)(hidden))
        model.compile(optimizer="sgd", loss="mse", random_draws=random_draws)
    return model


def stopped_and_resumed(folder, before, after, random_draws="per_replica"):
    """Messages of the warnings the resume on `after` replicas raised."""
    x, y = topology_moves.data()
    y = y.astype("float32")
    backup = keras_ctl.callbacks.BackupAndRestore(
        folder, save_freq=2, save_on_signals=()
    )
    with pytest.raises(topology_moves.Stopped):
        dropout_model(strategy(before), random_draws).fit(
            x,
            y,
            batch_size=16,
            epochs=2,
            verbose=0,
            callbacks=[backup, topology_moves.StopAt(0, 2)],
        )
    backup = keras_ctl.callbacks.BackupAndRestore(
        folder, save_freq=2, save_on_signals=()
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dropout_model(strategy(after), random_draws).fit(
            x, y, batch_size=16, epochs=2, verbose=0, callbacks=[backup]
        )
    return [str(w.message) for w in caught if "draws random" in str(w.message)]


@pytest.mark.slow  # for the fast tier's time; the suite runs it
def test_a_model_drawing_per_replica_warns_when_resumed_on_another_count(tmp_path):
    [message] = stopped_and_resumed(str(tmp_path / "backup"), before=1, after=2)
    assert "written on 1 replica(s); this run has 2" in message
    assert "Resume on 1 replica(s)" in message
    assert stopped_and_resumed(str(tmp_path / "same"), before=2, after=2) == []
    # One device's draws, the default, resume on any count.
    assert stopped_and_resumed(str(tmp_path / "one"), 1, 2, random_draws=None) == []


def test_a_mid_epoch_backup_resumed_in_batches_of_another_size_is_refused(tmp_path):
    move = {
        "name": "other_batches",
        "family": "mlp",
        "pipeline": "arrays",
        "save_freq": 2,
        "stop": [1, 2],
    }
    topology_moves.run_before(move, strategy(1), str(tmp_path))
    backup = tmp_path / "other_batches" / "latest.weights.h5"
    saved = backup.read_bytes()
    x, y = topology_moves.data()
    model = topology_moves.build("mlp", strategy(2))
    callback = keras_ctl.callbacks.BackupAndRestore(
        str(tmp_path / "other_batches"), save_freq=2, save_on_signals=()
    )
    with pytest.raises(
        ValueError, match="epoch of 6 batches, and this run's epoch has 12"
    ):
        model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[callback])
    assert backup.read_bytes() == saved
