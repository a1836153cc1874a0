"""Measures the structure of the installed `keras_ctl` package.

Finds the package through `import keras_ctl`, so that
`PYTHONPATH=<checkout> python .ci/structure.py` measures that checkout. It
relies on no module name but `keras_ctl.CTLModel` and the `keras-ctl`
console command. Prints a report; `--json PATH` writes the numbers too.

Static numbers (read with `ast`):

1. `ctl_model`: the lines of `CTLModel` (`inspect.getsourcelines`), its
   methods (every def in the class body) and the lines of its module.
2. `largest_functions`: the 5 longest functions (from the first decorator to
   the end, nested defs included); `functions_over_60_lines` counts every
   def, nested ones too.
3. Private Keras/TensorFlow names outside the seam (`keras_ctl/_keras/`):
   (a) `private_imports`: imports of `keras.src...` or `tensorflow.python...`;
   (b) `private_reads`: reads `x._name` (one leading underscore) where `x` is
   not `self`, `cls` or `super()` and keras_ctl defines no `_name` (no def,
   class, assigned name or attribute assigned on `self`/`cls`), so it is
   Keras's or TensorFlow's; the namedtuple API (`_replace`, ...) and reads
   on stdlib modules (`sys._getframe`) are left out. `inherited_reads`:
   the same names read on `self`/`cls`/`super()`, which a class has from
   its Keras base class. (c) `engine_reads_of_model`: in modules whose name
   contains `engine`, reads `x._name` (`x` not `self`/`cls`) of a private
   name that `CTLModel` defines (in its class body, or as `self._name` in
   its module).
4. `import_cycles`: strongly connected components (Tarjan) of more than one
   module in the graph of every import run at any depth (not those under
   `if TYPE_CHECKING:`). `from keras_ctl import x` is an edge to
   `keras_ctl.x` when that is a module, else to the module `keras_ctl`
   re-exports `x` from; the imports of `keras_ctl/__init__.py` itself are
   no edges. Modules beside the package that it imports are nodes too.
5. `outside_modules`: top-level modules the package imports that stand
   beside it (not stdlib, not installed distributions); `third_party` lists
   the others.

Dynamic numbers (a child process per model, 2 logical CPUs,
`MirroredStrategy`; a profile hook on every thread during the first `fit`,
one batch, which traces the step):

6. `fit.<model>.modules_in_fit`: the package's modules entered during the
   first `fit`; `modules_in_step`: those entered while the model's
   `train_step` (its body, any class of the MRO) is on the stack, which runs
   in the replica threads; `keras_modules_in_step`: Keras's modules there,
   `keras_trainer_modules_in_step` those of them under `keras/src/trainers/`
   and `keras/src/backend/tensorflow/`.
   `calls_back_into_model`: calls from an engine module (name containing
   `engine`) to code in the file that defines `CTLModel`.
   `deepest_alternation`: the most switches between a keras_ctl frame and a
   Keras frame on one stack (other frames skipped) at a call inside the
   step; a replica thread's stack continues the main thread's stack at the
   moment the thread started. `retrace`: the counts after
   `model.train_function = None` and a second `fit`, which traces anew, and
   the modules of the first `fit` it does not enter.
   `keras`: the same for a plain `keras.Model`.
7. `import_times`: wall time of `python -c "import keras_ctl"` and of
   `keras-ctl --help` (the script beside `sys.executable`), interleaved,
   median and samples; `cli_entry` is the file the script's
   `from <module> import main` finds.
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib.util
import inspect
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

NAMEDTUPLE_API = {"_replace", "_fields", "_asdict", "_make", "_field_defaults"}
PRIVATE_PREFIXES = ("keras.src", "tensorflow.python")
KERAS_TRAINER = ("keras.src.trainers.", "keras.src.backend.tensorflow.")


# Static numbers.


class Source:
    """One module of the package: its dotted name, file and syntax tree."""

    def __init__(self, path, root):
        self.path = path
        parts = path.relative_to(root).with_suffix("").parts
        self.is_package = parts[-1] == "__init__"
        self.name = ".".join(parts[:-1] if self.is_package else parts)
        self.where = path.relative_to(root).as_posix()
        self.tree = ast.parse(path.read_text(), str(path))


def private(name):
    return name.startswith("_") and not name.startswith("__")


def is_self(node):
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and getattr(node.func, "id", "") == "super"


def walk_runtime(node):
    """`ast.walk`, skipping the bodies of `if TYPE_CHECKING:`."""
    todo = [node]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def ctl_model_numbers(sources, model_class):
    lines, _ = inspect.getsourcelines(model_class)
    path = pathlib.Path(inspect.getsourcefile(model_class))
    source = next(s for s in sources if s.path == path)
    body = next(
        node.body
        for node in ast.walk(source.tree)
        if isinstance(node, ast.ClassDef) and node.name == model_class.__name__
    )
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    methods = [node.name for node in body if isinstance(node, defs)]
    privates = {name for name in methods if private(name)}
    for node in body:
        for target in getattr(node, "targets", [getattr(node, "target", None)]):
            if isinstance(target, ast.Name) and private(target.id):
                privates.add(target.id)
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if is_self(node.value) and private(node.attr):
                privates.add(node.attr)
    numbers = {
        "file": source.where,
        "lines": len(lines),
        "methods": len(methods),
        "module_lines": len(path.read_text().splitlines()),
    }
    return numbers, privates


def functions(node, prefix=""):
    """`(qualified name, first line, last line)` of every def under `node`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + child.name
            first = min([child.lineno] + [d.lineno for d in child.decorator_list])
            yield name, first, child.end_lineno
            yield from functions(child, name + ".")
        elif isinstance(child, ast.ClassDef):
            yield from functions(child, prefix + child.name + ".")
        else:
            yield from functions(child, prefix)


