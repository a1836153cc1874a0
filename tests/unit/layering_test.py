"""Imports run downward only: ground floor, seam, typed outputs, engine,
public modules, applications (ARCHITECTURE.md)."""

import ast
import pathlib

import keras_ctl

PACKAGE = pathlib.Path(keras_ctl.__file__).parent
LAYERS = [
    (
        "ground",
        (
            "_replicas",
            "_topology",
            "_checks",
            "_preemption",
            "_compat",
            "_signature",
            "_own_code",
        ),
    ),
    ("seam", ("_keras",)),
    ("typed outputs", ("outputs",)),
    ("engine", ("_engine",)),
    ("public", ()),  # every other module of the package
    ("applications", ("cli", "demos")),
]


def layer_of(module):
    """The index in `LAYERS` of `keras_ctl.<module>`."""
    top = module.split(".")[0]
    for index, (_, names) in enumerate(LAYERS):
        if top in names:
            return index
    return 4


def imports(path):
    """Every `keras_ctl` module `path` imports, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "keras_ctl":
                found.update(alias.name for alias in node.names)
            elif node.module.startswith("keras_ctl."):
                found.add(node.module.removeprefix("keras_ctl."))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("keras_ctl."):
                    found.add(alias.name.removeprefix("keras_ctl."))
    return found


def test_no_import_runs_upward():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        if module == "__init__":  # the package's surface re-exports all
            continue
        for imported in imports(path):
            if layer_of(imported) > layer_of(module):
                upward.append(f"{module} -> {imported}")
    assert upward == []
