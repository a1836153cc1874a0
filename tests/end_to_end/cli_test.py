"""The `keras-ctl` command, run as a user runs it: a fresh process each time."""

import csv
import json
import os

import children
import pytest


def keras_ctl(*args, timeout=300, env=None):
    return children.run([children.KERAS_CTL, *args], timeout=timeout, env=env)


def test_train_classifier_mirrored_writes_history_and_pictures(tmp_path):
    out = tmp_path / "run"
    result = keras_ctl(  # --replicas 2 alone means MirroredStrategy, as in `tune`
        "train",
        "classifier",
        "--replicas",
        "2",
        "--epochs",
        "2",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    history = json.loads((out / "history.json").read_text())
    assert set(history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert len(history["loss"]) == 2 and history["loss"][1] < history["loss"][0]
    rows = list(csv.reader((out / "history.csv").open()))
    assert rows[0][0] == "epoch" and [r[0] for r in rows[1:]] == ["1", "2"]
    assert float(rows[2][rows[0].index("loss")]) == pytest.approx(history["loss"][1])
    assert (out / "learning_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "model.keras").stat().st_size > 10_000
    assert list((out / "logs").rglob("events.out.tfevents.*"))
    assert not (out / "backup").exists()  # deleted after a complete run
    assert "test_accuracy" in result.stdout and "learning_curves.png" in result.stdout
    assert "MirroredStrategy, 2 replica(s)" in result.stdout
    # Validation is the last tenth of the train split, not the test split.
    test_loss = float(result.stdout.split("test_loss: ")[1].split()[0])
    assert abs(history["val_loss"][-1] - test_loss) > 1e-3


def test_train_gan_writes_a_sample_grid_per_epoch(tmp_path):
    out = tmp_path / "gan"
    # TensorFlow's error lines shown, to see that the remapper has none.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="1")
    result = keras_ctl("train", "gan", "--epochs", "1", "--out", str(out), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "samples_epoch_001.png").read_bytes()[:4] == b"\x89PNG"
    history = json.loads((out / "history.json").read_text())
    assert set(history) == {"d_loss", "g_loss"}
    assert (out / "gan.keras").exists() and (out / "learning_curves.png").exists()
    assert "remapper failed" not in result.stderr


def test_train_multihead_freezes_the_trunk_and_saves_it(tmp_path):
    out = tmp_path / "heads"
    result = keras_ctl("train", "multihead", "--epochs", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    history = json.loads((out / "history.json").read_text())
    assert {"class_loss", "class_accuracy", "parity_loss", "parity_accuracy"} == set(
        history
    )
    assert (out / "trunk.keras").exists()
    first = result.stdout.index("Phase 1 of 2: the trunk and the class head")
    assert result.stdout.index("Phase 2 of 2: a parity head") > first


def test_train_under_two_launched_workers(tmp_path):
    out = tmp_path / "mw"
    result = keras_ctl(
        "launch",
        "--workers",
        "2",
        "--timeout",
        "240",
        "--",
        children.KERAS_CTL,
        "train",
        "classifier",
        "--strategy",
        "multiworker",
        "--epochs",
        "1",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert len(json.loads((out / "history.json").read_text())["loss"]) == 1
    assert (out / "model.keras").exists()
    assert not list(out.glob("workertemp_*"))  # the other worker cleaned up


def test_tune_classifier_writes_the_best_trial(tmp_path):
    out = tmp_path / "tune"
    result = keras_ctl(
        "tune",
        "classifier",
        "--replicas",
        "2",
        "--trials",
        "2",
        "--epochs",
        "1",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    best = json.loads((out / "best_trial.json").read_text())
    assert 0.0 <= best["val_accuracy"] <= 1.0
    assert best["hyperparameters"]["batch_size_per_replica"] in (16, 32)
    progress = [
        line for line in result.stdout.splitlines() if line.startswith("trial ")
    ]
    assert [line.split(":")[0] for line in progress] == ["trial 1 of 2", "trial 2 of 2"]
    assert all("best so far: trial " in line for line in progress)


@pytest.mark.long
def test_bench_writes_tables_and_a_chart(tmp_path):
    bench = os.path.join(children.ROOT, "benchmarks", "bench.py")
    result = children.run(
        [
            children.PYTHON,
            bench,
            "--models",
            "mlp",
            "--replicas",
            "2",
            "--rounds",
            "1",
            "--steps",
            "3",
            "--ps-workers",
            "2",
            "--out",
            str(tmp_path),
        ],
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = (tmp_path / "benchmark.md").read_text().splitlines()
    fit_rows = [line.split("|")[1:-1] for line in lines if line.startswith("| mlp")]
    # spe 1 and 32, XLA off and on; CTLModel and the hand loop run in all four.
    assert [(r[2].strip(), r[3].strip()) for r in fit_rows] == [
        ("1", "off"),
        ("1", "on"),
        ("32", "off"),
        ("32", "on"),
    ]
    for row in fit_rows:  # CTLModel steps/s, hand loop steps/s, their ratio
        assert float(row[4]) > 0 and float(row[6]) > 0 and float(row[8]) > 0
    costs = [line.split("|")[1:-1] for line in lines if line.startswith("| 2 |")]
    costs = [row for row in costs if "%" in "".join(row)]
    assert len(costs) == 2  # spe 1 and 32
    for row in costs:  # all-reduce and clipping costs; accumulation's ratio
        assert row[4].strip().endswith("%") and row[7].strip().endswith("%")
        assert float(row[8]) > 0 and float(row[9]) > 0
    assert (
        "gradient_accumulation_steps=4): accumulating 1 (the count), updating 2 "
        "(the count, then the gradients), without accumulation 1" in "\n".join(lines)
    )
    # Collectives per step at steps_per_execution 1, 8, 32, and the hand
    # loop's: on 2 replicas in this process, then under 2 worker processes
    # (where the hand loop's iterator agrees on "has data" at every step).
    collectives = [line for line in lines if line.startswith("| 2 replicas |")]
    # One a step: the gradients, the count and the logs together.
    assert "| 2 replicas | CTLModel.fit, accuracy | 1 | 1 | 1 | 1 |" in collectives
    workers = [line for line in lines if line.startswith("| 2 workers |")]
    assert "| 2 workers | CTLModel.fit, accuracy | 1 | 1 | 1 | 3 |" in workers
    assert len(collectives) == len(workers) == 6

    # What a fit() call costs beyond its steps (an estimate: noise can make
    # it negative at 3 steps); the 2 workers' timings.
    def row_after(header):
        row = lines[lines.index(next(h for h in lines if header in h)) + 2]
        return [float(cell) for cell in row.split("|")[2:-1]]

    assert len(row_after("CTLModel.fit s per call")) == 3
    assert all(rate > 0 for rate in row_after("CTLModel.fit, accuracy steps/s"))
    header = next(h for h in lines if "workers (1 parameter server)" in h)
    assert lines[lines.index(header) + 2].startswith("| 2 |")  # 2 workers
    assert row_after("workers (1 parameter server)")[0] > 0  # steps/s
    chart = (tmp_path / "benchmark.png").read_bytes()
    assert chart[:4] == b"\x89PNG"
    # 12 inches at 110 dpi: the fit ratios, then the 2 workers' collectives.
    assert int.from_bytes(chart[16:20], "big") == 1320


def test_mixed_precision_trains_in_bfloat16_on_cpu(tmp_path):
    import keras

    from keras_ctl import datasets

    out = tmp_path / "mixed"
    result = keras_ctl(
        "train", "classifier", "--mixed-precision", "--epochs", "1", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    model = keras.models.load_model(out / "model.keras")
    policies = {layer.dtype_policy.name for layer in model.layers[1:]}
    assert policies == {"mixed_bfloat16"}
    assert all(w.dtype == "float32" for w in model.weights)  # float32 masters
    _, (x_test, y_test) = datasets.load("digits")
    logits = model.predict(x_test, verbose=0)
    assert str(logits.dtype) == "bfloat16"
    accuracy = float(((logits.astype("float32").argmax(-1)) == y_test).mean())
    printed = float(result.stdout.split("test_accuracy:")[1].split()[0])
    assert accuracy == pytest.approx(printed, abs=1e-4)
    assert accuracy > 0.3  # one epoch on digits learns in bfloat16 (chance: 0.1)


def test_offline_dataset_suggests_digits(tmp_path):
    env = dict(os.environ, KERAS_HOME=str(tmp_path))
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        env[var] = "http://127.0.0.1:9"
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    result = keras_ctl(
        "train",
        "classifier",
        "--dataset",
        "fashion_mnist",
        "--out",
        str(tmp_path / "run"),
        env=env,
    )
    assert result.returncode == 2
    assert "--dataset digits" in result.stderr
