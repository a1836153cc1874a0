"""A dataset that cannot be downloaded says so and names the bundled
one, in a fresh process whose download really fails."""

import os

import children


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
