"""Example data: real 8x8 digits bundled with scikit-learn, and the
Fashion-MNIST / MNIST downloads of `keras.datasets` for users who are online.

Every loader returns `(x_train, y_train), (x_test, y_test)` with images of
shape `(n, height, width, 1)` scaled to `[0, 1]` (float32) and integer
labels, the preprocessing of the TensorFlow distributed-training tutorial.
"""

from __future__ import annotations

import numpy as np

NAMES = ("digits", "fashion_mnist", "mnist")


Arrays = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def load(name: str = "digits", test_fraction: float = 0.2) -> Arrays:
    """Loads the example dataset `name`.

    Args:
        name: One of `"digits"` (1,797 real 8x8 digits shipped with
            scikit-learn; no download), `"fashion_mnist"` or `"mnist"`
            (28x28, downloaded by `keras.datasets`). Defaults to `"digits"`.
        test_fraction: Share of the digits kept for testing (the downloaded
            datasets come with their own split). Defaults to `0.2`.

    Returns:
        `(x_train, y_train), (x_test, y_test)`.

    Raises:
        ValueError: for an unknown `name`.
        ImportError: for `"digits"` without scikit-learn installed.
        RuntimeError: when a download fails (e.g. offline).

    Example:

    ```python
    (x_train, y_train), (x_test, y_test) = keras_ctl.datasets.load("digits")
    print(x_train.shape, x_test.shape)  # (1438, 8, 8, 1) (359, 8, 8, 1)
    ```
    """
    if name == "digits":
        return _digits(test_fraction)
    if name in ("fashion_mnist", "mnist"):
        return _download(name)
    raise ValueError(
        f"Unknown dataset. Expected one of {NAMES}. Received: name={name!r}."
    )


def _digits(test_fraction: float) -> Arrays:
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise ImportError(
            "The bundled digits come from scikit-learn, which is not "
            "installed. Install it with `pip install 'keras-ctl[examples]'`."
        ) from error
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(
            "Expected `test_fraction` between 0 and 1. "
            f"Received: test_fraction={test_fraction}."
        )
    digits = load_digits()
    # Pixel values are 0..16 in this dataset.
    images = (digits.images / np.float32(16.0)).astype("float32")[..., None]
    labels = digits.target.astype("int32")
    split = int(round(len(images) * (1.0 - test_fraction)))
    return (images[:split], labels[:split]), (images[split:], labels[split:])


def _download(name: str) -> Arrays:
    import keras

    loader = getattr(keras.datasets, name)
    try:
        (x_train, y_train), (x_test, y_test) = loader.load_data()
    except Exception as error:  # urllib, SSL and file errors all mean "no data"
        raise RuntimeError(
            f"Could not download the {name} dataset ({type(error).__name__}: "
            f"{error}). Received: name={name!r} on a machine that cannot "
            "reach the dataset host. Connect to the internet, or use the "
            "bundled data: name='digits' (or `--dataset digits`)."
        ) from error
    scale = np.float32(255.0)
    return (
        ((x_train[..., None] / scale).astype("float32"), y_train.astype("int32")),
        ((x_test[..., None] / scale).astype("float32"), y_test.astype("int32")),
    )
