"""The examples of the public docstrings, as the tests run them.

Every public function and class, and every method a user calls
(`public_api.py`), shows an `Example` section. Its fenced blocks run, so
none goes stale, in the style of the documentation pages (`doc_pages.py`):

- a section whose first `python` block starts with a file name comment
  (`# train.py`) is a script: its `python` blocks are written to their
  files in a fresh folder, then its `bash` blocks run there in order (or
  `python train.py` when it has none), with this interpreter's folder
  first on `PATH`;
- the `python` blocks of any other section run in order as one snippet,
  in a fresh namespace and a fresh folder, after `SETUP`, which defines the
  names the snippets share (`x`, `y`, `inputs`, `outputs`, `model`, `gan`,
  ...). The snippets of a group share a process: those of `local` are
  split over two processes (`PROCESSES`), side by side; those of `workers`
  (`IN_GROUP`) run in two worker processes on 127.0.0.1 started by
  `keras-ctl launch`, on one shared folder. In each process the
  example of the group's strategy (`GROUPS`) runs first, on its own, and
  its `strategy` is the other snippets': a process makes one strategy,
  since two `MirroredStrategy` objects in one process collide on collective
  keys. Each other snippet starts from `keras.utils.clear_session()` and
  seed 0.

Run as a script, this module is one process of a group:

    python docstring_examples.py GROUP FOLDER NAME...

runs the snippets of the examples `NAME...` in `FOLDER/<name>/` and writes
after each what they did to `FOLDER/<group>_<task>.json`: `{name: {"ok",
"error", "printed", "seconds"}}`.
"""

import contextlib
import dataclasses
import inspect
import io
import json
import os
import pathlib
import re
import runpy
import sys
import time
import traceback

import children
import doc_pages

# The names the snippets share, made before each one with the `strategy`
# of its group.
SETUP = """\
import json
import os

import keras
import keras_tuner
import numpy as np
import tensorflow as tf

import keras_ctl

(x, y), (x_test, y_test) = keras_ctl.datasets.load("digits")  # 8x8, 10 classes
x, y = x[:512], y[:512]  # 8 batches of 64: enough to run, quickly
images = x  # real images, for a GAN
rng = np.random.default_rng(0)
queries = rng.normal(size=(37, 6)).astype("float32")  # retrieval pairs
candidates = rng.normal(size=(37, 4)).astype("float32")
with strategy.scope():
    inputs = keras.Input((8, 8, 1))
    outputs = keras.layers.Dense(10)(keras.layers.Flatten()(inputs))
    model = keras_ctl.CTLModel(inputs, outputs)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    d = keras.Sequential(
        [keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(1)]
    )
    g = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(64, activation="sigmoid"),
            keras.layers.Reshape((8, 8, 1)),
        ]
    )
    gan = keras_ctl.GAN(discriminator=d, generator=g, latent_dim=32, seed=0)
    gan.compile(d_optimizer="adam", g_optimizer="adam")
"""

# The example that makes each group's strategy.
GROUPS = {
    "local": "strategies.local_mirrored_strategy",
    "workers": "strategies.multi_worker_strategy",
}
WORKERS = 2  # processes of the `workers` group
# The `local` snippets run in two processes, side by side (one per core).
PROCESSES = {"local": 2}

# The snippets that run under several workers; the others run in `local`.
IN_GROUP = {
    "strategies.multi_worker_strategy": "workers",
    "strategies.is_chief": "workers",
    "strategies.worker_count": "workers",
    "strategies.task_index": "workers",
    "strategies.write_path": "workers",
}

