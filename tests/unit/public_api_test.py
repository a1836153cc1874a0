"""The public API is typed and documented: every function, class and method
reachable from `keras_ctl.__all__` (and the keras-tuner hook) has a type on
each argument and on its return, and a signature that names its arguments;
every function and class has a docstring with an example."""

import inspect
import pathlib

from public_api import public_objects
from public_api import user_methods

import keras_ctl


def callables():
    """`(qualified name, function)` of each public function and method, the
    classes' constructors included."""
    for name, obj in public_objects():
        if not inspect.isclass(obj):
            yield name, obj
            continue
        yield name, obj  # its constructor
        for member, value in vars(obj).items():
            value = getattr(value, "__func__", value)  # class methods
            if inspect.isfunction(value) and not member.startswith("_"):
                yield f"{name}.{member}", value


def missing_types(name, function):
    signature = inspect.signature(function)
    missing = [
        f"{name}({p.name})"
        for p in signature.parameters.values()
        if p.name not in ("self", "cls") and p.annotation is p.empty
    ]
    constructor = inspect.isclass(function)
    if not constructor and signature.return_annotation is signature.empty:
        missing.append(f"{name} -> ?")
    return missing


def test_every_public_function_and_method_has_type_hints():
    found = list(callables())
    assert len(found) > 60
    missing = [m for name, f in found for m in missing_types(name, f)]
    assert missing == []


def test_no_public_signature_is_only_args_and_kwargs():
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    bare = []
    for name, function in callables():
        parameters = [
            p
            for p in inspect.signature(function).parameters.values()
            if p.name not in ("self", "cls")
        ]
        if parameters and all(p.kind in variadic for p in parameters):
            bare.append(name)
    assert bare == []


def test_fit_and_compile_show_kerass_arguments():
    fit = inspect.signature(keras_ctl.CTLModel.fit).parameters
    assert list(fit)[:5] == ["self", "x", "y", "batch_size", "epochs"]
    compile_ = inspect.signature(keras_ctl.CTLModel.compile).parameters
    assert compile_["optimizer"].default == "rmsprop"
    assert compile_["gradient_accumulation"].default == "micro_batches"
    assert list(inspect.signature(keras_ctl.CTLModel).parameters)[:2] == [
        "inputs",
        "outputs",
    ]
    # A subclass keeps its own constructor's signature.
    assert "discriminator" in inspect.signature(keras_ctl.GAN).parameters


def test_every_public_function_and_class_has_a_docstring_with_an_example():
    undocumented = [
        name
        for name, obj in public_objects()
        if "Example" not in (inspect.getdoc(obj) or "")
    ]
    assert undocumented == []


def test_the_package_says_it_is_typed():
    assert (pathlib.Path(keras_ctl.__file__).parent / "py.typed").is_file()


def test_what_a_user_calls_says_its_arguments_returns_and_an_example():
    # The functions, and the methods Keras does not document for a user
    # (`public_api.USER_METHODS`).
    calls = [(n, f) for n, f in public_objects() if not inspect.isclass(f)]
    calls += list(user_methods())
    incomplete = []
    for name, function in calls:
        doc = inspect.getdoc(function) or ""
        takes = [p for p in inspect.signature(function).parameters if p != "self"]
        sections = ["Returns:", "Example"] + (["Args:"] if takes else [])
        incomplete += [f"{name}: {s}" for s in sections if s not in doc]
    assert len(calls) > 30
    assert incomplete == []
