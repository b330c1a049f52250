"""The surrogate likelihood's loss and gradient on one image, one thread.

The backgrounds' grid (48 x 64, K = 8 by default), random potentials, labels
with a tenth hidden (surrogate EM), truncated TRW: ``--calls`` calls of
``loss_and_grad(loss="surrogate_likelihood")`` after a warm-up call, and the
milliseconds per call (minimum and median over ``--repeat`` rounds). Its
cost beyond the univariate logistic loss's is the TRW entropy and its
gradient, twice (labels clamped and free).

    python benchmarks/bench_surrogate.py [--height H] [--width W] [--states K] [--iters N] [--calls C] [--repeat R]
"""

import argparse
import time

import _common  # noqa: F401 (sets up sys.path, single-threaded numba)

import numpy as np  # noqa: E402

from sklearn_margcrf import loss_and_grad  # noqa: E402
from sklearn_margcrf._graph import grid_edges  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--height", type=int, default=48)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--states", type=int, default=8)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    edges = grid_edges(args.height, args.width)
    n, K = args.height * args.width, args.states
    unary = rng.uniform(-1, 1, (n, K))
    pairwise = rng.uniform(-1, 1, (len(edges), K, K))
    labels = rng.integers(0, K, n)
    labels[rng.random(n) < 0.1] = -1

    def call():
        return loss_and_grad(edges, unary, pairwise, labels, loss="surrogate_likelihood", n_iter=args.iters)

    call()  # compile
    rounds = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        for _ in range(args.calls):
            call()
        rounds.append((time.perf_counter() - start) / args.calls * 1e3)
    print(f"surrogate likelihood, {args.height} x {args.width} grid, K = {K}, {args.iters} TRW iterations: "
          f"{min(rounds):.2f} ms per call (median {np.median(rounds):.2f}) over {args.repeat} rounds of {args.calls}")


if __name__ == "__main__":
    main()
