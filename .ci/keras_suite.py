"""Keras's own tests with `Model` meaning `keras_ctl.CTLModel`.

Downloads the installed Keras version's source distribution (its tests
ship there), copies each test file twice, as it is and with every use of
`Model` rewritten to `CTLModel`, runs both copies with pytest (one process
per file and side), and reports each test that passes with `keras.Model`
and fails with `CTLModel`, re-run alone to tell an order effect from a
real failure. Exits 1 when any regression remains.

Usage: python .ci/keras_suite.py [--out DIR] [test files relative to
keras/src/ ...]
"""

import argparse
import json
import re
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
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


def sources(cache):
    """The unpacked source distribution of the installed Keras."""
    root = cache / f"keras-{keras.__version__}"
    if not root.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--no-binary", ":all:", f"keras=={keras.__version__}", "-d", str(cache)],
            check=True,
        )
        with tarfile.open(cache / f"keras-{keras.__version__}.tar.gz") as archive:
            archive.extractall(cache, filter="data")
    return root / "keras" / "src"


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
    parser.add_argument("files", nargs="*", default=FILES)
    args = parser.parse_args()
    out = Path(args.out).resolve()
    src = sources(out / "cache")
    summary = {"keras": keras.__version__, "files": {}, "regressions": []}
    for relative in args.files:
        original = rewrite((src / relative).read_text(), NEUTRAL)
        name = relative.replace("/", "__")
        sides = {}
        ctl = "import keras_ctl  # noqa\n" + rewrite(original, REWRITES)
        for side, text in (("keras", original), ("ctl", ctl)):
            directory = out / side
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "conftest.py").write_text(CONFTEST)
            test_file = directory / name
            test_file.write_text(text)
            sides[side] = run(directory, test_file)
        if not any(sides["keras"].values()):
            raise SystemExit(f"{relative}: no test passed with keras.Model")
        keras_passed = {t for t, ok in sides["keras"].items() if ok}
        ctl_passed = {t for t, ok in sides["ctl"].items() if ok}
        failing = sorted(
            t for t in keras_passed - ctl_passed if t.split("::")[1] not in EXPECTED
        )
        expected = sorted(
            t for t in keras_passed - ctl_passed if t.split("::")[1] in EXPECTED
        )
        alone = {}
        for test in failing:
            result = run(out / "ctl", out / "ctl" / name, node_id(test), timeout=600)
            alone[test] = "passes alone" if any(result.values()) else "fails alone"
        summary["files"][relative] = {
            "keras.Model passed": len(keras_passed),
            "CTLModel passed": len(ctl_passed & keras_passed),
            "regressions": len(failing),
            "expected": {t: EXPECTED[t.split("::")[1]] for t in expected},
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
