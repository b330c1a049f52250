"""Entropy approximations of the variational methods and their gradients.

- TRW (paper Eq. TRW-entropy): ``H~(mu) = sum_i H(mu_i) - sum_c rho_c I(mu_c)``,
  ``I(mu_c) = sum_{x_c} mu_c(x_c) log(mu_c(x_c) / prod_{i in c} mu_i(x_i))``;
  with rho = 1 it is the Bethe entropy of loopy BP.
- Mean field (paper Eq. meanfield-entropy): ``H(mu) = sum_i H(mu_i)``.

Both are written as functions of the unary marginals *and* the pairwise
marginals as two independent arrays, exactly as the formulas read, so that
they are well defined (and differentiable) away from the local polytope too:
the truncated partition function of Sec. "Truncated Likelihood" plugs in the
marginals after N iterations, which need not be locally consistent.

Both compute in the marginals' dtype (float32 or float64), gradients too, but
sum their values in float64 (a float32 total of thousands of terms carries a
rounding noise larger than the decreases L-BFGS's line search looks for near
the end of a fit). Probabilities are
floored at ``TINY`` (float32: ``1e-37``) inside logarithms, so that ``0 log 0 = 0``
and gradients stay finite when marginals underflow at extreme parameters.
"""

import numpy as np
from numba import njit

__all__ = ["trw_entropy", "mean_field_entropy", "TINY"]

TINY = 1e-300  # float64; float32 guards with 1e-37 (its inverse stays finite)


def _tiny(p):
    return p.dtype.type(1e-37 if p.dtype == np.float32 else TINY)


def _log(p):
    return np.log(np.maximum(p, _tiny(p)))


def _neg_entropy_terms(p):
    """Elementwise p log p with 0 log 0 = 0."""
    return p * _log(p)


def trw_entropy(edges, unary_marginals, pairwise_marginals, rho, *, gradient=False):
    """TRW entropy ``H~(mu)`` (and optionally its gradient in both marginals).

    Returns
    -------
    value : float
    (grad_unary (n, K), grad_pairwise (E, K, K)), only when ``gradient``.
    """
    mu = np.ascontiguousarray(unary_marginals)
    mu2 = np.ascontiguousarray(pairwise_marginals, dtype=mu.dtype)
    rho = np.ascontiguousarray(np.broadcast_to(np.asarray(rho, dtype=mu.dtype), (mu2.shape[0],)))
    edges = np.ascontiguousarray(edges, dtype=np.int64)
    grad_unary = np.empty(mu.shape if gradient else (0, 0), mu.dtype)
    grad_pairwise = np.empty(mu2.shape if gradient else (0, 0, 0), mu.dtype)
    value = _trw_entropy(edges, mu, mu2, rho, _tiny(mu), gradient, grad_unary, grad_pairwise)
    value = float(value)
    if not gradient:
        return value
    return value, (grad_unary, grad_pairwise)


@njit(cache=True, nogil=True)
def _trw_entropy(edges, mu, mu2, rho, tiny, gradient, grad_unary, grad_pairwise):
    """One pass over the nodes and one over the edges (the logarithms of
    ``mu2`` are the cost), sums in float64. The gradient:
    ``dH/dmu_i(a) = -(log mu_i(a) + 1) + sum_c rho_c sum_b mu_c(a, b) / mu_i(a)``
    and ``dH/dmu_c(a, b) = -rho_c (log(mu_c(a, b) / (mu_i(a) mu_j(b))) + 1)``."""
    n_nodes, K = mu.shape
    log_mu = np.empty((n_nodes, K), mu.dtype)
    value = 0.0
    for v in range(n_nodes):
        for a in range(K):
            log_p = np.log(max(mu[v, a], tiny))
            log_mu[v, a] = log_p
            value -= mu[v, a] * log_p
            if gradient:
                grad_unary[v, a] = -(log_p + 1.0)
    column = np.empty(K, np.float64)
    for e in range(edges.shape[0]):
        i, j, r = edges[e, 0], edges[e, 1], rho[e]
        mutual_information = 0.0
        column[:] = 0.0
        for a in range(K):
            row = 0.0
            for b in range(K):
                q = mu2[e, a, b]
                log_ratio = np.log(max(q, tiny)) - log_mu[i, a] - log_mu[j, b]
                mutual_information += q * log_ratio
                if gradient:
                    grad_pairwise[e, a, b] = -r * (log_ratio + 1.0)
                    row += q
                    column[b] += q
            if gradient:
                grad_unary[i, a] += r * row / max(mu[i, a], tiny)
        if gradient:
            for b in range(K):
                grad_unary[j, b] += r * column[b] / max(mu[j, b], tiny)
        value -= r * mutual_information
    return value


def mean_field_entropy(unary_marginals, *, gradient=False):
    """Mean-field entropy ``sum_i H(mu_i)`` (and optionally its gradient)."""
    value = -float(np.sum(_neg_entropy_terms(unary_marginals), dtype=np.float64))
    if not gradient:
        return value
    return value, -(_log(unary_marginals) + 1.0)