FILE_NAME = doc_pages.FILE_NAME
EXAMPLE_HEADING = re.compile(r"^Example:?[ \t]*$", re.MULTILINE)
SECTION_HEADING = re.compile(r"^[A-Z]\w*( \w+)?:[ \t]*$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Example:
    """The `Example` section of the docstring of `name`."""

    name: str
    blocks: tuple  # `(language, code)` of each fenced block, in order

    @property
    def python(self):
        return [code for language, code in self.blocks if language == "python"]

    @property
    def is_script(self):
        return bool(self.python) and FILE_NAME.match(self.python[0]) is not None

    @property
    def group(self):
        """The group of a snippet; `None` for a script."""
        return None if self.is_script else IN_GROUP.get(self.name, "local")

    def shown(self):
        """The section's code, for a failure message."""
        return "\n".join(f"```{language}\n{code}```" for language, code in self.blocks)


def examples():
    """The `Example` of every public object and user method, in the order
    of `public_api.py`; an object with two names (`CTLHyperModel` is
    `tuning.CTLHyperModel`) under its first."""
    import public_api

    found, seen = [], set()
    for name, obj in (*public_api.public_objects(), *public_api.user_methods()):
        if id(obj) not in seen:
            seen.add(id(obj))
            found.append(Example(name, tuple(section_blocks(inspect.getdoc(obj)))))
    return found


def section_blocks(docstring):
    """`(language, code)` of each fenced block of the `Example` section of
    `docstring`, up to the next section heading."""
    heading = EXAMPLE_HEADING.search(docstring or "")
    if heading is None:
        return []
    section = docstring[heading.end() :]
    blocks, position = [], 0
    for match in doc_pages.FENCE.finditer(section):
        if SECTION_HEADING.search(section[position : match.start()]):
            break
        blocks.append((match.group(1), match.group(2)))
        position = match.end()
    return blocks


# One process of a group of snippets.


def snippet_source(example, group):
    """The file a snippet runs as: `SETUP`, then the snippet; the example
    of the group's strategy as it is."""
    code = "\n".join(example.python)
    if example.name == GROUPS[group]:
        return code
    return (
        f"# SETUP, with the strategy of the example of {GROUPS[group]}\n"
        f"{SETUP}\n# The example of {example.name}\n{code}"
    )


def run_snippets(group, folder, names):
    """Runs the snippets `names` of `group` in this process, the example of
    its strategy first, and reports each (see the module's docstring)."""
    import keras

    folder = pathlib.Path(folder).resolve()
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
    index = task.get("index", 0)
    report = folder / f"{group}_{index}.json"
    maker = GROUPS[group]
    by_name = {example.name: example for example in examples()}
    results, given = {}, {}
    for name in [maker, *(n for n in names if n != maker)]:
        here = folder / name
        here.mkdir(exist_ok=True)
        path = here / f"example_{index}.py"
        path.write_text(snippet_source(by_name[name], group))
        if name != maker:  # the maker's strategy comes before anything else
            keras.utils.clear_session()
            keras.utils.set_random_seed(0)
        printed, error = io.StringIO(), None
        start = time.perf_counter()
        os.chdir(here)
        try:
            if name != maker and not given:
                raise RuntimeError(f"No strategy: the example of {maker} failed.")
            with contextlib.redirect_stdout(printed):
                namespace = runpy.run_path(str(path), given, run_name="__main__")
            if name == maker:
                given = {"strategy": namespace["strategy"]}
        except BaseException:  # noqa: B036 - an example's SystemExit too
            error = traceback.format_exc()
        finally:
            os.chdir(folder)
        results[name] = {
            "ok": error is None,
            "error": error,
            "printed": printed.getvalue(),
            "seconds": round(time.perf_counter() - start, 2),
        }
        report.write_text(json.dumps(results, indent=1))
        print(f"{name}: {'ok' if error is None else 'FAILED'}", flush=True)
        if error and task:
            # The other workers may wait for this one in a collective: end
            # here, and the launcher stops them.
            sys.exit(1)


# The tests' side.


class Jobs:
    """Every process the examples need, started at once: one per group of
    snippets (two workers for `workers`), one per script."""

    def __init__(self, examples, folder, *, timeout):
        self.folder = pathlib.Path(folder)
        self.deadline = time.monotonic() + timeout
        self.started = {}  # job -> process
        self.finished = {}  # job -> CompletedProcess, or the AssertionError
        self.job_of = {}  # example -> job
        groups = {}
        for example in examples:
            if example.is_script:
                self.started[example.name] = self._start_script(example)
                self.job_of[example.name] = example.name
            else:
                groups.setdefault(example.group, []).append(example.name)
        for group, names in groups.items():
            parts = PROCESSES.get(group, 1)
            for part in range(parts):
                job = f"{group}_{part}"
                (self.folder / job).mkdir()
                command = [children.PYTHON, __file__, group, self.folder / job]
                command += names[part::parts]
                if group == "workers":
                    # `keras-ctl launch`: the launcher without TensorFlow.
                    launcher = [children.KERAS_CTL, "launch", "--workers", WORKERS]
                    command = [*launcher, "--timeout", timeout, "--", *command]
                self.started[job] = children.start(command)
                self.job_of.update((name, job) for name in names[part::parts])

    def _start_script(self, example):
        here = self.folder / example.name
        here.mkdir()
        for code in example.python:
            name = FILE_NAME.match(code)
            assert name, f"{example.name}: a block of a script has no file name."
            (here / name.group(1)).write_text(code)
        bash = [code for language, code in example.blocks if language == "bash"]
        script = "\n".join(bash) or f"python {FILE_NAME.match(example.python[0])[1]}"
        path = os.path.dirname(children.PYTHON) + os.pathsep + os.environ["PATH"]
        python_path = os.pathsep.join(
            filter(None, [str(here), os.getenv("PYTHONPATH")])
        )
        env = dict(os.environ, PATH=path, PYTHONPATH=python_path)
        return children.start(
            ["bash", "-euo", "pipefail", "-c", script], env=env, cwd=here
        )

    def result(self, job):
        """The finished process of `job`.

        Raises:
            AssertionError: when it ran past the deadline (then stopped).
        """
        if job not in self.finished:
            remaining = max(1.0, self.deadline - time.monotonic())
            try:
                self.finished[job] = children.finish(self.started[job], remaining)
            except AssertionError as error:
                self.finished[job] = error
        if isinstance(self.finished[job], AssertionError):
            raise self.finished[job]
        return self.finished[job]

    def check(self, example):
        """Raises an `AssertionError` naming `example`, with its code and the
        error, unless it ran (in every process of its group)."""
        job = self.job_of[example.name]
        try:
            result = self.result(job)
        except AssertionError as error:
            raise AssertionError(
                f"The example of {example.name} did not end in time.\n\n"
                f"{example.shown()}\n{error}"
            ) from None
        if example.is_script:
            assert result.returncode == 0, (
                f"The example of {example.name} failed: its script exited with "
                f"{result.returncode}.\n\n{example.shown()}\n{children.output(result)}"
            )
            return
        count = WORKERS if example.group == "workers" else 1
        failures = []
        for task in range(count):
            where = f"worker {task}" if count > 1 else "its process"
            report = self.folder / job / f"{example.group}_{task}.json"
            ran = json.loads(report.read_text()) if report.exists() else {}
            failures += _failure(example.name, ran, where, children.output(result))
        group = f"the group {example.group!r}, after the example of its strategy"
        if example.name == GROUPS[example.group]:
            group = f"first in the group {example.group!r}"
        assert not failures, (
            f"The example of {example.name} failed ({group}).\n\n"
            f"{example.shown()}\n" + "\n".join(failures)
        )

    def stop(self):
        """Stops every process still running."""
        for process in self.started.values():
            children.stop(process)


def _failure(name, ran, where, output):
    """What went wrong with the snippet `name` in one process: `[]`, or
    one message."""
    if name not in ran:
        return [f"{where} ended before running it:\n{output}"]
    if ran[name]["ok"]:
        return []
    names = list(ran)
    before = [n for n in names[: names.index(name)] if not ran[n]["ok"]]
    if before:
        where += f", after the failed examples of {', '.join(before)}"
    printed = ran[name]["printed"][-2000:]
    return [f"{where}:\n{ran[name]['error']}" + (printed and f"It printed:\n{printed}")]


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    run_snippets(sys.argv[1], sys.argv[2], sys.argv[3:])
