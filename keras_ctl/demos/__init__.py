"""Small models, a tuner and plots for the `keras-ctl` command and the
examples. Not part of the library's API: they may change between releases.
The example datasets are public, in `keras_ctl.datasets`."""
