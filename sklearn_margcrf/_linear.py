"""The linear parametrisation of the paper, theta_i = F u(y, i) and
theta_ij = G v(y, i, j), and its adjoint: the two products between a
feature matrix and the weights, over all the nodes (or edges) of an image.

Numba loops instead of BLAS: with K = 2..8 rows of weights these products
are memory-bound, and the loops read float32 features directly (promoting
each value to float64 in registers) where BLAS would need a float64 copy of
the whole feature matrix first; they are also faster than single-threaded
BLAS for float64 features.

The independent model's logistic loss fuses both products with the loss
(:func:`logistic_loss_and_gradient`), so that its many evaluations over all
the labelled pixels of a data set read the features once and allocate no
per-pixel arrays.
"""

import math

import numba
import numpy as np

__all__ = ["feature_scores", "weight_gradient", "logistic_loss_and_gradient"]


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


#: rows whose losses are summed before they join the total (keeps the rounding
#: error of the sum near that of a pairwise sum over millions of rows)
_LOSS_BLOCK = 4096


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def logistic_loss_and_gradient(features, targets, coef):
    """Multinomial logistic loss ``sum_i log sum_k exp(s_ik) - s_i,y_i`` of the
    scores ``s = features @ coef.T`` and its gradient with respect to ``coef``
    ((M, D), float64), in one pass over the (n, D) features: the independent
    model's univariate logistic loss. Fusing :func:`feature_scores`, the loss
    and :func:`weight_gradient` reads the features once and allocates no
    (n, M) arrays, whose first touch is a large part of the cost on machines
    where fresh memory is slow to fault in."""
    n, d = features.shape
    m = coef.shape[0]
    grad = np.zeros((m, d))
    scores = np.empty(m)
    total = 0.0
    block = 0.0
    for i in range(n):
        for k in range(m):
            scores[k] = _row_dot(coef, k, features, i)
        top = scores[0]
        for k in range(1, m):
            top = max(top, scores[k])
        norm = 0.0
        for k in range(m):
            norm += math.exp(scores[k] - top)
        log_z = top + math.log(norm)
        y = targets[i]
        block += log_z - scores[y]
        if (i + 1) % _LOSS_BLOCK == 0:
            total += block
            block = 0.0
        for k in range(m):
            g = math.exp(scores[k] - log_z) - (1.0 if k == y else 0.0)
            _add_scaled_row(grad, k, g, features, i)
    return total + block, grad
