"""The cost of a TRW rho rule over a training set of many image sizes.

A fit asks for every image's rho at every evaluation, in turn. This
benchmark makes ``--images`` 4-connected grids of distinct sizes around
``--height`` x ``--width`` (like the 191 sizes of the 200 training horses),
then times two passes over them of ``loss_and_grad`` (univariate logistic,
K = 2, ``--iters`` TRW iterations, single thread) for each rule: the first
pass computes each grid's rho, the second is what every later evaluation of
a fit costs. Where the rules' cache holds the whole set, the second pass
costs the same for every rule; where it does not, each image pays its rho
again (``uniform_spanning_tree`` most).

    python benchmarks/bench_rho_cache.py [--images N] [--height H] [--width W] [--iters N] [--rules R,...]
"""

import argparse
import time

import _common  # noqa: F401 (sets up sys.path, single-threaded numba)

import numpy as np  # noqa: E402

from sklearn_margcrf import loss_and_grad  # noqa: E402
from sklearn_margcrf._graph import grid_edges  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--height", type=int, default=200)
    parser.add_argument("--width", type=int, default=270)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--rules", default="auto,uniform_spanning_tree,0.5",
                        help="comma-separated rho values to time (rule names or numbers)")
    args = parser.parse_args()
    rules = [rule if rule.isalpha() or "_" in rule else float(rule) for rule in args.rules.split(",")]

    rng = np.random.default_rng(0)
    problems = []
    for k in range(args.images):  # distinct sizes: heights and widths step through a band
        h, w = args.height - 20 + k % 40, args.width - 20 + k // 40 * 3
        edges = grid_edges(h, w)
        unary = rng.uniform(-1, 1, (h * w, 2))
        pairwise = rng.uniform(-1, 1, (len(edges), 2, 2))
        labels = rng.integers(0, 2, h * w)
        problems.append((edges, unary, pairwise, labels))
    pixels = sum(p[0].max() + 1 for p in problems)
    print(f"{args.images} grids of distinct sizes around {args.height} x {args.width} ({pixels / 1e6:.1f} M pixels), "
          f"univariate logistic, K = 2, {args.iters} TRW iterations, single thread")
    loss_and_grad(*problems[0], n_iter=args.iters)  # compile
    for rule in rules:
        seconds = []
        for _ in range(2):
            start = time.perf_counter()
            for edges, unary, pairwise, labels in problems:
                loss_and_grad(edges, unary, pairwise, labels, n_iter=args.iters, rho=rule)
            seconds.append(time.perf_counter() - start)
        print(f"rho={rule!s:<22} first pass {seconds[0] / args.images * 1e3:6.1f} ms per image, "
              f"second pass {seconds[1] / args.images * 1e3:6.1f} ms per image")


if __name__ == "__main__":
    main()
