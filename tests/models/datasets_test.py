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
