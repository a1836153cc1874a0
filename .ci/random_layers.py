"""The whole matrix of seeded random layers, longer than the suite allows:
every layer of `keras.layers` that takes a `seed`, in a model of its own,
on 2 and 3 replicas with `random_draws="as_one_device"` against
`keras.Model` on one device, in float64 and float32, on static (48
examples) and dynamic (49) batches. One child process per replica count,
and one for each refusal that stops a running step; two at once. Prints
a table; exits 1 when a layer is neither one device's (float64 1e-9,
float32 1e-5) nor refused by name where the matrix says so.

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

REPLICAS = (2, 3)


def run(replicas, case=None, folder=None):
    out = os.path.join(folder, f"{replicas}{case or ''}.json")
    command = [sys.executable, "random_layers_child.py", str(replicas), out]
    command += [case] if case else []
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
    jobs = [(r, case) for r in REPLICAS for case in (None, *alone)]
    with tempfile.TemporaryDirectory() as folder:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            found = pool.map(lambda job: run(*job, folder=folder), jobs)
            runs = {job: rows for job, rows in zip(jobs, found)}
    failures = 0
    for (replicas, _), rows in runs.items():
        if "error" in rows:
            print(f"{replicas} replicas:", rows["error"])
            failures += 1
            continue
        print(f"\n{replicas} replicas: layer, dtype, examples, expected, found")
        for name, dtype, examples, expected, found, passed in rows:
            failures += not passed
            mark = "" if passed else "   FAILED"
            print(
                f"{name:24} {dtype:8} {examples:3} {expected[0]:12} "
                f"{cell(found):>9}{mark}"
            )
    print("failures:", failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
