"""The code of the documentation pages, as the tests run it.

Every fenced block of a page under `docs/` runs, so none goes stale:

- a `python` block whose first line is a file name comment (`# train.py`)
  is written to that file;
- the other `python` blocks of a page run in order, as one script, like the
  cells of a notebook;
- then the page's `bash` blocks run in order, with this interpreter's
  folder first on `PATH` (`python`, `keras-ctl`), after the script.

Everything runs in a fresh folder, as from the repository's root:
`examples/` and `benchmarks/` are linked into it. Blocks fenced as
`console` (installs, the benchmark, cluster settings) and `json` are shown,
not run.
"""

import os
import pathlib
import re

import children

DOCS = pathlib.Path(children.ROOT) / "docs"
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
FILE_NAME = re.compile(r"# ([\w./-]+\.py)\n")


def pages():
    """Every page with code that runs, relative to `docs/`."""
    return sorted(
        str(page.relative_to(DOCS))
        for page in DOCS.rglob("*.md")
        if any(language in ("python", "bash") for language, _ in blocks(page))
    )


def blocks(page):
    """`(language, code)` of each fenced block of `page`, in order."""
    return FENCE.findall(pathlib.Path(page).read_text())


def run_page(page, folder, *, timeout):
    """Runs the code of `docs/<page>` in `folder`; returns what it printed.

    Raises:
        AssertionError: naming the block that failed, with its output.
    """
    folder = pathlib.Path(folder)
    for shared in ("examples", "benchmarks"):
        (folder / shared).symlink_to(pathlib.Path(children.ROOT) / shared)
    script, commands = [], []
    for language, code in blocks(DOCS / page):
        name = FILE_NAME.match(code)
        if language == "python" and name:
            (folder / name.group(1)).write_text(code)
        elif language == "python":
            script.append(code)
        elif language == "bash":
            commands.append(code)
    printed = []
    if script:
        (folder / "page.py").write_text("\n".join(script))
        printed.append(_run([children.PYTHON, "page.py"], folder, page, timeout))
    for command in commands:
        printed.append(
            _run(["bash", "-euo", "pipefail", "-c", command], folder, page, timeout)
        )
    return "\n".join(printed)


def _run(command, folder, page, timeout):
    path = os.path.dirname(children.PYTHON) + os.pathsep + os.environ["PATH"]
    env = dict(os.environ, PATH=path, PYTHONPATH=str(folder))
    result = children.run(command, timeout=timeout, env=env, cwd=folder)
    assert result.returncode == 0, (
        f"docs/{page}: {command[-1]} failed:\n{children.output(result)}"
    )
    return result.stdout
