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


# reassociation lets the dot products vectorise; the order is fixed at
# compile time, so results are still reproducible
@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def feature_scores(features, coef):
    """``features @ coef.T`` in float64: (n, D) features (float32 or float64)
    times (M, D) weights -> (n, M) scores."""
    n, d = features.shape
    m = coef.shape[0]
    out = np.empty((n, m))
    for i in range(n):
        for k in range(m):
            acc = 0.0
            for f in range(d):
                acc += coef[k, f] * features[i, f]
            out[i, k] = acc
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
                for f in range(d):
                    out[k, f] += g * features[i, f]
    return out
