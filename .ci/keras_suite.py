"""Keras's own tests with `Model` meaning `keras_ctl.CTLModel`, or with
plain `keras.Model` beside keras_ctl (`--coexist`).

Downloads the installed Keras version's source distribution (its tests
ship there), copies each test file twice, as it is and with every use of
`Model` rewritten to `CTLModel`, runs both copies with pytest (one process
per file and side), and reports each test that passes with `keras.Model`
and fails with `CTLModel`, re-run alone to tell an order effect from a
real failure. Exits 1 when any regression remains.

With `--coexist`, the second copy is the file as it is too, run in a
process where a `CTLModel` (Keras's step and a step of one's own) and a
`keras_ctl.GAN` have trained first (from its `conftest.py`): a regression
is a test that passes without keras_ctl and fails after it.

keras-nightly's source distribution ships no tests: pass a Keras source
tree with `--tests-from` (a checkout of keras-team/keras). Tests written
for another Keras than the installed one fail on both sides alike and
count for neither.

Usage: python .ci/keras_suite.py [--out DIR] [--coexist] [--tests-from
DIR] [test files relative to keras/src/ ...]
"""

import argparse
import importlib
import json
import re
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

import keras

FILES = [
    "trainers/trainer_test.py",
    "models/model_test.py",
    "models/functional_test.py",
    "models/sequential_test.py",
    "saving/saving_lib_test.py",
    "saving/saving_api_test.py",
    "legacy/saving/legacy_h5_format_test.py",
    "callbacks/swap_ema_weights_test.py",
    "callbacks/backup_and_restore_test.py",
    "callbacks/early_stopping_test.py",
    "callbacks/model_checkpoint_test.py",
    "callbacks/csv_logger_test.py",
    "callbacks/reduce_lr_on_plateau_test.py",
    "callbacks/learning_rate_scheduler_test.py",
    "callbacks/lambda_callback_test.py",
    "callbacks/terminate_on_nan_test.py",
    "callbacks/monitor_callback_test.py",
    "callbacks/callback_test.py",
    "callbacks/tensorboard_test.py",
    "backend/tensorflow/distribute_test.py",
    "export/saved_model_test.py",
]

# Both sides: backends other than TensorFlow are not installed.
NEUTRAL = [(r"^import jax$", "jax = None")]
# Keras 3.16 renamed the trainers (`TensorFlowTrainer` -> `Trainer`, the
# base `Trainer` -> `BaseTrainer`): test files written before the rename,
# on both sides, name them as the installed Keras does.
RENAMED = [
    (r"\bfrom keras\.src\.trainers\.trainer import Trainer\b",
     "from keras.src.trainers.trainer import BaseTrainer as Trainer"),
    (r"\bTensorFlowTrainer\b", "Trainer"),
]

# Each use of Keras's `Model` class, whichever way a test file names it.
_AS_MODEL = "from keras_ctl import CTLModel as Model"
REWRITES = [
    (r"^from keras\.src\.models\.model import Model$", _AS_MODEL),
    (r"^from keras\.src\.models import Model$", _AS_MODEL),
    (r"(?<![\w.])keras\.models\.Model\b", "keras_ctl.CTLModel"),
    (r"(?<![\w.])keras\.Model\b", "keras_ctl.CTLModel"),
    (r"(?<![\w.])models\.Model\b", "keras_ctl.CTLModel"),
]

# Tests that fail with CTLModel only because of the rewrite itself.
EXPECTED = {
    "test_basic_flow_multi_input": "builds a plain `Functional` and asserts "
    "it is an instance of `Model`, which the rewrite makes `CTLModel`",
}

CONFTEST = '''
import pytest

def pytest_configure(config):
    for marker in ("requires_trainable_backend", "large", "skip_if_backend"):
        config.addinivalue_line("markers", marker)
'''


# keras_ctl trains first, then the file's tests run with plain keras.Model.
COEXIST_CONFTEST = CONFTEST + '''
import keras
import numpy as np
import tensorflow as tf

import keras_ctl


class OwnStep(keras_ctl.CTLModel):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(y=y, y_pred=self(x, training=True))
        self.optimizer.apply(
            tape.gradient(loss, self.trainable_variables), self.trainable_variables
        )
        return {"loss": loss}


def pytest_sessionstart(session):
    x = np.random.default_rng(0).random((20, 4)).astype("float32")
    y = x[:, :1]
    for cls in (keras_ctl.CTLModel, OwnStep):
        inputs = keras.Input((4,))
        model = cls(inputs, keras.layers.Dense(1)(inputs))
        model.compile(optimizer="adam", loss="mse")
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        model.evaluate(x, y, verbose=0)
        model.predict(x, verbose=0)
    gan = keras_ctl.GAN(
        keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]),
        keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)]),
        latent_dim=2,
    )
    gan.compile(d_optimizer="sgd", g_optimizer="sgd")
    gan.fit(x, batch_size=8, epochs=1, verbose=0)
'''


