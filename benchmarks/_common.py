"""Shared plumbing of the benchmarks: single-threaded numba, timing, the grid problem."""

import argparse
import os
import sys
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

from sklearn_margcrf._graph import grid_edges  # noqa: E402


def best_time(fn, repeat):
    """Minimum wall and CPU seconds of ``fn()`` over ``repeat`` runs, after a
    warm-up call (numba compilation). On a shared machine the CPU time is the
    steadier figure."""
    fn()
    wall, cpu = [], []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return min(wall), min(cpu)


def grid_arguments(doc, extra=()):
    """``--repeat``, ``--iters``, ``--height``, ``--width`` (defaults: 7, 20, 200 x 300), plus
    ``extra`` (name, keyword arguments of ``add_argument``) pairs."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, options in extra:
        parser.add_argument(name, **options)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--height", type=int, default=200)
    parser.add_argument("--width", type=int, default=300)
    return parser.parse_args()


def random_grid_model(height, width, n_states, seed=0):
    """The benchmark problem: 4-connected grid, theta uniform in [-1, 1]."""
    edges = grid_edges(height, width)
    rng = np.random.default_rng(seed)
    unary = rng.uniform(-1, 1, size=(height * width, n_states))
    pairwise = rng.uniform(-1, 1, size=(edges.shape[0], n_states, n_states))
    return edges, unary, pairwise, rng


def truncated_logistic_gradient(edges, unary, pairwise, rho, labels, n_iter):
    """Univariate logistic loss ``-sum_i log mu_i(label_i)`` of the TRW
    marginals after ``n_iter`` iterations and its gradient by back TRW:
    (loss, grad_unary, grad_pairwise, forward state)."""
    from sklearn_margcrf.trw import trw_backward, trw_forward

    state = trw_forward(edges, unary, pairwise, rho, n_iter=n_iter, keep_stack=True)
    loss, g_mu = logistic_loss(state.unary_marginals, labels)
    g_unary, g_pairwise = trw_backward(state, g_mu, None, mode="truncated")
    return loss, g_unary, g_pairwise, state


def logistic_loss(mu, labels):
    """``-sum_i log mu_i(label_i)`` and its gradient in the (n, K) marginals ``mu``."""
    rows = np.arange(mu.shape[0])
    g_mu = np.zeros_like(mu)
    g_mu[rows, labels] = -1.0 / mu[rows, labels]
    return -np.log(mu[rows, labels]).sum(), g_mu
