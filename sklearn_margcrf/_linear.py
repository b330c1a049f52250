"""The linear parametrisation of the paper, theta_i = F u(y, i) and
theta_ij = G v(y, i, j), and its adjoint: the two products between a
feature matrix and the weights, over all the nodes (or edges) of an image.

Numba loops instead of BLAS: with K = 2..8 rows of weights these products
are memory-bound, and the loops read float32 features directly (promoting
each value to float64 in registers) where BLAS would need a float64 copy of
the whole feature matrix first; they are also faster than single-threaded
BLAS for float64 features.
"""

import numba
import numpy as np

__all__ = ["feature_scores", "weight_gradient"]


# The per-row steps the products share. Inlined at numba's IR level, so each
# caller compiles them with its own fastmath flags, as if written out in place.
@numba.njit(nogil=True, inline="always")
def _row_dot(coef, k, features, i):
    """Row k of the weights dotted with row i of the features."""
    acc = 0.0
    for f in range(features.shape[1]):
        acc += coef[k, f] * features[i, f]
    return acc


@numba.njit(nogil=True, inline="always")
def _add_scaled_row(out, k, g, features, i):
    """``out[k] += g * features[i]``."""
    for f in range(features.shape[1]):
        out[k, f] += g * features[i, f]


# reassociation lets the dot products vectorise; the order is fixed at
# compile time, so results are still reproducible
@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def feature_scores(features, coef):
    """``features @ coef.T`` in float64: (n, D) features (float32 or float64)
    times (M, D) weights -> (n, M) scores."""
    n = features.shape[0]
    m = coef.shape[0]
    out = np.empty((n, m))
    for i in range(n):
        for k in range(m):
            out[i, k] = _row_dot(coef, k, features, i)
    return out


@numba.njit(cache=True, nogil=True)
def weight_gradient(score_grad, features):
    """``score_grad.T @ features`` in float64: the gradient of the weights
    from the gradient of the scores, (n, M) and (n, D) -> (M, D)."""
    n, d = features.shape
    m = score_grad.shape[1]
    out = np.zeros((m, d))
    for i in range(n):
        for k in range(m):
            g = score_grad[i, k]
            if g != 0.0:
                _add_scaled_row(out, k, g, features, i)
    return out
