"""`fit()`, `evaluate()` and `predict()` under `ParameterServerStrategy`:
each job is a real cluster on 127.0.0.1 started by `keras-ctl launch --ps`
(parameter servers and workers in their own processes), with the chief in
`parameter_server_child.py`."""

import json

import cases
import children
import keras
import numpy as np
import tensorflow as tf

TIMEOUT_S = 300
ATOL = 1e-5


def job(scenario, folder, workers, ps=1):
    """Runs one job; returns its result and output."""
    output = folder / f"{scenario}.json"
    command = [
        *children.LAUNCHER,
        "--workers",
        workers,
        "--ps",
        ps,
        "--timeout",
        TIMEOUT_S,
        "--",
        children.PYTHON,
        "parameter_server_child.py",
        scenario,
        output,
    ]
    result = children.run(command, timeout=TIMEOUT_S + 60)
    assert result.returncode == 0, children.output(result)
    return json.loads(output.read_text()), result.stdout


def assert_close(got, want):
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=0)


def test_one_worker_equals_one_device(tmp_path):
    result, _ = job("one_worker", tmp_path, workers=1)
    reference = result["reference"]
    for name in ("plain", "spe2"):  # 5 steps an epoch: 2 + 2 + 1 per call
        got = result[name]
        assert_close(got["weights"], reference["weights"])
        for key, values in reference["history"].items():
            np.testing.assert_allclose(got["history"][key], values, atol=ATOL)
        np.testing.assert_allclose(got["evaluate"], reference["evaluate"], atol=ATOL)
        np.testing.assert_allclose(got["predict"], reference["predict"], atol=ATOL)
        assert got["iterations"] == 10  # 2 epochs of 5 steps
    assert (
        "does not take `class_weight`. Received: class_weight={"
        in (result["class_weight_error"])
    )
    gan, want = result["gan"], result["gan_reference"]
    assert_close(gan["weights"], want["weights"])
    for key, values in want["history"].items():
        np.testing.assert_allclose(gan["history"][key], values, atol=ATOL)
    assert gan["iterations"] == want["iterations"] == [28, 14]
    # compute_loss_over="global_batch": each step is one worker's whole batch.
    coupled, want = result["coupled"], result["coupled_reference"]
    assert_close(coupled["weights"], want["weights"])
    for key, values in want["history"].items():
        np.testing.assert_allclose(coupled["history"][key], values, atol=ATOL)
    for key, value in want["evaluate"].items():
        np.testing.assert_allclose(coupled["evaluate"][key], value, atol=ATOL)


def test_two_workers_apply_every_step_once(tmp_path):
    result, _ = job("two_workers", tmp_path, workers=2)
    arrays = result["arrays"]  # 200 examples, batch 8, 3 epochs
    assert arrays["iterations"] == 3 * 25
    assert arrays["history"]["loss"][-1] < arrays["history"]["loss"][0]
    # The tutorial's dataset_fn and a repeated dataset: 2 epochs of 10 steps.
    for name in ("dataset_fn", "dataset"):
        assert result[name]["iterations"] == 20
        assert len(result[name]["history"]["loss"]) == 2
    # ModelCheckpoint and BackupAndRestore wrote on the chief.
    assert (tmp_path / "model.keras").stat().st_size > 0
    metadata = json.loads((tmp_path / "backup" / "training_metadata.json").read_text())
    assert metadata["epoch"] == 3


def test_a_worker_killed_mid_fit_does_not_stop_training(tmp_path):
    result, output = job("kill_worker", tmp_path, workers=2)
    assert "worker 1 ended; starting it again" in output
    assert result["iterations"] == 3 * 20
    assert len(result["history"]["loss"]) == 3


def test_a_lost_parameter_server_ends_fit_and_the_job_resumes(tmp_path):
    first, _ = job("ps_lost", tmp_path, workers=2)
    assert "A parameter server (or every worker) became unavailable" in first["error"]
    assert "BackupAndRestore" in first["error"]
    # Resumed with another worker count (2 workers, then 1).
    second, _ = job("ps_lost", tmp_path, workers=1)
    # Epoch 1 came from the backup: the restart trained epochs 2 and 3.
    assert len(second["history"]["loss"]) == 2
    assert second["iterations"] == 3 * 20


def test_a_gan_trains_under_two_workers(tmp_path):
    result, _ = job("gan", tmp_path, workers=2)
    assert result["iterations"] == [28, 14]  # 7 steps x 2 epochs, d_steps 2
    assert all(np.isfinite(result["history"]["d_loss"]))


def test_a_sharded_embedding_trains_saves_and_restores_without_a_strategy(tmp_path):
    result, _ = job("embedding", tmp_path, workers=1, ps=2)
    assert result["shards"] == [[250, 8], [250, 8]]
    assert result["iterations"] == 3 * 4
    assert result["loss"][-1] < result["loss"][0]
    ids, _ = cases.embedding_data()
    loaded = keras.saving.load_model(tmp_path / "embedding.keras")
    np.testing.assert_allclose(
        loaded.predict(ids, verbose=0), result["predict"], atol=ATOL
    )
    fresh = cases.embedding_model()
    tf.train.Checkpoint(model=fresh).read(str(tmp_path / "checkpoint")).expect_partial()
    np.testing.assert_allclose(
        fresh.predict(ids, verbose=0), result["predict"], atol=ATOL
    )
