"""What a first call costs: numba compiling the kernels, before any cache.

A new machine (a fresh install, a CI run, each new Dask worker host) pays
this once: numba keeps what it compiles (``cache=True``), so later processes
load it instead. Each case runs in a process of its own with
``NUMBA_CACHE_DIR`` set to an empty temporary folder, so nothing is loaded
from an earlier run; it prints the wall seconds of the first call (compiling
included) and of a second one (compiled code only), on a small problem, so
that the first figure is nearly all compiling. ``--root`` imports the
package from another checkout, to compare two versions::

    git worktree add /tmp/old <commit>
    python benchmarks/bench_compile.py --root /tmp/old
    python benchmarks/bench_compile.py

Run it on an otherwise idle machine, one at a time.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

# name: (inference, K, dtype, what), on a 30 x 40 grid
CASES = {
    "trw-2-float64": ("trw", 2, "float64", "gradient"),
    "trw-2-float32": ("trw", 2, "float32", "gradient"),
    "trw-8-float64": ("trw", 8, "float64", "gradient"),
    "mean_field-2-float64": ("mean_field", 2, "float64", "gradient"),
    "fit-trw-2-float64": ("trw", 2, "float64", "fit"),
}


def run_case(name):
    """In the child: time a first and a second call of the case."""
    import numpy as np

    from sklearn_margcrf import MarginalCRF, grid_edges, loss_and_grad

    inference, K, dtype, what = CASES[name]
    height, width = 30, 40
    edges = grid_edges(height, width)
    rng = np.random.default_rng(0)
    if what == "gradient":
        unary = rng.uniform(-1, 1, size=(height * width, K)).astype(dtype)
        pairwise = rng.uniform(-1, 1, size=(len(edges), K, K)).astype(dtype)
        labels = rng.integers(0, K, size=height * width)

        def call():
            loss_and_grad(edges, unary, pairwise, labels, inference=inference, n_iter=20)
    else:
        # a small fit: two images, two node features and one edge feature
        X = [(rng.normal(size=(height * width, 2)), edges, np.ones((len(edges), 1))) for _ in range(2)]
        y = [rng.integers(0, K, size=height * width) for _ in range(2)]

        def call():
            MarginalCRF(inference=inference, n_iter=20, max_iter=3, dtype=np.dtype(dtype).type).fit(X, y)

    times = []
    for _ in range(2):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    print(json.dumps({"case": name, "first": times[0], "second": times[1]}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--case", help=argparse.SUPPRESS)  # in the child process
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    if args.case:
        sys.path.insert(0, root)
        run_case(args.case)
        return
    print(f"package: {root}; first call (compiling) and second call, wall seconds")
    for name in args.cases:
        with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
            env = dict(os.environ, NUMBA_CACHE_DIR=cache)
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--root", root, "--case", name],
                                 env=env, capture_output=True, text=True, check=True).stdout
        record = json.loads(out.strip().splitlines()[-1])
        print(f"{name:22s} first {record['first']:7.1f} s   second {record['second']:6.3f} s")


if __name__ == "__main__":
    main()
