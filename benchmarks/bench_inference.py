"""Inference speed: TRW (and mean field) on a 200 x 300 4-connected grid.

Random theta uniform in [-1, 1], rho = 0.5, single thread, K = 2 and K = 8.
Prints the best of several timed runs (after a warm-up call that compiles the
kernels). The machine is shared (other processes compete for its 2 cores), so
both the minimum wall time and the minimum CPU time (time.process_time) are
shown; the CPU time is the steadier figure. A TRW "message" is one update of
one message m_e(x_v) (2E per iteration).

    python benchmarks/bench_inference.py [--repeat R] [--iters N]
"""

from _common import best_time, grid_arguments, random_grid_model  # noqa: E402 (sets up sys.path)

import numpy as np  # noqa: E402

from sklearn_margcrf.mean_field import mean_field_forward  # noqa: E402
from sklearn_margcrf.trw import trw_forward  # noqa: E402


def main():
    args = grid_arguments(__doc__)

    n = args.height * args.width
    E = args.height * (args.width - 1) + (args.height - 1) * args.width
    rho = np.full(E, 0.5)
    n_msgs = 2 * E * args.iters
    print(f"grid {args.height}x{args.width}: n={n} nodes, E={E} edges, {args.iters} iterations, "
          f"rho=0.5, best of {args.repeat} runs (shared machine: minimum wall / CPU time)")
    for K in (2, 8):
        edges, unary, pairwise, rng = random_grid_model(args.height, args.width, K)
        wall, cpu = best_time(lambda: trw_forward(edges, unary, pairwise, rho, n_iter=args.iters), args.repeat)
        print(f"K={K}: TRW {args.iters} iters: {wall:.4f} s wall / {cpu:.4f} s CPU   "
              f"({n_msgs / cpu / 1e6:.1f} M messages/s, {cpu / n_msgs * 1e9:.1f} ns/message, by CPU time; "
              f"includes setup and marginals)")
        wall, cpu = best_time(lambda: mean_field_forward(edges, unary, pairwise, n_iter=args.iters), args.repeat)
        print(f"K={K}: mean field {args.iters} iters: {wall:.4f} s wall / {cpu:.4f} s CPU")


if __name__ == "__main__":
    main()
