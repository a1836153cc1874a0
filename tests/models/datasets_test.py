import os

import children
import numpy as np
import pytest

from keras_ctl import datasets


def test_digits_are_the_bundled_real_digits_scaled_to_unit_range():
    (x_train, y_train), (x_test, y_test) = datasets.load("digits")
    assert x_train.shape == (1438, 8, 8, 1) and x_test.shape == (359, 8, 8, 1)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int32
    assert x_train.min() == 0.0 and x_train.max() == 1.0
    assert sorted(set(y_train.tolist())) == list(range(10))
    # The first sklearn digit is a 0.
    assert y_train[0] == 0 and y_test.shape == (359,)


def test_unknown_dataset_names_the_value():
    with pytest.raises(ValueError, match=r"Received: name='cifar'"):
        datasets.load("cifar")


def test_bad_test_fraction_names_the_value():
    with pytest.raises(ValueError, match=r"Received: test_fraction=1.5"):
        datasets.load("digits", test_fraction=1.5)


def test_failed_download_suggests_the_bundled_digits(tmp_path):
    # A fresh process with an empty Keras cache and a proxy nobody listens
    # on: the download really fails, whatever this machine has cached.
    env = dict(os.environ, KERAS_HOME=str(tmp_path))
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        env[var] = "http://127.0.0.1:9"
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    code = (
        "from keras_ctl import datasets\n"
        "try:\n"
        "    datasets.load('fashion_mnist')\n"
        "except RuntimeError as error:\n"
        "    print('ERROR:', error)\n"
    )
    result = children.run([children.PYTHON, "-c", code], env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ERROR: Could not download the fashion_mnist dataset" in result.stdout
    assert "name='digits'" in result.stdout
    assert not list(tmp_path.rglob("*.npz")) and not list(tmp_path.rglob("*.gz"))