def distribution():
    """The installed Keras's distribution: `keras` or `keras-nightly`."""
    try:
        metadata.version("keras-nightly")
        return "keras-nightly"
    except metadata.PackageNotFoundError:
        return "keras"


def sources(cache):
    """The unpacked source distribution of the installed Keras."""
    version = keras.__version__
    found = sorted(cache.glob(f"keras*-{version}/keras/src"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--no-binary", ":all:", f"{distribution()}=={version}", "-d", str(cache)],
            check=True,
        )
        (archive_path,) = cache.glob(f"keras*-{version}.tar.gz")
        with tarfile.open(archive_path) as archive:
            archive.extractall(cache, filter="data")
        found = sorted(cache.glob(f"keras*-{version}/keras/src"))
    return found[0]


def rewrite(text, rules):
    for pattern, replacement in rules:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    return text


def run(directory, test_file, node=None, timeout=1800):
    """`{test id: passed}` of one pytest run in a fresh process."""
    report = directory / f"{test_file.stem}.{abs(hash(node))}.xml"
    target = f"{test_file.name}::{node}" if node else test_file.name
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-W", "ignore", f"--junitxml={report}", target],
        cwd=directory, capture_output=True, timeout=timeout,
        env={"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3",
             "PATH": "/usr/bin:/bin", "HOME": str(directory)},
    )
    results = {}
    if not report.exists():
        return results
    for case in ET.parse(report).iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        outcome = [child.tag for child in case]
        if "skipped" in outcome:
            continue
        results[name] = not ("failure" in outcome or "error" in outcome)
    return results


def node_id(name):
    cls, test = name.split("::")
    return f"{cls}::{test}" if cls and not cls.endswith("_test") else test


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/keras-suite")
    parser.add_argument("--coexist", action="store_true")
    parser.add_argument(
        "--tests-from",
        default=None,
        help="a Keras source tree whose keras/src holds the test files, for a "
        "Keras whose source distribution ships none (keras-nightly)",
    )
    parser.add_argument("files", nargs="*", default=FILES)
    args = parser.parse_args()
    out = Path(args.out).resolve()
    if args.tests_from:
        src = Path(args.tests_from).resolve() / "keras" / "src"
    else:
        src = sources(out / "cache")
    mode = "coexist" if args.coexist else "CTLModel"
    summary = {"keras": keras.__version__, "mode": mode, "files": {}, "regressions": []}
    neutral = NEUTRAL
    trainer = importlib.import_module("keras.src.backend.tensorflow.trainer")
    if not hasattr(trainer, "TensorFlowTrainer"):
        neutral = NEUTRAL + RENAMED
    for relative in args.files:
        original = rewrite((src / relative).read_text(), neutral)
        name = relative.replace("/", "__")
        sides = {}
        ctl = "import keras_ctl  # noqa\n" + rewrite(original, REWRITES)
        if args.coexist:
            ctl = original
        for side, text in (("keras", original), ("ctl", ctl)):
            directory = out / side
            directory.mkdir(parents=True, exist_ok=True)
            coexisting = args.coexist and side == "ctl"
            (directory / "conftest.py").write_text(
                COEXIST_CONFTEST if coexisting else CONFTEST
            )
            test_file = directory / name
            test_file.write_text(text)
            sides[side] = run(directory, test_file)
        if not any(sides["keras"].values()):
            raise SystemExit(f"{relative}: no test passed with keras.Model")
        keras_passed = {t for t, ok in sides["keras"].items() if ok}
        ctl_passed = {t for t, ok in sides["ctl"].items() if ok}
        expected_here = {} if args.coexist else EXPECTED
        failing = sorted(
            t for t in keras_passed - ctl_passed
            if t.split("::")[1] not in expected_here
        )
        expected = sorted(
            t for t in keras_passed - ctl_passed if t.split("::")[1] in expected_here
        )
        alone = {}
        for test in failing:
            result = run(out / "ctl", out / "ctl" / name, node_id(test), timeout=600)
            alone[test] = "passes alone" if any(result.values()) else "fails alone"
        summary["files"][relative] = {
            "keras.Model passed": len(keras_passed),
            "CTLModel passed": len(ctl_passed & keras_passed),
            "regressions": len(failing),
            "expected": {t: expected_here[t.split("::")[1]] for t in expected},
        }
        summary["regressions"] += [
            {"file": relative, "test": t, "alone": alone[t]} for t in failing
        ]
        print(f"{relative}: {summary['files'][relative]}", flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    total = {
        key: sum(f[key] for f in summary["files"].values())
        for key in ("keras.Model passed", "CTLModel passed", "regressions")
    }
    print(f"total: {total}")
    for item in summary["regressions"]:
        print(f"  {item['file']}::{item['test']} ({item['alone']})")
    return 1 if summary["regressions"] else 0


if __name__ == "__main__":
    sys.exit(main())
