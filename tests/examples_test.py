"""Every example runs from a fresh interpreter and writes what it promises."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(script, *args, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout


def test_mirrored_digits_matches_one_device(tmp_path):
    out = tmp_path / "run"
    stdout = run_example("mirrored_digits.py", "--epochs", "1", "--out", str(out))
    rows = {
        row["run"]: row for row in json.loads((out / "comparison.json").read_text())
    }
    ctl = rows["CTLModel, 3 replicas"]
    assert ctl["max_weight_difference"] < 1e-5
    reference = rows["keras.Model, 1 device"]
    assert abs(ctl["test_loss"] - reference["test_loss"]) < 1e-5
    assert abs(ctl["test_accuracy"] - reference["test_accuracy"]) < 1e-5
    history = json.loads((out / "history.json").read_text())
    assert set(history) == {"loss", "accuracy"} and len(history["loss"]) == 1
    assert (out / "model.keras").stat().st_size > 10_000
    assert "CTLModel, 3 replicas" in stdout


def test_mirrored_digits_rejects_zero_replicas():
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "mirrored_digits.py"),
            "--replicas",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "Received: --replicas 0" in result.stderr
