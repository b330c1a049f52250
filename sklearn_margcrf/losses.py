"""Loss functions (Domke 2013, Sec. "Loss Functions").

Two families live here:

* **Marginal-based losses** (:func:`marginal_loss`): plain functions of the
  (possibly approximate) unary and pairwise marginals.  They know nothing of
  how the marginals were computed; they return the loss value and its gradient
  with respect to the marginal arrays, which the gradient layer then
  back-propagates through the inference algorithm.
* **The likelihood family that needs no inference** (:func:`pseudolikelihood`,
  :func:`piecewise`): functions of the parameters theta, returning the
  negative (pseudo / piecewise) log-likelihood and its gradient with respect
  to ``unary`` and ``pairwise``.

Every value is a *sum* over nodes / edges (not a mean) and is to be
*minimised* (the likelihoods are negated).

Conventions (see ``docs/architecture.md``): ``edges`` (E, 2) int64 with
``edges[e] = (i, j)``; ``unary`` / unary marginals (n, K); ``pairwise`` /
pairwise marginals (E, K, K) with ``[e, a, b]`` referring to
``x_i = a, x_j = b``; ``labels`` (n,) int64 with ``-1`` marking a hidden
(unobserved) node.  Inputs are validated by the caller.

Hidden labels (paper, Sec. "Hidden variables"): sums run over observed
variables only.  Precisely,

* univariate losses and the node pieces of ``piecewise``: observed nodes;
* ``clique_logistic`` and the edge pieces of ``piecewise``: edges whose two
  ends are both observed;
* ``pseudolikelihood``: the term of node ``i`` is kept only if ``x_i`` *and
  every neighbour of i* are observed -- terms touching a hidden node are
  dropped (the conditional p(x_i | x_N(i)) is undefined without them).

Node weights (``node_weight``, optional, (n,) non-negative): every term is
multiplied by the weight of its node; an edge term (``clique_logistic``, the
edge pieces of ``piecewise``) by the mean of its two nodes' weights; a
``pseudolikelihood`` term by its node's. ``None`` weighs every term 1 (and
computes exactly as without weights). Class weights of the estimator are
node weights given by each node's label.

Precision: every function computes in the dtype of its array arguments
(float32 when they are float32, float64 otherwise) and returns gradients of
that dtype.

Log guard: at extreme parameters a marginal can underflow to 0.  The logistic
losses evaluate ``-log(max(mu, floor))`` with ``floor = LOG_FLOOR = 1e-300``
in float64 (``1e-37`` in float32) and return the gradient ``-1 / max(mu, floor)``.  Above the floor this is the
exact derivative; below it the value and gradient stay finite (the gradient is
the one at the floor, so ``mu * grad`` -- what a softmax-type backward pass
forms -- stays within [-1, 0]).
"""

import numpy as np
from scipy.special import expit, logsumexp, softmax

__all__ = [
    "LOG_FLOOR",
    "MARGINAL_LOSSES",
    "marginal_loss",
    "piecewise",
    "pseudolikelihood",
]

MARGINAL_LOSSES = (
    "univariate_logistic",
    "clique_logistic",
    "univariate_quadratic",
    "smooth_classification",
)
# the marginal losses that read the pairwise marginals (the others' pairwise gradient is zero)
PAIRWISE_LOSSES = ("clique_logistic",)

LOG_FLOOR = 1e-300
_LOG_FLOOR_FLOAT32 = 1e-37  # 1 / floor stays finite in float32


def _float_dtype(*arrays):
    """float32 when every array is float32, float64 otherwise."""
    return np.dtype(np.float32) if all(np.asarray(a).dtype == np.float32 for a in arrays) else np.dtype(np.float64)


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def _labels_and_mask(labels):
    labels = np.asarray(labels, dtype=np.int64)
    observed = labels >= 0
    # index that is safe to use for hidden nodes too (their terms are masked out)
    safe = np.where(observed, labels, 0)
    return labels, observed, safe


def _weighted_sum(values, weights):
    """``sum(values)``, or ``sum(weights * values)`` when weights are given,
    accumulated in float64 whatever the values' dtype: a float32 total of an
    image's terms is good to about 1e-7 of itself only, more than the
    decrease that L-BFGS's line search looks for near the end of a fit."""
    if weights is None:
        return values.sum(dtype=np.float64)
    return (weights * values).sum(dtype=np.float64)


