"""The public API: what `tests/unit/public_api_test.py` checks for types and
docstrings, and whose docstring examples `docstring_examples.py` runs."""

import inspect

import keras_ctl

# Public too, but left out of `keras_ctl.__all__` (keras-tuner is optional).
EXTRA = ("CTLHyperModel", "tuning")

# What a user calls, besides the functions: the methods Keras does not
# document for them (Keras's hooks, `train_step` to `get_config`, keep
# Keras's documentation).
USER_METHODS = {
    "CTLModel": (
        "from_model compile fit evaluate predict save save_weights compute_loss "
        "optimizers_and_variables"
    ),
    "GAN": "compile call fit train_discriminator train_generator",
    "CTLHyperModel": "fit batch_size_per_replica",
}


def public_objects():
    """`(qualified name, object)` of each public function and class."""
    for name in (*keras_ctl.__all__, *EXTRA):
        obj = getattr(keras_ctl, name)
        if inspect.ismodule(obj):
            for member, value in vars(obj).items():
                own = getattr(value, "__module__", None) == obj.__name__
                if own and not member.startswith("_") and callable(value):
                    yield f"{name}.{member}", value
        else:
            yield name, obj


def user_methods():
    """`(qualified name, method)` of each method of `USER_METHODS`."""
    for class_name, methods in USER_METHODS.items():
        owner = getattr(keras_ctl, class_name)
        for method in methods.split():
            yield f"{class_name}.{method}", getattr(owner, method)
