"""`CTLModel.from_model`'s classes: a model's own class with CTLModel mixed
in (or, for a functional model, CTLModel with Keras's `Functional`), each
saved, loaded and pickled as the class it was made from."""

import importlib

import keras

from keras_ctl import _keras


@keras.saving.register_keras_serializable(package="keras_ctl")
class Converted:
    """Loads a model saved after `CTLModel.from_model` converted it.

    A converted Sequential or subclassed model saves its own class's config
    plus the registered names of that class and of the class it was
    converted to; loading rebuilds the model with its own class, then
    converts it again.
    """

    def get_config(self):  # registration asks for it; never instantiated
        return {}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        original = _class_named(config.pop(_ORIGINAL_CLASS))
        target = _class_named(config.pop(_TARGET_CLASS))
        if original is None or target is None:
            raise ValueError(
                "Cannot load a converted model: its class is not registered. "
                "Register it with `@keras.saving.register_keras_serializable()` "
                "(or pass it in `custom_objects`) before loading."
            )
        return target.from_model(original.from_config(config))


def _class_named(name):
    """A registered class, or a Keras class by the full module path a
    saved config names it by (Keras's `Sequential`, for one)."""
    found = keras.saving.get_registered_object(name)
    if found is None and name.startswith("keras.") and "." in name:
        module, _, class_name = name.rpartition(".")
        found = getattr(importlib.import_module(module), class_name, None)
    return found


def _class_name(cls):
    name = keras.saving.get_registered_name(cls)
    if keras.saving.get_registered_object(name) is cls:
        return name
    return f"{cls.__module__}.{cls.__qualname__}"  # a Keras class


_ORIGINAL_CLASS = "keras_ctl_original_class"
_TARGET_CLASS = "keras_ctl_converted_to"


def class_to_make(cls, ctl_model, args, kwargs):
    """The class `CTLModel.__new__` makes: `cls`, or its functional variant
    when `CTLModel`'s own constructor receives functional arguments.

    A class without a constructor of its own passes its arguments to
    `CTLModel.__init__` as they are: decided here, before Keras's
    `Layer.__new__` wraps the class's `build` (a functional model's
    `build_from_config` needs `Functional.build`; Keras's `Model.__new__`
    does the same for `Model(inputs, outputs)`)."""
    if (
        cls.__init__ is ctl_model.__init__
        and _keras.functional_init_arguments(args, kwargs)
        and not issubclass(cls, _keras.Functional)
    ):
        return functional_variant(cls)
    return cls


def make_functional_if_asked(model, args, kwargs):
    """Gives `model` its class's functional variant when its constructor
    received functional arguments (`inputs, outputs`).

    Keras 3.15 makes a `Model` subclass functional by rewriting the
    `__bases__` of its whole hierarchy for good (`Model.__init__`,
    `inject_functional_model_class`): after one such construction every
    CTLModel subclass (GAN too) would be functional. As in Keras, the
    arguments that reach `CTLModel`'s constructor decide, not those of a
    subclass's own constructor (`VAE(encoder, decoder)`); only this
    instance's class changes."""
    if _keras.functional_init_arguments(args, kwargs) and not isinstance(
        model, _keras.Functional
    ):
        model.__class__ = functional_variant(type(model))


def convert(model, cls):
    """`model` (a `keras.Model`) made an instance of `cls` in place
    (`CTLModel.from_model`)."""
    if isinstance(model, cls):
        return model
    if not isinstance(model, keras.Model):
        raise TypeError(
            "Expected `model` to be a `keras.Model`. "
            f"Received: model={model!r} of type {type(model).__name__}."
        )
    if type(model) is _keras.Functional:
        model.__class__ = functional_variant(cls)
    else:
        model.__class__ = converted_class(type(model), cls)
    # Steps traced for the old class would skip the exact ones.
    model.train_function = model.test_function = None
    model.predict_function = None
    return model


def converted_class(original, target):
    """`original` with `target` mixed in, saved so that it loads converted."""
    mixed = _mixed_class(original, target, named_after=original)

    def get_config(self):
        config = super(mixed, self).get_config()
        config[_ORIGINAL_CLASS] = _class_name(original)
        config[_TARGET_CLASS] = _class_name(target)
        return config

    if "get_config" not in vars(mixed):
        mixed.get_config = get_config
        _keras.register_under_name(mixed, keras.saving.get_registered_name(Converted))
    return mixed


def functional_variant(cls):
    """`cls` with `Functional` mixed in, saved and loaded as `cls`."""
    return _mixed_class(cls, _keras.Functional, named_after=cls)


_MIXED_CLASSES: dict[tuple[type, type], type] = {}


def _mixed_class(first, second, named_after):
    """A class with bases `(first, second)` that Keras saves as `named_after`.

    Saved files name `named_after`, whose class rebuilds the model on load:
    the mixed class is registered under its name. Pickled (what `copy`,
    multiprocessing, Ray and joblib use), it is saved the same way and
    loaded by a function pickle can find by name: the mixed class itself
    has no importable name.
    """
    key = (first, second)
    if key not in _MIXED_CLASSES:
        mixed = type(
            named_after.__name__,
            (first, second),
            {
                "__module__": named_after.__module__,
                "__qualname__": named_after.__qualname__,
                "__reduce__": _keras.reduce_as_saved_model,
            },
        )
        name = keras.saving.get_registered_name(named_after)
        _keras.register_under_name(mixed, name)
        _MIXED_CLASSES[key] = mixed
    return _MIXED_CLASSES[key]
