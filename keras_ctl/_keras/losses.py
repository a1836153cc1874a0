"""Keras's loss reduction, as its private functions spell it."""

from keras_ctl._keras import names


def standardize_reduction(reduction: str | None) -> str | None:
    """`reduction` as Keras's losses name it (`losses.loss.
    standardize_reduction`: `"mean"` and `"sum_over_batch_size"` alike)."""
    return names.member("keras.src.losses.loss", "standardize_reduction")(reduction)


def inside_a_layer_call() -> bool:
    """Whether a layer's `call()` runs (Keras's call context, per thread:
    `backend.common.global_state`'s `current_call_ctx`)."""
    get = names.member("keras.src.backend.common.global_state", "get_global_attribute")
    return get("current_call_ctx") is not None
