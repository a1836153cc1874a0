"""The user's other modules, for the `spelling` axis of `generated_steps`.

The same step written in other places and forms: a helper module
(`helpers`), replica arithmetic imported under other names (`aliases`), a
decorator of one's own (`decorators`), a mixin (`mixins`) and a library's
base class (`library`). Whatever the spelling, keras_ctl must read the step
the same way: as one device's code unless `keras_ctl.written_in_shares`
runs as part of it.

Each module's steps take `(model, data)` and call back into the generated
model: `model.step(data)` (the step written for one device),
`model.coupled_loss(y, y_pred, sample_weight)` (a loss over the whole
batch) and `model.logs(y, y_pred, loss)`.
"""
