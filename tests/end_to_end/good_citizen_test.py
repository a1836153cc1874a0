"""keras_ctl changes nothing of Keras outside its own calls: after every
public call path returns or raises (fit, a fit that raises, is interrupted
or stopped by a callback, a step of one's own, evaluate, predict, the
`*_on_batch` calls, a GAN, nested calls), every attribute of Keras, NumPy,
TensorFlow's distribution modules and every owner that keras_ctl's
inventory names is Keras's own again (identity); during the call the
replacements were in place. A plain keras.Model trained while a CTLModel
trains in another thread, and one used inside a CTLModel's fit, compute
what they compute alone."""

import json

import children
import pytest

PATHS = [
    "fit",
    "fit raising",
    "fit interrupted",
    "fit stopped by a callback",
    "own train_step",
    "evaluate, predict, *_on_batch, get_weights",
    "GAN",
    "plain predict inside a fit",
    "plain fit beside a thread",
]
OUTCOMES = {"fit raising": "ValueError", "fit interrupted": "KeyboardInterrupt"}


@pytest.fixture(scope="module")
def report():
    result = children.run([children.PYTHON, "good_citizen_child.py"], timeout=300)
    assert result.returncode == 0, children.output(result)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_check_covers_keras_numpy_and_the_inventory(report):
    assert report["checked"] > 15000
    assert sorted(report["paths"]) == sorted(PATHS)


@pytest.mark.parametrize("path", PATHS)
def test_keras_is_its_own_again_after_each_call_path(report, path):
    found = report["paths"][path]
    assert found["outcome"] == OUTCOMES.get(path, "returned")
    assert found["in_place"], "the replacements were not in place during it"
    assert found["changed"] == []


@pytest.mark.parametrize(
    "path", ["plain predict inside a fit", "plain fit beside a thread"]
)
def test_plain_keras_beside_keras_ctl_computes_what_it_computes_alone(report, path):
    assert report["paths"][path]["extra"] == 0.0
