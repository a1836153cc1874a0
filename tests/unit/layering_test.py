"""Imports run downward only: seam, ground floor, replaced behaviours,
typed outputs, engine, public modules, applications (ARCHITECTURE.md); no
module of the package imports itself back through others, at any depth,
within a layer too; the seam imports nothing of keras_ctl but itself, and
no module outside it names a private Keras or TensorFlow name."""

import ast
import pathlib

import keras_ctl

PACKAGE = pathlib.Path(keras_ctl.__file__).parent
LAYERS = [
    ("seam", ("_keras",)),
    (
        "ground",
        (
            "_replicas",
            "_example_dependence",
            "_lookups",
            "distribute",
            "_checks",
            "_compat",
            "_signature",
            "_own_code",
        ),
    ),
    ("replaced behaviours", ("_replaced",)),
    ("typed outputs", ("outputs",)),
    ("engine", ("_engine",)),
    ("public", ()),  # every other module of the package
    ("applications", ("cli", "demos")),
]
PUBLIC = [layer for layer, _ in LAYERS].index("public")
SEAM = PACKAGE / "_keras"


def layer_of(module):
    """The index in `LAYERS` of `keras_ctl.<module>`."""
    top = module.split(".")[0]
    for index, (_, names) in enumerate(LAYERS):
        if top in names:
            return index
    return PUBLIC


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


def test_the_seam_imports_nothing_of_keras_ctl_but_itself():
    """The seam is an adapter: what keras_ctl decides is handed to it
    (`_keras.behaviours`), never imported by it."""
    outside = [
        f"{path.name} -> {imported}"
        for path in sorted(SEAM.glob("*.py"))
        for imported in imports(path)
        if imported.split(".")[0] != "_keras"
    ]
    assert outside == []


# Private names of Keras and TensorFlow, as source text names them: their
# private packages, TensorFlow's internal namespace, and the op types its
# collectives run as (`_keras.ops`).
PRIVATE_TEXT = (
    "keras.src",
    "tensorflow.python",
    "tf.__internal__",
    "CollectiveGatherV2",
)
COLLECTIVE_OP_PREFIXES = ("Collective", "Nccl")


def test_no_private_keras_name_outside_the_seam():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if SEAM in path.parents:
            continue
        source = path.read_text()
        relative = path.relative_to(PACKAGE)
        found += [f"{relative}: {text}" for text in PRIVATE_TEXT if text in source]
        for node in ast.walk(ast.parse(source)):
            value = getattr(node, "value", None)
            if isinstance(node, ast.Constant) and isinstance(value, str):
                if value.startswith(COLLECTIVE_OP_PREFIXES):
                    found.append(f"{relative}:{node.lineno} {value!r}")
    assert found == []


def test_every_seam_module_is_at_most_250_lines():
    """The seam holds Keras's names and the wiring of replacements, not
    keras_ctl's logic: the next Keras release costs one module's reading."""
    long = {
        path.name: lines
        for path in SEAM.glob("*.py")
        if (lines := len(path.read_text().splitlines())) > 250
    }
    assert long == {}


def module_graph():
    """`{module: modules it imports}` over the package, a package's
    `__init__` named by the package (`_keras`), function-local imports
    included."""
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[module] = set(imported_names(path))
    known = set(graph)
    for module, edges in graph.items():
        graph[module] = {_resolve(e, known) for e in edges} - {None, module}
    return graph


def imported_names(path):
    """What `path` imports from the package, each as `module.name` (`from
    keras_ctl.a import b` gives `a.b`: module `a.b` if there is one, else
    a name of module `a`). Imports only a type checker runs (`if
    TYPE_CHECKING:`, for annotations) are left out: they never run."""
    for node in _run_time_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "keras_ctl" or node.module.startswith("keras_ctl."):
                prefix = node.module.removeprefix("keras_ctl").lstrip(".")
                for alias in node.names:
                    yield f"{prefix}.{alias.name}".lstrip(".")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("keras_ctl."):
                    yield alias.name.removeprefix("keras_ctl.")


def _run_time_nodes(tree):
    """The nodes of `tree` outside `if TYPE_CHECKING:` blocks."""
    for node in ast.iter_child_nodes(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and getattr(test, "id", None) == "TYPE_CHECKING":
            yield from (n for orelse in node.orelse for n in ast.walk(orelse))
            continue
        yield node
        yield from _run_time_nodes(node)


def _resolve(name, known):
    """The longest module of `known` that `name` is or lies in."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def cycles(graph):
    """Each set of modules that import one another (Tarjan's strongly
    connected components of more than one module)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while not component or node not in component:
                component.add(stack.pop())
            on_stack.difference_update(component)
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle():
    graph = module_graph()
    # The package's surface re-exports everything; nothing imports it back.
    graph.pop("", None)
    assert cycles(graph) == []


def test_every_module_has_its_test_file_written_down():
    """`tests/README.md` answers "where is this module tested?" with one
    test file a module, for every module of the package."""
    root = pathlib.Path(__file__).resolve().parents[2]
    readme = (root / "tests" / "README.md").read_text()
    rows = {}
    for line in readme.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].endswith(".py`"):
            rows[cells[0].strip("`")] = cells[1].strip("`")
    modules = {
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if "__pycache__" not in path.parts
    } | {"keras_ctl_cli.py", "keras_ctl_launch.py"}
    assert sorted(modules - rows.keys()) == []  # modules without a row
    assert sorted(rows.keys() - modules) == []  # rows of modules that are gone
    for module, test_file in rows.items():
        source = (root / test_file).read_text()
        assert test_file.endswith("_test.py") and "\ndef test_" in source, module


# Beside the package, so that `--help` and bad flags answer before
# TensorFlow starts (importing any module of the package imports it).
ENTRY_MODULES = ("keras_ctl_cli", "keras_ctl_launch")


def test_the_package_depends_on_no_module_beside_it():
    """Only `keras_ctl/launch.py`, the `python -m keras_ctl.launch` entry,
    names the launcher beside the package, and no module of the package
    imports that entry."""
    naming = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            if any(name.split(".")[0] in ENTRY_MODULES for name in names):
                naming.add(str(path.relative_to(PACKAGE)))
    assert naming == {"launch.py"}
    graph = module_graph()
    assert sorted(module for module, edges in graph.items() if "launch" in edges) == []