def _scaled(grad, weights):
    """``grad`` with each row (node or edge) multiplied by its weight (in place)."""
    if weights is not None:
        grad *= weights.reshape((-1,) + (1,) * (grad.ndim - 1)).astype(grad.dtype, copy=False)
    return grad


def _edge_weight(edges, node_weight):
    """The weight of each edge term: the mean of its two nodes' weights (None stays None)."""
    if node_weight is None:
        return None
    return 0.5 * (node_weight[edges[:, 0]] + node_weight[edges[:, 1]])


def _edge_mask(edges, observed):
    if edges.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    return observed[edges[:, 0]] & observed[edges[:, 1]]


def _neg_log_and_grad(values):
    """-log(max(v, floor)) and the gradient -1 / max(v, floor) (floor: LOG_FLOOR, or its float32 value)."""
    floor = _LOG_FLOOR_FLOAT32 if values.dtype == np.float32 else LOG_FLOOR
    clipped = np.maximum(values, values.dtype.type(floor))
    return -np.log(clipped), -1 / clipped


def _check_alpha(alpha):
    if alpha is None:
        raise ValueError(
            "smooth_classification needs alpha > 0 (the sigmoid sharpness; the paper "
            "uses 5, 15 or 50), got alpha=None"
        )
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"smooth_classification needs a numeric alpha > 0, got alpha={alpha!r}") from None
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"smooth_classification needs a finite alpha > 0, got alpha={alpha!r}")
    return value


# ---------------------------------------------------------------------------
# marginal-based losses
# ---------------------------------------------------------------------------


def _univariate_logistic(mu, observed, safe, weight=None):
    nodes = np.flatnonzero(observed)
    grad = np.zeros_like(mu)
    value, g = _neg_log_and_grad(mu[nodes, safe[nodes]])
    w = None if weight is None else weight[nodes]
    grad[nodes, safe[nodes]] = _scaled(g, w)
    return float(_weighted_sum(value, w)), grad


def _clique_logistic(mu2, edges, observed, safe, weight=None):
    grad = np.zeros_like(mu2)
    kept = np.flatnonzero(_edge_mask(edges, observed))
    if kept.size == 0:
        return 0.0, grad
    a = safe[edges[kept, 0]]
    b = safe[edges[kept, 1]]
    value, g = _neg_log_and_grad(mu2[kept, a, b])
    w = _edge_weight(edges[kept], weight)
    grad[kept, a, b] = _scaled(g, w)
    return float(_weighted_sum(value, w)), grad


def _univariate_quadratic(mu, observed, safe, weight=None):
    n, k = mu.shape
    target = np.zeros_like(mu)
    target[np.arange(n), safe] = 1.0
    diff = (mu - target) * observed[:, None]
    square = diff * diff
    return float(_weighted_sum(square if weight is None else square.sum(axis=1), weight)), _scaled(2.0 * diff, weight)


def _smooth_classification(mu, observed, safe, alpha, weight=None):
    n, k = mu.shape
    grad = np.zeros_like(mu)
    nodes = np.flatnonzero(observed)
    if nodes.size == 0:
        return 0.0, grad
    rows = mu[nodes]
    truth = safe[nodes]
    others = rows.copy()
    others[np.arange(nodes.size), truth] = -np.inf
    # np.argmax returns the *first* maximiser: ties among the wrong labels send
    # the gradient to the smallest such label index.
    rival = np.argmax(others, axis=1)
    t = others[np.arange(nodes.size), rival] - rows[np.arange(nodes.size), truth]
    at = alpha * t
    value = expit(at)  # 1 / (1 + exp(-alpha t)), stable for any |alpha t|
    slope = alpha * expit(at) * expit(-at)  # dS/dt, no overflow either
    w = None if weight is None else weight[nodes]
    slope = _scaled(slope, w)
    grad[nodes, rival] += slope
    grad[nodes, truth] -= slope
    return float(_weighted_sum(value, w)), grad


