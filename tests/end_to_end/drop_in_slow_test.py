"""Drop-in cases too long for the in-process tier: pickling in a fresh
process, and the reported configurations that compile with XLA
(`tests/support/reported.py`)."""

import pytest
import reported
from children import PYTHON
from children import output
from children import run

PICKLE_CHILD = """
import pickle, sys
import keras, numpy as np
import keras_ctl
inputs = keras.Input((3,))
model = keras_ctl.CTLModel(inputs, keras.layers.Dense(2)(inputs))
x = np.ones((2, 3), "float32")
loaded = pickle.loads(pickle.dumps(model))
print(type(loaded).__name__, float(np.abs(loaded(x) - model(x)).max()))
"""


def test_pickle_in_a_fresh_process():
    # In a fresh process the functional CTLModel is a class made at run
    # time: pickle must not look it up by name.
    result = run([PYTHON, "-c", PICKLE_CHILD], timeout=120)
    assert result.returncode == 0, output(result)
    name, difference = result.stdout.split()[-2:]
    assert name == "CTLModel" and float(difference) == 0.0


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
@pytest.mark.parametrize("case", sorted(reported.SLOW))
def test_reported_configurations_equal_keras(case, strategy):
    largest, tolerance = reported.difference(case, strategy)
    assert largest <= tolerance
