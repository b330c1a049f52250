"""Inference speed: TRW (and mean field) on a 200 x 300 4-connected grid.

Random theta uniform in [-1, 1], rho = 0.5, single thread, K = 2 and K = 8.
Prints the best of several timed runs (after a warm-up call that compiles the
kernels). The machine is shared (other processes compete for its 2 cores), so
both the minimum wall time and the minimum CPU time (time.process_time) are
shown; the CPU time is the steadier figure. A TRW "message" is one update of
one message m_e(x_v) (2E per iteration).

    python benchmarks/bench_inference.py [--repeat R] [--iters N]
"""

import argparse
import os
import sys
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

from sklearn_margcrf._graph import grid_edges  # noqa: E402
from sklearn_margcrf.trw import trw_forward  # noqa: E402


def best_time(fn, repeat):
    fn()  # warm-up (compilation)
    wall, cpu = [], []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return min(wall), min(cpu)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--height", type=int, default=200)
    parser.add_argument("--width", type=int, default=300)
    args = parser.parse_args()

    try:
        from sklearn_margcrf.mean_field import mean_field_forward
    except Exception as exc:  # written concurrently by another engineer
        mean_field_forward = None
        mf_note = f"skipped (sklearn_margcrf.mean_field does not import: {type(exc).__name__}: {exc})"

    edges = grid_edges(args.height, args.width)
    n, E = args.height * args.width, edges.shape[0]
    rho = np.full(E, 0.5)
    n_msgs = 2 * E * args.iters
    print(f"grid {args.height}x{args.width}: n={n} nodes, E={E} edges, {args.iters} iterations, "
          f"rho=0.5, best of {args.repeat} runs (shared machine: minimum wall / CPU time)")
    for K in (2, 8):
        rng = np.random.default_rng(0)
        unary = rng.uniform(-1, 1, size=(n, K))
        pairwise = rng.uniform(-1, 1, size=(E, K, K))
        wall, cpu = best_time(lambda: trw_forward(edges, unary, pairwise, rho, n_iter=args.iters), args.repeat)
        print(f"K={K}: TRW {args.iters} iters: {wall:.4f} s wall / {cpu:.4f} s CPU   "
              f"({n_msgs / cpu / 1e6:.1f} M messages/s, {cpu / n_msgs * 1e9:.1f} ns/message, by CPU time; "
              f"includes setup and marginals)")
        if mean_field_forward is not None:
            try:
                wall, cpu = best_time(lambda: mean_field_forward(edges, unary, pairwise, n_iter=args.iters),
                                      args.repeat)
                print(f"K={K}: mean field {args.iters} iters: {wall:.4f} s wall / {cpu:.4f} s CPU")
            except Exception as exc:
                print(f"K={K}: mean field: failed ({type(exc).__name__}: {exc})")
        else:
            print(f"K={K}: mean field: {mf_note}")


if __name__ == "__main__":
    main()
