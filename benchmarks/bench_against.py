"""The benchmark problem of ``bench_gradients.py`` through public names only,
so that two checkouts of the package can be timed against each other.

200 x 300 4-connected grid, theta uniform in [-1, 1], rho = 0.5, 20
iterations, univariate logistic loss, truncated fitting, one thread. Prints
the minimum CPU seconds of ``--calls`` calls of ``loss_and_grad`` (after a
warm-up call). ``--root`` imports the package from another checkout, for
instance the code an issue was filed against::

    git worktree add /tmp/old 68aa947
    python benchmarks/bench_against.py --root /tmp/old --states 8
    python benchmarks/bench_against.py --states 8 --dtype float32

Alternate the two a few times on an idle machine and compare the figures
(or time whole processes in alternating pairs, with ``/usr/bin/time -v``).
"""

import argparse
import os
import sys
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--states", type=int, default=2)
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--inference", default="trw")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.root))

    import numpy as np

    import sklearn_margcrf
    from sklearn_margcrf import grid_edges, loss_and_grad

    height, width, K = 200, 300, args.states
    edges = grid_edges(height, width)
    rng = np.random.default_rng(0)
    unary = rng.uniform(-1, 1, size=(height * width, K)).astype(args.dtype)
    pairwise = rng.uniform(-1, 1, size=(len(edges), K, K)).astype(args.dtype)
    labels = rng.integers(0, K, size=height * width)
    options = dict(inference=args.inference, n_iter=20, rho=np.full(len(edges), 0.5))
    if args.inference != "trw":
        del options["rho"]

    loss_and_grad(edges, unary, pairwise, labels, **options)
    times = []
    for _ in range(args.calls):
        start = time.process_time()
        loss_and_grad(edges, unary, pairwise, labels, **options)
        times.append(time.process_time() - start)
    print(f"{os.path.dirname(sklearn_margcrf.__file__)} K={K} {args.dtype} {args.inference}: "
          f"min {min(times):.3f} s, median {sorted(times)[len(times) // 2]:.3f} s of {args.calls} calls")


if __name__ == "__main__":
    main()
