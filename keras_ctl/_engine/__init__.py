"""How `fit()`, `evaluate()` and `predict()` run a `CTLModel`'s steps.

Private: the public surface is `keras_ctl.CTLModel` and the building blocks
in `keras_ctl.blocks`, which are built on `keras_ctl._replicas` (the replica
count, the sum across replicas, and the one division every exact mean
uses), below this package and the seam (`keras_ctl._keras`).

- `loss`: the compiled loss as per-replica shares.
- `forward`: the forward pass and loss of the default steps, eager or XLA,
  with the gradients and the global count in one all-reduce where it can.
- `update`: gradients summed across replicas once, then applied as they
  are (clipping and the loss scale's check see the sum).
- `accumulation`: `gradient_accumulation_steps`, one all-reduce per update.
- `padding`: a placeholder example for replicas without examples.
- `gather`: every replica's rows, for losses over the global batch.
- `positions`: each example's position in its global batch, carried by
  `fit()`'s batches (for one device's random draws).
- `plan`: the decisions a step function is built with (XLA, steps per call).
- `loop`: the train/test/predict functions and their cross-replica logs.
- `resume`: skipping the batches a killed run trained on.
- `errors`: TensorFlow's run-time errors that bad data or a replica's
  share of the batch causes, explained.
"""
