"""Benchmark of the linear parametrisation's products (sklearn_margcrf._linear).

Per image, a fit computes theta_i = F u_i over all pixels and theta_ij = G v_ij
over all edges, and after the backward pass the weight gradients, the adjoint
products. With the horses features (100 unary and 42 edge features, K = 2)
on a 200 x 300 grid, this prints the time of the four products with the numba
loops MarginalCRF uses, against single-threaded BLAS (numpy ``@``), for
float64 features and for float32 features (which BLAS must first copy to
float64).

Run: python benchmarks/bench_features.py [--repeat 7] [--height 200 --width 300]
"""

import numpy as np
from threadpoolctl import threadpool_limits

from _common import best_time, grid_arguments, random_grid_model
from sklearn_margcrf._linear import feature_scores, weight_gradient

N_NODE_FEATURES, N_EDGE_FEATURES, N_STATES = 100, 42, 2


def main():
    args = grid_arguments(__doc__)
    edges, _, _, rng = random_grid_model(args.height, args.width, N_STATES)
    n_nodes, n_edges = args.height * args.width, edges.shape[0]
    F = rng.normal(size=(N_STATES, N_NODE_FEATURES))
    G = rng.normal(size=(N_STATES * N_STATES, N_EDGE_FEATURES))
    grad_unary = rng.normal(size=(n_nodes, N_STATES))
    grad_pairwise = rng.normal(size=(n_edges, N_STATES * N_STATES))
    print(f"{args.height}x{args.width} grid: {n_nodes} nodes x {N_NODE_FEATURES} features, "
          f"{n_edges} edges x {N_EDGE_FEATURES} features, K={N_STATES}; best of {args.repeat}, one thread")
    print(f"{'features':<10}{'products':<10}{'wall s':>9}{'cpu s':>9}   per pixel")
    for dtype in (np.float64, np.float32):
        u = rng.random((n_nodes, N_NODE_FEATURES)).astype(dtype)
        v = (rng.random((n_edges, N_EDGE_FEATURES)) > 0.5).astype(dtype)

        def numba_products():
            feature_scores(u, F), feature_scores(v, G)
            weight_gradient(grad_unary, u), weight_gradient(grad_pairwise, v)

        def blas_products():
            u @ F.T, v @ G.T
            grad_unary.T @ u, grad_pairwise.T @ v

        with threadpool_limits(limits=1, user_api="blas"):
            for name, fn in (("numba", numba_products), ("BLAS", blas_products)):
                wall, cpu = best_time(fn, args.repeat)
                print(f"{np.dtype(dtype).name:<10}{name:<10}{wall:9.4f}{cpu:9.4f}   {wall / n_nodes * 1e9:6.0f} ns")


if __name__ == "__main__":
    main()