def function_numbers(sources):
    found = [
        {"name": name, "file": s.where, "lines": last - first + 1}
        for s in sources
        for name, first, last in functions(s.tree)
    ]
    found.sort(key=lambda f: -f["lines"])
    return found[:5], sum(f["lines"] > 60 for f in found)


def defined_names(sources):
    """Every name keras_ctl defines: defs, classes, assigned names and
    attributes assigned on `self`/`cls`."""
    names = set()
    for source in sources:
        for node in ast.walk(source.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if is_self(node.value):
                    names.add(node.attr)
    return names


def stdlib_aliases(tree):
    """The names a module binds to stdlib modules (`import sys`)."""
    return {
        alias.asname or alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.split(".")[0] in sys.stdlib_module_names
    }


def private_uses(sources, model_privates):
    """Numbers 3(a), 3(b) and 3(c), each a list of `file:line  code`."""
    defined = defined_names(sources)
    uses = collections.defaultdict(list)
    for source in sources:
        in_seam = source.name.split(".")[:2] == ["keras_ctl", "_keras"]
        in_engine = "engine" in source.name
        stdlib = stdlib_aliases(source.tree)
        for node in ast.walk(source.tree):
            at = f"{source.where}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not in_seam:
                base = getattr(node, "module", None) or ""
                for alias in node.names:
                    full = f"{base}.{alias.name}" if base else alias.name
                    if full.startswith(PRIVATE_PREFIXES):
                        uses["private_imports"].append(f"{at}  {ast.unparse(node)}")
            if not (isinstance(node, ast.Attribute) and private(node.attr)):
                continue
            if not isinstance(node.ctx, ast.Load):
                continue
            line = f"{at}  {ast.unparse(node)[:70]}"
            if in_engine and node.attr in model_privates and not is_self(node.value):
                uses["engine_reads_of_model"].append(line)
            if in_seam or node.attr in defined or node.attr in NAMEDTUPLE_API:
                continue
            if is_self(node.value):
                uses["inherited_reads"].append(line)
            elif getattr(node.value, "id", None) not in stdlib:
                uses["private_reads"].append(line)
    return uses


def resolve_from(source, node):
    """The absolute module of `from <module> import ...`."""
    if not node.level:
        return node.module
    parts = source.name.split(".")
    if not source.is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def imported_modules(source, modules, reexports):
    """`(module, line)` of every module `source` imports when it runs."""
    for node in walk_runtime(source.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = resolve_from(source, node)
            for alias in node.names:
                named = f"{base}.{alias.name}"
                if named in modules:
                    yield named, node.lineno
                else:
                    yield reexports.get(named, base), node.lineno


def import_graph(sources, package, root):
    """`{module: {imported module: line}}` of the package's modules, the
    modules beside it it imports, and the top-level modules it imports."""
    modules = {s.name for s in sources}
    init = next(s for s in sources if s.name == package)
    reexports = {
        f"{package}.{alias.asname or alias.name}": resolve_from(init, node)
        for node in ast.walk(init.tree)
        if isinstance(node, ast.ImportFrom) and node.col_offset == 0
        for alias in node.names
    }
    graph, outside, todo = {}, collections.defaultdict(set), list(sources)
    while todo:
        source = todo.pop()
        edges = graph.setdefault(source.name, {})
        if source.name == package:
            continue
        for module, line in imported_modules(source, modules, reexports):
            top = module.split(".")[0]
            if module in modules:
                edges.setdefault(module, line)
            elif top != package:
                outside[top].add(f"{source.where}:{line}")
                beside = root / f"{top}.py"
                if beside.exists() and top not in modules:
                    modules.add(top)
                    todo.append(Source(beside, root))
                if top in modules:
                    edges.setdefault(top, line)
    return graph, outside


def strongly_connected(graph):
    """Tarjan's components of more than one node, each sorted: the layering
    test's (`tests/unit/layering_test.py`), which fails on any."""
    path = pathlib.Path(__file__).resolve().parents[1] / "tests/unit/layering_test.py"
    spec = importlib.util.spec_from_file_location("layering_test", path)
    layering = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layering)
    return layering.cycles(graph)


def static_numbers(package_module, model_class):
    package_dir = pathlib.Path(package_module.__file__).parent
    root = package_dir.parent
    sources = [Source(p, root) for p in sorted(package_dir.rglob("*.py"))]
    model, model_privates = ctl_model_numbers(sources, model_class)
    largest, over_60 = function_numbers(sources)
    uses = private_uses(sources, model_privates)
    graph, outside = import_graph(sources, package_module.__name__, root)
    cycles = [
        {
            "modules": component,
            "edges": [
                f"{a} -> {b} (line {line})"
                for a in component
                for b, line in graph[a].items()
                if b in component
            ],
        }
        for component in strongly_connected(graph)
    ]
    installed = {
        name
        for name in outside
        if name in sys.stdlib_module_names or not (root / f"{name}.py").exists()
    }
    return {
        "modules_in_package": len(sources),
        "ctl_model": model,
        "largest_functions": largest,
        "functions_over_60_lines": over_60,
        "private_imports": uses["private_imports"],
        "private_reads": uses["private_reads"],
        "inherited_reads": uses["inherited_reads"],
        "engine_reads_of_model": uses["engine_reads_of_model"],
        "import_cycles": cycles,
        "outside_modules": {
            name: sorted(outside[name]) for name in sorted(set(outside) - installed)
        },
        "third_party": sorted(installed - set(sys.stdlib_module_names)),
    }


# Dynamic numbers: the child process's side.


class Recorder:
    """A profile hook for every thread: the modules each call enters, with a
    shadow stack per thread of `(module, last kind, switches, in step)`."""

    def __init__(self, roots, model_file, step_codes):
        self.roots = roots  # {kind: directory}, keras_ctl's first
        self.model_file = model_file
        self.step_codes = step_codes
        self.files = {}
        self.stacks = {}
        self.main = threading.get_ident()
        self.entered = collections.defaultdict(set)
        self.back_calls = collections.Counter()
        self.deepest = (0, [])

    def where(self, filename):
        """`(kind, module)` of a file: kind is a key of `roots`, or None."""
        if filename not in self.files:
            self.files[filename] = (None, None)
            for kind, directory in self.roots.items():
                if filename.startswith(directory + os.sep):
                    parts = filename[len(directory) + 1 : -3].split(os.sep)
                    if parts[-1] == "__init__":
                        parts.pop()
                    self.files[filename] = (kind, ".".join([kind] + parts))
                    break
        return self.files[filename]

    def __call__(self, frame, event, arg):
        if event == "call":
            self.call(frame)
        elif event == "return":
            stack = self.stacks.get(threading.get_ident())
            if stack:
                stack.pop()

    def call(self, frame):
        ident = threading.get_ident()
        stack = self.stacks.get(ident)
        if stack is None:  # a new thread continues the main thread's stack
            stack = self.stacks[ident] = list(self.stacks.get(self.main, ()))
        code = frame.f_code
        kind, module = self.where(code.co_filename)
        _, last, switches, in_step = stack[-1] if stack else (None, None, 0, False)
        in_step = in_step or code in self.step_codes
        if kind:
            switches += last is not None and last != kind
            last = kind
            self.entered[kind, "fit"].add(module)
            if in_step:
                self.entered[kind, "step"].add(module)
        stack.append((module if kind else None, last, switches, in_step))
        if in_step and switches > self.deepest[0]:
            self.deepest = (switches, [entry[0] for entry in stack if entry[0]])
        if code.co_filename == self.model_file and frame.f_back:
            caller = self.where(frame.f_back.f_code.co_filename)[1] or ""
            if "engine" in caller:
                name = getattr(code, "co_qualname", code.co_name)  # Python 3.11+
                self.back_calls[name, in_step] += 1

    def numbers(self):
        runs = []  # the deepest stack, consecutive frames of a module as one
        for module in self.deepest[1]:
            if not runs or runs[-1] != module:
                runs.append(module)
        calls = self.back_calls
        return {
            "modules_in_fit": sorted(self.entered["keras_ctl", "fit"]),
            "modules_in_step": sorted(self.entered["keras_ctl", "step"]),
            "keras_modules_in_step": sorted(self.entered["keras", "step"]),
            "keras_trainer_modules_in_step": sorted(
                module
                for module in self.entered["keras", "step"]
                if module.startswith(KERAS_TRAINER)
            ),
            "calls_back_into_model": {
                "names": sorted({name for name, _ in calls}),
                "calls": sum(calls.values()),
                "calls_in_step": sum(n for (_, step), n in calls.items() if step),
            },
            "deepest_alternation": {"switches": self.deepest[0], "stack": runs},
        }


def profiled(model, fit, model_class):
    import keras

    import keras_ctl

    step_codes = set()
    for klass in type(model).__mro__:
        if callable(klass.__dict__.get("train_step")):
            step_codes.add(inspect.unwrap(klass.__dict__["train_step"]).__code__)
    roots = {
        "keras_ctl": os.path.dirname(keras_ctl.__file__),
        "keras": os.path.dirname(keras.__file__),
    }
    recorder = Recorder(roots, inspect.getsourcefile(model_class), step_codes)
    threading.setprofile(recorder)
    sys.setprofile(recorder)
    try:
        fit()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return recorder.numbers()


def fit_child(kind, out):
    """Runs in the child: the numbers of 6 for `keras.Model` or `CTLModel`."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )
    import keras
    import numpy as np

    import keras_ctl

    model_class = keras_ctl.CTLModel if kind == "ctl" else keras.Model
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        inputs = keras.Input((4,))
        regularizer = keras.regularizers.L2(1e-3)
        hidden = keras.layers.Dense(8, "relu", kernel_regularizer=regularizer)
        model = model_class(inputs, keras.layers.Dense(1)(hidden(inputs)))
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    x, y = np.random.default_rng(0).random((2, 16, 4), dtype="float32")
    y = y[:, :1]

    def fit():
        model.fit(x, y, batch_size=8, epochs=1, steps_per_epoch=1, verbose=0)

    start = time.perf_counter()
    numbers = profiled(model, fit, model_class)
    numbers["seconds"] = round(time.perf_counter() - start, 1)
    model.train_function = None
    again = profiled(model, fit, model_class)
    numbers["retrace"] = {
        key: len(value) if isinstance(value, list) else value
        for key, value in again.items()
        if key != "deepest_alternation"
    }
    numbers["retrace"]["not_entered_again"] = sorted(
        set(numbers["modules_in_fit"]) - set(again["modules_in_fit"])
    )
    numbers["package"] = keras_ctl.__file__
    pathlib.Path(out).write_text(json.dumps(numbers))


# Dynamic numbers: the parent's side.


def traceback_of(stderr):
    """The last traceback of a child's stderr, or its last lines."""
    start = stderr.rfind("Traceback")
    return stderr[start:] if start >= 0 else stderr[-1000:]


def run_fit_child(kind, cwd):
    out = pathlib.Path(cwd) / f"{kind}.json"
    command = [sys.executable, __file__, "--fit-child", kind, str(out)]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode:
        return {"error": traceback_of(result.stderr)}
    return json.loads(out.read_text())


def import_times(repeats, cwd):
    script = pathlib.Path(sys.executable).with_name("keras-ctl")
    commands = {"import keras_ctl": [sys.executable, "-c", "import keras_ctl"]}
    if script.exists():
        commands["keras-ctl --help"] = [str(script), "--help"]
    times = {name: {"samples": [], "failures": 0} for name in commands}
    if script.exists():
        entry = re.search(r"from (\S+) import main", script.read_text())
        spec = entry and importlib.util.find_spec(entry.group(1))
        times["keras-ctl --help"]["cli_entry"] = spec and spec.origin
    for _ in range(repeats):
        for name, command in commands.items():
            start = time.perf_counter()
            result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
            times[name]["samples"].append(round(time.perf_counter() - start, 2))
            if result.returncode:
                times[name]["failures"] += 1
                times[name]["error"] = traceback_of(result.stderr)
    for timing in times.values():
        timing["median"] = round(statistics.median(timing["samples"]), 2)
    return times


# The report.


def show(label, value, indent="  "):
    """Prints `value` under `label`: one line a number, lists indented."""
    if isinstance(value, dict):
        print(f"{label}:")
        for key, item in value.items():
            show(indent + str(key), item, indent + "  ")
    elif isinstance(value, list):
        print(f"{label}: {len(value)}")
        for item in value:
            if isinstance(item, dict) and isinstance(item.get("edges"), list):
                show(indent + "-", item, indent + "  ")
            elif isinstance(item, dict):
                print(indent + "  " + "  ".join(str(v) for v in item.values()))
            else:
                print(f"{indent}  {item}")
    else:
        print(f"{label}: {value}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument("--repeats", type=int, default=7, help="import timings")
    parser.add_argument("--fit-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fit_child:
        return fit_child(*args.fit_child)
    start = time.perf_counter()
    import keras
    import tensorflow as tf

    import keras_ctl

    report = {
        "package": keras_ctl.__file__,
        "versions": f"keras {keras.__version__}, tensorflow {tf.__version__}",
        **static_numbers(keras_ctl, keras_ctl.CTLModel),
    }
    with tempfile.TemporaryDirectory() as cwd:  # nothing of the cwd on sys.path
        report["fit"] = {kind: run_fit_child(kind, cwd) for kind in ("ctl", "keras")}
        report["import_times"] = import_times(args.repeats, cwd)
    report["seconds"] = round(time.perf_counter() - start, 1)
    for key, value in report.items():
        show(key, value)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
