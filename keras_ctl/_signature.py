"""Signatures `help()` and `inspect` show for keras_ctl's overrides.

An override that passes `*args, **kwargs` on to Keras (`fit`, `compile`,
`evaluate`, ...) would show only those. `keras_signature` gives it the
signature of the Keras method it extends, read from the installed Keras, so
it follows Keras's own arguments and defaults in every supported version.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any
from typing import TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])


def keras_signature(
    keras_method: Callable[..., Any], **keyword_only: tuple[Any, Any]
) -> Callable[[_F], _F]:
    """A decorator: the method's `__signature__` becomes `keras_method`'s,
    with the override's own return annotation and its keyword-only
    arguments `keyword_only` (`name=(annotation, default)`) added. Keras
    annotates none of its arguments: they show as `Any`."""

    def decorate(method: _F) -> _F:
        signature = inspect.signature(keras_method)
        parameters = [
            _any_if_bare(p)
            for p in signature.parameters.values()
            if p.kind != p.VAR_KEYWORD and p.name != "self"
        ]
        for name, (annotation, default) in keyword_only.items():
            parameters.append(
                inspect.Parameter(
                    name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=default,
                    annotation=annotation,
                )
            )
        parameters += [
            _any_if_bare(p)
            for p in signature.parameters.values()
            if p.kind == p.VAR_KEYWORD
        ]
        own = inspect.signature(method)
        method.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[own.parameters["self"], *parameters],
            return_annotation=own.return_annotation,
        )
        return method

    return decorate


def _any_if_bare(parameter: inspect.Parameter) -> inspect.Parameter:
    if parameter.annotation is inspect.Parameter.empty:
        return parameter.replace(annotation="Any")
    return parameter


def _model_constructor(
    inputs: Any = None, outputs: Any = None, *, name: str | None = None, **kwargs: Any
) -> None:
    """Keras's two ways to build a model: `CTLModel(inputs, outputs,
    name=...)`, or a subclass's `super().__init__(name=...)`."""


# What `help(CTLModel)` shows.
MODEL_CONSTRUCTOR = inspect.signature(_model_constructor)


class ConstructorSignature:
    """The signature `help(cls)` shows for the class it is set on; its
    subclasses, which may have constructors of their own, keep theirs."""

    def __init__(self, signature):
        self.signature = signature

    def __set_name__(self, owner, name):
        self.owner = owner

    def __get__(self, instance, owner):
        return self.signature if instance is None and owner is self.owner else None
