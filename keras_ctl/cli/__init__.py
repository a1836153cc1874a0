"""The `keras-ctl` commands: `train`, `tune` and `bench` (`launch` is
`keras_ctl.launch`). Their arguments are parsed and checked by the
`keras_ctl_cli` module, before TensorFlow starts."""
