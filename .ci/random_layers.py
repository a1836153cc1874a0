"""The whole matrix of seeded random layers, longer than the suite allows:
every layer of `keras.layers` that takes a `seed`, in a model of its own,
drawing one device's numbers (the default) against `keras.Model` on one
device, in float64 and float32, on static (48 examples) and dynamic (49)
batches: on 2 and 3 replicas and on 2 workers (`keras-ctl launch`) in the
default training step, and on 2 replicas in the keras.io guide's step of
one's own. One child process (or job) per column, and one for each
refusal that stops a running step (on replicas; on workers those are
left out: such a step aborts the job); two at once. Prints a table;
exits 1 when a layer is neither one device's (float64 1e-9, float32
1e-5) nor refused by name where the matrix says so.

Usage: .venv/bin/python .ci/random_layers.py
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
import random_layers  # noqa: E402

# (where, step): N replicas or 2 "workers", the default or "own" step.
COLUMNS = ((2, "default"), (3, "default"), ("workers", "default"), (2, "own"))


def run(where, step, case=None, folder=None):
    out = os.path.join(folder, f"{where}{step}{case or ''}.json")
    command = [sys.executable, "random_layers_child.py", str(where), out]
    command += [case] if case else []
    command += ["--own-step"] if step == "own" else []
    if where == "workers":
        command = children.launched(2, command, timeout=3500)
    return children.json_written(command, out, timeout=3600)


def cell(found):
    if found is None:
        return "-"
    if isinstance(found, float):
        return f"{found:.1e}"
    return "refused"


def main():
    alone = [
        f"{name}:{examples}" for name, examples in random_layers.REFUSED_AS_IT_RUNS
    ]
    jobs = [
        (where, step, case)
        for where, step in COLUMNS
        for case in (None, *([] if where == "workers" else alone))
    ]
    with tempfile.TemporaryDirectory() as folder:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            found = pool.map(lambda job: run(*job, folder=folder), jobs)
            runs = {job: rows for job, rows in zip(jobs, found)}
    failures = 0
    for (where, step, _), rows in runs.items():
        label = "2 workers" if where == "workers" else f"{where} replicas"
        column = f"{label}, {step} step"
        if "error" in rows:
            print(f"{column}:", rows["error"])
            failures += 1
            continue
        print(f"\n{column}: layer, dtype, examples, expected, found")
        for name, dtype, examples, expected, found, passed in rows:
            failures += not passed
            mark = "" if passed else "   FAILED"
            print(
                f"{name:24} {dtype:8} {examples:3} {expected[0]:12} "
                f"{cell(found):>9}{mark}"
            )
    print("cases:", sum(len(rows) for rows in runs.values() if "error" not in rows))
    for dtype, largest in _largest_exact(runs).items():
        print(f"largest difference of an exact case, {dtype}: {largest:.1e}")
    print("failures:", failures)
    return 1 if failures else 0


def _largest_exact(runs):
    """`{dtype: the largest difference}` of the cases expected exact."""
    largest = {}
    for rows in runs.values():
        for _, dtype, _, expected, found, _ in rows if "error" not in rows else []:
            if expected[0] == "exact" and isinstance(found, float):
                largest[dtype] = max(largest.get(dtype, 0.0), found)
    return largest


if __name__ == "__main__":
    sys.exit(main())
