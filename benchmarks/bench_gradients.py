"""Gradient speed and memory: truncated TRW (20 iterations) + back TRW.

200 x 300 4-connected grid, theta uniform in [-1, 1], rho = 0.5, K = 2 and 8,
single thread, univariate logistic loss L = -sum_i log mu_i(label_i) with
random labels (dL/dmu_i(x) = -[x = label_i] / mu_i(x)).

Prints, for each K, the best of several runs (after a warm-up call that
compiles the kernels) of
  - the forward pass alone (trw_forward, n_iter=20),
  - forward with keep_stack=True plus trw_backward(mode="truncated"),
and the peak extra memory of forward(keep_stack) + backward: the tracemalloc
peak (every numpy allocation) plus the one array the backward kernel allocates
itself (the adjoint messages, 2E*K floats; numba's allocations are invisible
to tracemalloc), and the stack's own size.

The machine is shared (other processes compete for its 2 cores), so both the
minimum wall time and the minimum CPU time (time.process_time) are shown;
the CPU time is the steadier figure.

    python benchmarks/bench_gradients.py [--repeat R] [--iters N]
"""

import tracemalloc

from _common import best_time, grid_arguments, random_grid_model, truncated_logistic_gradient  # noqa: E402 (sets up sys.path)

import numpy as np  # noqa: E402

from sklearn_margcrf.trw import trw_forward  # noqa: E402


def main():
    args = grid_arguments(__doc__)

    n = args.height * args.width
    E = args.height * (args.width - 1) + (args.height - 1) * args.width
    rho = np.full(E, 0.5)
    N = args.iters
    print(f"grid {args.height}x{args.width}: n={n}, E={E}, truncated TRW with {N} iterations, rho=0.5, "
          f"univariate logistic loss; best of {args.repeat} runs (shared machine: minimum wall / CPU time)")
    for K in (2, 8):
        edges, unary, pairwise, rng = random_grid_model(args.height, args.width, K)
        labels = rng.integers(0, K, size=n)

        def forward_only():
            return trw_forward(edges, unary, pairwise, rho, n_iter=N)

        def forward_backward():
            return truncated_logistic_gradient(edges, unary, pairwise, rho, labels, N)[:3]

        wf, cf = best_time(forward_only, args.repeat)
        wb, cb = best_time(forward_backward, args.repeat)
        tracemalloc.start()
        tracemalloc.reset_peak()
        forward_backward()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        kernel_scratch = 2 * E * K * 8
        stack_bytes = N * 2 * E * K * 8
        print(f"K={K}: forward {wf:.4f} s wall / {cf:.4f} s CPU;  forward(keep_stack)+backward "
              f"{wb:.4f} s wall / {cb:.4f} s CPU;  peak extra memory {(peak + kernel_scratch) / 2**20:.1f} MiB "
              f"= {(peak + kernel_scratch) / 1e6:.1f} MB "
              f"(tracemalloc {peak / 2**20:.1f} MiB + kernel adjoints {kernel_scratch / 2**20:.1f} MiB; "
              f"stack alone {stack_bytes / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
