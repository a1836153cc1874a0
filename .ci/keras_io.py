"""The whole keras.io corpus, longer than the suite allows: every exact
example on 1, 2 and 3 replicas (a replica without examples in the last
batch on 2 and 3), in float64 (1e-9) and float32 (1e-5) against
keras.Model on one device, and every example as written on 2 and 3
replicas (or refused by name: `keras_io.REFUSED_AS_WRITTEN`). One child
process a run, two at once. Prints a table (largest relative difference,
or the problems found); exits 1 on any failure.

Usage: .venv/bin/python .ci/keras_io.py
"""

import concurrent.futures
import os
import sys
import tempfile

SUPPORT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"
)
sys.path.insert(0, SUPPORT)

import children  # noqa: E402
import keras_io  # noqa: E402

RUNS = [(1, False), (2, False), (3, False), (2, True), (3, True)]


def run(replicas, as_written, folder):
    out = os.path.join(folder, f"{replicas}{'w' if as_written else ''}.json")
    command = [sys.executable, "keras_io_child.py", str(replicas), out]
    command += ["--as-written"] if as_written else []
    return children.json_written(command, out, timeout=3600)


def main():
    with tempfile.TemporaryDirectory() as folder:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            found = dict(zip(RUNS, pool.map(lambda r: run(*r, folder), RUNS)))
    failures = 0
    print(
        f"{'example':26}"
        + "".join(f"{f'{r} {d}':>14}" for r in (1, 2, 3) for d in keras_io.TOLERANCE)
    )
    for name in keras_io.EXACT:
        cells = []
        for replicas in (1, 2, 3):
            for dtype in keras_io.TOLERANCE:
                value = found[(replicas, False)].get(dtype, {}).get(name)
                failures += value is None or value > keras_io.tolerance(name, dtype)
                cells.append(f"{value:>14.1e}" if value is not None else f"{'-':>14}")
        print(f"{name:26}" + "".join(cells))
    for replicas in (2, 3):
        problems = found[(replicas, True)]
        for name in (*keras_io.AS_WRITTEN, *keras_io.REFUSED_AS_WRITTEN):
            failures += name not in problems or bool(problems[name])
            found_problems = problems.get(name, "not run")
            print(f"as written, {replicas} replicas, {name}: {found_problems}")
    for run_, value in found.items():
        if "error" in value:
            print(run_, value["error"])
            failures += 1
    print("failures:", failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
