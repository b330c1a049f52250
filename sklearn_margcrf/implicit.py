"""Implicit differentiation of TRW / loopy BP (paper Sec. "Implicit Fitting", Appendix B).

At the optimum ``mu = argmax_{B mu = d} theta . mu + H~(mu)`` the theorem gives
``dL/dtheta = (D^-1 B^T (B D^-1 B^T)^-1 B D^-1 - D^-1) dQ/dmu`` with
``D = d^2 H~ / d mu d mu^T``. That formula needs D invertible, which fails for
TRW on grids (a corner node of a grid with rho = 1/2 has entropy weight
``1 - sum_c rho_c = 0``). The same quantity is the upper-left block of the
inverse of the KKT matrix (Appendix B, Eq. du_lambda_dtheta), so we solve

    [[D, B^T], [B, 0]] [v; w] = [dQ/dmu; 0],     dL/dtheta = -v,

with scipy.sparse. On the local polytope the TRW entropy equals
``sum_i (1 - sum_{c ni i} rho_c) H(mu_i) + sum_c rho_c H(mu_c)``, whose Hessian
is diagonal; only its restriction to the null space of B enters v, so this is
the Hessian that matters.

B holds the local-polytope constraints: ``sum_a mu_i(a) = 1`` per node,
``sum_b mu_c(a, b) = mu_i(a)`` for every a, and ``sum_a mu_c(a, b) = mu_j(b)``
for all but the last b (that row is implied by the others), so B has full row
rank.
"""

import warnings

import numpy as np
from scipy import sparse
from scipy.sparse.linalg import MatrixRankWarning, spsolve

from .entropy import TINY

__all__ = ["local_polytope_constraints", "implicit_gradient"]


def local_polytope_constraints(n_nodes, n_states, edges):
    """Sparse constraint matrix B (rows: constraints, columns: [mu_unary, mu_pairwise]) and d."""
    K = n_states
    n_edges = edges.shape[0]
    unary_index = np.arange(n_nodes * K).reshape(n_nodes, K)
    pair_index = n_nodes * K + np.arange(n_edges * K * K).reshape(n_edges, K, K)
    rows, cols, vals = [], [], []

    # normalisation of each node
    rows.append(np.repeat(np.arange(n_nodes), K))
    cols.append(unary_index.ravel())
    vals.append(np.ones(n_nodes * K))
    n_rows = n_nodes

    # sum_b mu_c(a, b) - mu_i(a) = 0, row per (e, a)
    row_i = n_rows + np.arange(n_edges * K).reshape(n_edges, K)
    rows += [np.repeat(row_i.ravel(), K), row_i.ravel()]
    cols += [pair_index.ravel(), unary_index[edges[:, 0]].ravel()]
    vals += [np.ones(n_edges * K * K), -np.ones(n_edges * K)]
    n_rows += n_edges * K

    # sum_a mu_c(a, b) - mu_j(b) = 0, row per (e, b < K - 1)
    row_j = n_rows + np.arange(n_edges * (K - 1)).reshape(n_edges, K - 1)
    rows += [np.repeat(row_j[:, None, :], K, axis=1).ravel(), row_j.ravel()]
    cols += [pair_index[:, :, : K - 1].ravel(), unary_index[edges[:, 1]][:, : K - 1].ravel()]
    vals += [np.ones(n_edges * K * (K - 1)), -np.ones(n_edges * (K - 1))]
    n_rows += n_edges * (K - 1)

    B = sparse.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(n_rows, n_nodes * K + n_edges * K * K),
    )
    d = np.zeros(n_rows)
    d[:n_nodes] = 1.0
    return B, d


def implicit_gradient(edges, unary_marginals, pairwise_marginals, rho, grad_unary_marginals, grad_pairwise_marginals):
    """``dL/dtheta`` from ``dQ/dmu`` at converged TRW marginals (rho = 1: loopy BP).

    Returns (grad_unary (n, K), grad_pairwise (E, K, K)).
    """
    n_nodes, K = unary_marginals.shape
    n_edges = edges.shape[0]
    B, _ = local_polytope_constraints(n_nodes, K, edges)
    node_rho = np.bincount(edges.ravel(), weights=np.repeat(rho, 2), minlength=n_nodes)
    # Hessian of the entropy: -weight / mu on the diagonal
    d_unary = -(1.0 - node_rho)[:, None] / np.maximum(unary_marginals, TINY)
    d_pairwise = -rho[:, None, None] / np.maximum(pairwise_marginals, TINY)
    D = sparse.diags(np.concatenate([d_unary.ravel(), d_pairwise.ravel()]))
    kkt = sparse.bmat([[D, B.T], [B, None]], format="csc")
    rhs = np.concatenate([grad_unary_marginals.ravel(), grad_pairwise_marginals.ravel(), np.zeros(B.shape[0])])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MatrixRankWarning)  # the error below says it better
        solution = spsolve(kkt, rhs)
    if not np.all(np.isfinite(solution)):
        smallest = min(unary_marginals.min(initial=1.0), pairwise_marginals.min(initial=1.0))
        raise ValueError(
            "gradient_mode='implicit': the KKT system of implicit differentiation is numerically singular at "
            f"these marginals (the smallest is {smallest:.3g}): parameters this large saturate the marginals; "
            "use gradient_mode='truncated' or 'backprop', or smaller parameters (e.g. a larger reg)"
        )
    v = -solution[: n_nodes * K + n_edges * K * K]
    return v[: n_nodes * K].reshape(n_nodes, K), v[n_nodes * K :].reshape(n_edges, K, K)