def marginal_loss(name, unary_marginals, pairwise_marginals, edges, labels, alpha=None, node_weight=None):
    """A marginal-based loss and its gradient with respect to the marginals.

    Parameters
    ----------
    name : str
        One of ``MARGINAL_LOSSES``:

        - ``"univariate_logistic"``: ``-sum_{i observed} log mu_i(x_i)``.
        - ``"clique_logistic"``: ``-sum_{(i,j) both observed} log mu_ij(x_i, x_j)``.
        - ``"univariate_quadratic"``:
          ``sum_{i observed} sum_x (mu_i(x) - [x = x_i])**2``.
        - ``"smooth_classification"``:
          ``sum_{i observed} S(max_{x' != x_i} mu_i(x') - mu_i(x_i))`` with
          ``S(t) = 1 / (1 + exp(-alpha t))``.  The gradient goes through the
          maximising wrong label ``x'``; on ties the first (smallest-index)
          maximiser is used.
    unary_marginals : (n, K) array
    pairwise_marginals : (E, K, K) array or None
        Only read by ``"clique_logistic"``; ``None`` is allowed for the
        others (the returned pairwise gradient is then zeros (E, K, K)).
    edges : (E, 2) int array
    labels : (n,) int array, ``-1`` = hidden
    alpha : float, optional
        Sigmoid sharpness, required (> 0) for ``"smooth_classification"``
        (the paper uses 5, 15, 50); ignored by the other losses.
    node_weight : (n,) array, optional
        Weight of each node's term (an edge's: the mean of its ends'); see
        the module docstring.

    Returns
    -------
    value : float
    grad_unary_marginals : (n, K) ndarray
    grad_pairwise_marginals : (E, K, K) ndarray

    Notes
    -----
    The gradients are with respect to the raw arrays (no normalisation is
    assumed).  Logs are guarded by ``LOG_FLOOR``, see the module
    docstring.
    """
    value, grad, grad2 = _marginal_loss(name, unary_marginals, pairwise_marginals, edges, labels, alpha, node_weight)
    if grad2 is None:
        n_states = np.shape(unary_marginals)[1]
        grad2 = np.zeros((np.asarray(edges).reshape(-1, 2).shape[0], n_states, n_states), grad.dtype)
    return value, grad, grad2


def _marginal_loss(name, unary_marginals, pairwise_marginals, edges, labels, alpha=None, node_weight=None):
    """:func:`marginal_loss` with None for the pairwise gradient of the
    losses that do not read the pairwise marginals (zeros, which a fit need
    not allocate for every image)."""
    if not isinstance(name, str) or name not in MARGINAL_LOSSES:
        raise ValueError(f"unknown marginal loss {name!r}; valid names are {', '.join(MARGINAL_LOSSES)}")
    if name == "smooth_classification":
        alpha = _check_alpha(alpha)

    dtype = _float_dtype(unary_marginals) if pairwise_marginals is None else _float_dtype(unary_marginals, pairwise_marginals)
    mu = np.asarray(unary_marginals, dtype=dtype)
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    labels, observed, safe = _labels_and_mask(labels)

    if pairwise_marginals is None:
        if name == "clique_logistic":
            raise ValueError("clique_logistic needs pairwise_marginals, got None")
        mu2 = None
    else:
        mu2 = np.asarray(pairwise_marginals, dtype=dtype)
    weight = None if node_weight is None else np.asarray(node_weight, dtype=np.float64)
    if name == "univariate_logistic":
        value, grad = _univariate_logistic(mu, observed, safe, weight)
        return value, grad, None
    if name == "clique_logistic":
        value, grad2 = _clique_logistic(mu2, edges, observed, safe, weight)
        return value, np.zeros_like(mu), grad2
    if name == "univariate_quadratic":
        value, grad = _univariate_quadratic(mu, observed, safe, weight)
        return value, grad, None
    value, grad = _smooth_classification(mu, observed, safe, alpha, weight)
    return value, grad, None


# ---------------------------------------------------------------------------
# likelihood family (functions of theta, no inference)
# ---------------------------------------------------------------------------


def _model_and_labels(edges, unary, pairwise, labels):
    """Arrays of a model (int64 edges, theta of the model's dtype) and its label masks."""
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    dtype = _float_dtype(unary, pairwise)
    unary = np.asarray(unary, dtype=dtype)
    pairwise = np.asarray(pairwise, dtype=dtype)
    return (edges, unary, pairwise) + tuple(_labels_and_mask(labels))


