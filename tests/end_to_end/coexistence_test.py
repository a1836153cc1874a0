"""Plain keras.Model and CTLModel alternating in one process: generated
configurations (`configurations.alternate`), a float32 one first and then
float64 ones, each plain run equal to the same run in a process where every
CTLModel is a keras.Model (the control: Keras keeps float32 for models
built after `set_floatx("float64")` once a float32 model exists, so a
fresh process is not the reference). The CTLModel runs equal the control's
keras.Model runs too."""

import children
import numpy as np
import pytest

pytestmark = pytest.mark.long

SEEDS = "7:11"  # a float32 configuration, then three float64 ones


def alternated(tmp_path, *flags):
    out = tmp_path / ("control.npz" if flags else "mixed.npz")
    result = children.run(
        [
            children.PYTHON,
            "configurations.py",
            "--alternate",
            out,
            "--seeds",
            SEEDS,
            "--replicas",
            "2",
            *flags,
        ],
        timeout=600,
    )
    assert result.returncode == 0, children.output(result)
    return dict(np.load(out))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("coexistence")
    return alternated(tmp_path), alternated(tmp_path, "--control")


def test_plain_keras_runs_equal_the_control_exactly(runs):
    mixed, control = runs
    assert mixed.keys() == control.keys()
    plain = [key for key in mixed if int(key.split("/")[0]) % 2 == 0]
    assert len(plain) > 20
    for key in plain:
        np.testing.assert_array_equal(mixed[key], control[key], err_msg=key)


def test_ctl_models_between_them_equal_keras_on_one_device(runs):
    mixed, control = runs
    # Odd runs are the CTLModel's; run 1 is the float32 one.
    float64_ctl_runs = [key for key in mixed if int(key.split("/")[0]) in (3, 5, 7)]
    assert float64_ctl_runs
    for key in float64_ctl_runs:
        np.testing.assert_allclose(
            mixed[key], control[key], rtol=1e-9, atol=1e-9, err_msg=key
        )
