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

Both compute in the marginals' dtype (float32 or float64). Probabilities are
floored at ``TINY`` (float32: ``1e-37``) inside logarithms, so that ``0 log 0 = 0``
and gradients stay finite when marginals underflow at extreme parameters.
"""

import numpy as np

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
    mu, mu2 = unary_marginals, pairwise_marginals
    rho = np.asarray(rho, dtype=mu.dtype)  # in the marginals' precision
    i, j = edges[:, 0], edges[:, 1]
    log_mu = _log(mu)
    log_mu2 = _log(mu2)
    # log(mu_c / (mu_i mu_j)) for every edge and joint state
    log_ratio = log_mu2 - log_mu[i][:, :, None] - log_mu[j][:, None, :]
    mutual_information = np.einsum("eab,eab->e", mu2, log_ratio)
    value = -np.sum(_neg_entropy_terms(mu)) - np.dot(rho, mutual_information)
    if not gradient:
        return value
    grad_unary = -(log_mu + 1.0)
    # d I(mu_c) / d mu_i(a) = -sum_b mu_c(a, b) / mu_i(a)
    row_sums = mu2.sum(axis=2) * rho[:, None]
    col_sums = mu2.sum(axis=1) * rho[:, None]
    safe_mu = np.maximum(mu, _tiny(mu))
    np.add.at(grad_unary, i, row_sums / safe_mu[i])
    np.add.at(grad_unary, j, col_sums / safe_mu[j])
    grad_pairwise = -rho[:, None, None] * (log_ratio + 1.0)
    return value, (grad_unary, grad_pairwise)


def mean_field_entropy(unary_marginals, *, gradient=False):
    """Mean-field entropy ``sum_i H(mu_i)`` (and optionally its gradient)."""
    value = -np.sum(_neg_entropy_terms(unary_marginals))
    if not gradient:
        return value
    return value, -(_log(unary_marginals) + 1.0)