def pseudolikelihood(edges, unary, pairwise, labels, node_weight=None):
    """Negative pseudolikelihood ``-sum_i log p(x_i | x_N(i))`` and its gradient.

    ``p(x_i = a | x_N(i)) ∝ exp(theta_i(a) + sum_{c ∋ i} theta_c(a, x_j))``,
    where for ``edges[e] = (i, j)`` node ``i`` indexes axis 1 of
    ``pairwise[e]`` and node ``j`` axis 2.

    Hidden labels: the term of node ``i`` is kept only if ``x_i`` and all its
    neighbours are observed; terms touching a hidden node are dropped.

    Returns
    -------
    value : float
    grad_unary : (n, K) ndarray
    grad_pairwise : (E, K, K) ndarray
    """
    edges, unary, pairwise, labels, observed, safe = _model_and_labels(edges, unary, pairwise, labels)
    n, k = unary.shape
    n_edges = edges.shape[0]
    src, dst = edges[:, 0], edges[:, 1]
    ar = np.arange(n_edges)

    # conditional scores s_i(a) = theta_i(a) + sum of the incident pairwise
    # columns / rows at the neighbours' labels
    scores = unary.copy()
    np.add.at(scores, src, pairwise[ar, :, safe[dst]])  # (E, K): theta_e(a, x_j)
    np.add.at(scores, dst, pairwise[ar, safe[src], :])  # (E, K): theta_e(x_i, b)

    # keep node i iff it and all its neighbours are observed
    hidden_neighbours = np.bincount(src[~observed[dst]], minlength=n) + np.bincount(
        dst[~observed[src]], minlength=n
    )
    keep = observed & (hidden_neighbours == 0)

    log_norm = logsumexp(scores, axis=1)
    weight = None if node_weight is None else np.asarray(node_weight, dtype=np.float64)[keep]
    value = -_weighted_sum((scores[np.arange(n), safe] - log_norm)[keep], weight)

    g = softmax(scores, axis=1)
    g[np.arange(n), safe] -= 1.0
    g *= keep[:, None]  # d(value)/d(scores)
    if node_weight is not None:
        _scaled(g, np.asarray(node_weight, dtype=np.float64))

    grad_pairwise = np.zeros_like(pairwise)
    if n_edges:
        # node i = src[e] saw column x_j of pairwise[e]; node j = dst[e] saw row x_i
        grad_pairwise[ar, :, safe[dst]] += g[src]
        grad_pairwise[ar, safe[src], :] += g[dst]
    return float(value), g, grad_pairwise


def piecewise(edges, unary, pairwise, labels, node_weight=None):
    """Negative piecewise likelihood with one piece per node and per edge.

    ``-( sum_i [theta_i(x_i) - logsumexp theta_i] + sum_c [theta_c(x_c) - logsumexp theta_c] )``
    (paper, Sec. "Piecewise Likelihood").  Node terms run over observed nodes,
    edge terms over edges whose two ends are observed.  The gradient of every
    piece is ``softmax(theta_piece) - indicator(x_piece)``.

    Returns
    -------
    value : float
    grad_unary : (n, K) ndarray
    grad_pairwise : (E, K, K) ndarray
    """
    edges, unary, pairwise, labels, observed, safe = _model_and_labels(edges, unary, pairwise, labels)
    n, k = unary.shape
    n_edges = edges.shape[0]

    weight = None if node_weight is None else np.asarray(node_weight, dtype=np.float64)
    node_value = unary[np.arange(n), safe] - logsumexp(unary, axis=1)
    grad_unary = softmax(unary, axis=1)
    grad_unary[np.arange(n), safe] -= 1.0
    grad_unary *= observed[:, None]
    _scaled(grad_unary, weight)
    value = -_weighted_sum(node_value[observed], None if weight is None else weight[observed])

    grad_pairwise = np.zeros_like(pairwise)
    if n_edges:
        kept = _edge_mask(edges, observed)
        flat = pairwise.reshape(n_edges, k * k)
        cell = safe[edges[:, 0]] * k + safe[edges[:, 1]]
        ar = np.arange(n_edges)
        edge_value = flat[ar, cell] - logsumexp(flat, axis=1)
        edge_weight = _edge_weight(edges, weight)
        value -= _weighted_sum(edge_value[kept], None if edge_weight is None else edge_weight[kept])
        g = softmax(flat, axis=1)
        g[ar, cell] -= 1.0
        g *= kept[:, None]
        _scaled(g, edge_weight)
        grad_pairwise = g.reshape(n_edges, k, k)
    return float(value), grad_unary, grad_pairwise
