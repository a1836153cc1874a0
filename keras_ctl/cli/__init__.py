"""The `keras-ctl` commands `train` and `tune`, whose arguments the
`keras_ctl_cli` module parses and checks before TensorFlow starts (`launch`
is `keras_ctl_launch`; the benchmark is `benchmarks/bench.py`, outside the
package)."""
