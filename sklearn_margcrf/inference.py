"""Marginal inference: ``infer(edges, unary, pairwise, method=...)``.

Chooses the kernel (``trw``, ``mean_field``, ``exact``) in Python and returns
marginals with the log-partition estimate of the method (paper Sec.
"Variational Inference"):

- ``"trw"``: ``theta . mu + H~(mu)`` with the TRW entropy; an upper bound on
  log Z at convergence when rho is valid (see :mod:`.edge_appearance`).
- ``"lbp"``: loopy BP, TRW with rho = 1 (Bethe entropy; no bound).
- ``"mean_field"``: ``theta . mu + sum_i H(mu_i)``, a lower bound on log Z.
- ``"exact"``: log Z itself.

With an integer ``n_iter`` the log-partition estimate is the paper's truncated
partition function: the marginals after ``n_iter`` iterations put into the
method's entropy (Sec. "Truncated Likelihood & Truncated EM").
"""

import numbers
from dataclasses import dataclass

import numpy as np

from ._graph import check_n_iter, check_positive, validate_model
from ._warnings import warn_at_caller
from ._workspace import call_workspace, owned, scratch_copy, scratch_full
from .edge_appearance import RHO_RULES, kept_probabilities
from .entropy import mean_field_entropy, trw_entropy

__all__ = ["infer", "InferenceResult", "METHODS"]

METHODS = ("trw", "lbp", "mean_field", "exact")
MIN_RHO = np.finfo(np.float64).tiny  # below it (subnormal) 1 / rho overflows to inf and TRW returns NaN


class InferenceResult:
    """Marginals and log-partition estimate returned by :func:`~sklearn_margcrf.infer`.

    Attributes
    ----------
    unary : ndarray (n, K)
        Unary marginals ``mu(x_i)``.
    pairwise : ndarray (E, K, K)
        Pairwise marginals ``mu(x_i, x_j)`` laid out like ``pairwise``.
    log_partition : float or numpy.float32
        The method's estimate of log Z (see the module docstring), of the
        marginals' dtype.
    n_iter : int
        Iterations run (0 for exact inference).
    converged : bool
        Whether the last iteration changed every unary marginal by less than
        ``tol`` (with a fixed ``n_iter`` too; False when no iteration ran).
        Always True for exact inference.
    rho : ndarray (E,) or None
        Edge appearance probabilities used (TRW and LBP).
    """

    def __init__(self, unary, pairwise, log_partition, n_iter, converged, rho=None):
        self.unary = unary
        # an array, or (inside the package) a function computing it on first
        # access: the gradients of losses of the unary marginals never read it
        self._pairwise = pairwise
        self.log_partition = log_partition
        self.n_iter = n_iter
        self.converged = converged
        self.rho = rho

    @property
    def pairwise(self):
        if callable(self._pairwise):
            self._pairwise = self._pairwise()
        return self._pairwise

    @pairwise.setter
    def pairwise(self, value):
        self._pairwise = value

    def __repr__(self):
        return (f"InferenceResult(unary=<{self.unary.shape} {self.unary.dtype}>, log_partition={self.log_partition}, "
                f"n_iter={self.n_iter}, converged={self.converged})")


def resolve_rho(rho, method, n_nodes, edges):
    """Validate ``rho`` for ``method`` and return an (E,) float array (or None)."""
    n_edges = edges.shape[0]
    if method == "lbp":
        if rho is not None:
            raise ValueError("rho applies to method='trw' only; loopy BP ('lbp') uses rho = 1")
        return np.ones(n_edges)
    if method != "trw":
        if rho is not None:
            raise ValueError(f"rho applies to method='trw' only, not to method={method!r}")
        return None
    if rho is None:
        rho = "auto"
    if isinstance(rho, str):
        if rho not in RHO_RULES:
            raise ValueError(f"rho must be a positive float, an (E,) array or one of {RHO_RULES}, got {rho!r}")
        return scratch_copy(kept_probabilities(n_nodes, edges, rho))  # per image and evaluation in a fit
    if isinstance(rho, (bool, np.bool_)):
        raise ValueError(f"rho must be a positive float, an (E,) array or one of {RHO_RULES}, got {rho!r}")
    if isinstance(rho, numbers.Real):
        value = float(rho)
        if not np.isfinite(value) or value <= 0:
            raise ValueError(f"rho must be positive and finite, got {rho!r}")
        if value < MIN_RHO:
            raise ValueError(f"rho must be at least {MIN_RHO:g} (1 / rho must be finite), got {rho!r}")
        return scratch_full(n_edges, value, np.float64)  # per image and evaluation in a fit
    try:
        array = np.asarray(rho, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"rho must be a positive float, an (E,) array or one of {RHO_RULES}, got {rho!r}") from None
    if array.shape != (n_edges,):
        raise ValueError(f"rho must have one entry per edge, shape ({n_edges},), got shape {array.shape}")
    if not np.all(np.isfinite(array)) or np.any(array <= 0):
        raise ValueError("rho must be positive and finite for every edge (rho <= 0, NaN or inf found)")
    if np.any(array < MIN_RHO):
        raise ValueError(f"rho must be at least {MIN_RHO:g} for every edge (1 / rho must be finite), got {array.min()!r}")
    return np.ascontiguousarray(array)


def check_method(method):
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return method


def check_iteration_controls(n_iter, tol, max_iter):
    n_iter = check_n_iter(n_iter)
    tol = check_positive(tol, "tol")
    max_iter = check_n_iter(max_iter, "max_iter", allow_none=False)
    if max_iter < 1:
        raise ValueError(f"max_iter must be at least 1, got {max_iter}")
    return n_iter, tol, max_iter


def method_entropy(method, edges, unary_marginals, pairwise_marginals, rho, gradient=False):
    """The entropy in ``method``'s log-partition estimate (TRW and LBP: the TRW
    entropy with ``rho``; mean field: the sum of node entropies) and, with
    ``gradient``, its gradient in both marginals."""
    if method == "mean_field":
        if not gradient:
            return mean_field_entropy(unary_marginals)
        value, grad_unary = mean_field_entropy(unary_marginals, gradient=True)
        return value, (grad_unary, np.zeros_like(pairwise_marginals))
    return trw_entropy(edges, unary_marginals, pairwise_marginals, rho, gradient=gradient)


def energy(unary, pairwise, unary_marginals, pairwise_marginals):
    """``theta . mu``, the energy term of a log-partition estimate (beside the
    entropy), summed in float64 over terms in the model's dtype (a float32
    total of thousands of terms is off by more than L-BFGS's decreases)."""
    return (np.sum(unary * unary_marginals, dtype=np.float64)
            + np.sum(pairwise * pairwise_marginals, dtype=np.float64))


def _trw_forward(edges, unary, pairwise, rho, n_iter, tol, max_iter, keep_stack, checkpoints, start=None,
                 check_converged=True):
    from .trw import _forward

    return _forward(edges, unary, pairwise, rho, n_iter, tol, max_iter, keep_stack, checkpoints, start=start,
                    check_converged=check_converged)


def _trw_backward(*args, **kwargs):
    from .trw import trw_backward

    return trw_backward(*args, **kwargs)


def _mean_field_forward(edges, unary, pairwise, rho, n_iter, tol, max_iter, keep_stack, checkpoints, start=None,
                        check_converged=True):
    """``check_converged`` has nothing to spare here: the last change is a by-product of the sweeps."""
    from .mean_field import mean_field_forward

    return mean_field_forward(edges, unary, pairwise, n_iter=n_iter, tol=tol, max_iter=max_iter,
                              keep_stack=keep_stack, checkpoints=checkpoints, start=start)


def _mean_field_backward(*args, **kwargs):
    from .mean_field import mean_field_backward

    return mean_field_backward(*args, **kwargs)


@dataclass(frozen=True)
class Kernel:
    """An iterative inference method's forward pass, ``forward(edges, unary,
    pairwise, rho, n_iter, tol, max_iter, keep_stack, checkpoints, start=None)
    -> state``, its reverse mode, ``backward(state, dL/dmu_unary,
    dL/dmu_pairwise, mode=..., tol=..., max_iter=..., on_divergence=...)``,
    and where a pass ended: ``end(state)``, the array a later ``forward`` on
    the same graph takes as ``start``, of ``end_size(n_nodes, n_edges,
    n_states)`` values (TRW: the messages, mean field: the marginals)."""

    forward: object
    backward: object
    end: object
    end_size: object


def _trw_end(state):
    return state.slot_messages


def _trw_end_size(n_nodes, n_edges, n_states):
    return 2 * n_edges * n_states


def _mean_field_end(state):
    return state.unary_marginals


def _mean_field_end_size(n_nodes, n_edges, n_states):
    return n_nodes * n_states


#: The one map from an iterative method to its kernels (used by ``infer`` and
#: by the gradient modes). Loopy BP is TRW with rho = 1.
KERNELS = {
    "trw": Kernel(_trw_forward, _trw_backward, _trw_end, _trw_end_size),
    "lbp": Kernel(_trw_forward, _trw_backward, _trw_end, _trw_end_size),
    "mean_field": Kernel(_mean_field_forward, _mean_field_backward, _mean_field_end, _mean_field_end_size),
}


def _warn_floored(method, state):
    from .trw import floor_clause, floored_message_entries

    n_floored = floored_message_entries(state)
    if n_floored:
        dtype = state.unary.dtype
        warn_at_caller(
            f"{method}: {n_floored} message entries are at {floor_clause(dtype)}, so the marginals and the "
            f"log-partition estimate may be inaccurate (even when converged is True); use smaller parameters "
            f"(e.g. a larger reg){', float64' if dtype == np.float32 else ''}, mean field or exact inference",
            RuntimeWarning,
        )


def run_inference(edges, unary, pairwise, method, rho, n_iter, tol, max_iter, keep_stack=False, log_partition=True,
                  checkpoints=None, start=None, check_converged=True):
    """Run a kernel on validated inputs; return (kernel state or None, InferenceResult).

    The state is what the kernel's backward pass needs (None for exact).
    ``start`` is where an iterative method starts (``KERNELS[method].end``
    of an earlier pass on the same graph; None: its usual start).
    Nothing is warned here: the callers report messages at the floor
    (``trw.floored_message_entries(state)``) in their own way.
    With ``log_partition=False`` the entropy is not evaluated (about a fifth
    of the CPU time of a truncated TRW gradient) and ``result.log_partition``
    is None, except for exact inference, which gets log Z for free.
    With ``check_converged=False`` and an integer ``n_iter``, TRW skips the
    marginals before the last iteration that ``result.converged`` compares
    with (8.5 ms of the 91 ms outside the sweeps of a K = 8 float64
    truncated gradient at 200 x 300), and ``result.converged`` is None.
    Everything is computed in, and returned as, the dtype of ``unary``.
    """
    dtype = unary.dtype.type
    if method == "exact":
        if n_iter is not None:
            raise ValueError("exact inference is not iterative: n_iter must be None for method='exact'")
        from .exact import exact_inference

        mu, mu2, log_z = exact_inference(edges, unary, pairwise)
        return None, InferenceResult(mu, mu2, dtype(log_z), 0, True, None)
    state = KERNELS[method].forward(edges, unary, pairwise, rho, n_iter, tol, max_iter, keep_stack, checkpoints, start,
                                    check_converged)
    mu = state.unary_marginals
    if log_partition:
        mu2 = state.pairwise_marginals
        entropy = method_entropy(method, edges, mu, mu2, rho)
        log_partition = dtype(energy(unary, pairwise, mu, mu2) + entropy)  # in float64, returned in the model's dtype
    else:  # a kernel's state may compute them on first access (TRW on grids, mean field)
        log_partition = None
        mu2 = lambda: state.pairwise_marginals  # noqa: E731
    converged = None if state.converged is None else bool(state.converged)
    result = InferenceResult(mu, mu2, log_partition, int(state.n_iter), converged, rho)
    return state, result


def infer(edges, unary, pairwise, *, method="trw", n_iter=None, tol=1e-6, max_iter=1000, rho=None):
    """Marginals and log-partition estimate of a pairwise model.

    Parameters
    ----------
    edges : array-like of shape (E, 2)
        Integer node pairs ``(i, j)``; nodes without edges are allowed.
    unary : array-like of shape (n, K)
        ``unary[i, a] = theta(x_i = a)``.
    pairwise : array-like of shape (E, K, K)
        ``pairwise[e, a, b] = theta(x_i = a, x_j = b)`` for ``edges[e] = (i, j)``.
        Inference computes in float32 when ``unary`` and ``pairwise`` are
        both float32 arrays, in float64 otherwise; the marginals and the
        log-partition estimate have that dtype. float32 needs half the
        memory and is faster with many labels (1.7 times with 8); its messages are
        exact for parameter differences up to about ``85 * rho`` (float64:
        ``690 * rho``).
    method : {"trw", "lbp", "mean_field", "exact"}, default="trw"
        Tree-reweighted BP, loopy BP (TRW with rho = 1), mean field, or exact
        inference (junction tree; forests of any size, loopy graphs of small
        treewidth; a ValueError says why when the graph is too wide).
    n_iter : int or None, default=None
        ``None``: iterate until the largest change of any unary marginal in an
        iteration is below ``tol`` or ``max_iter`` is reached. An integer k:
        exactly k iterations from uniform messages (mean field: from the
        softmax of ``unary``), whatever the change; ``n_iter=0`` gives the
        softmax of ``unary``. Must be None for exact inference.
    tol : float, default=1e-6
        Convergence threshold on the change of unary marginals.
    max_iter : int, default=1000
        Iteration cap when ``n_iter`` is None.
    rho : float, array of shape (E,), str or None, default=None
        TRW edge appearance probabilities: one value for all edges, one per
        edge, or a rule name ("auto", "uniform_spanning_tree",
        "forest_cover"; see :mod:`sklearn_margcrf.edge_appearance`). None
        means "auto", which is valid for any graph (TRW's log-partition is
        then an upper bound) and exactly 1 on trees. Only for method="trw".

    Returns
    -------
    InferenceResult
        ``.unary`` (n, K), ``.pairwise`` (E, K, K), ``.log_partition``,
        ``.n_iter``, ``.converged`` (and ``.rho`` for TRW / LBP). Its arrays
        are the caller's own; the scratch arrays of the call stay with the
        thread for its next call, as those of
        :func:`~sklearn_margcrf.loss_and_grad` do (see there).

    Warns
    -----
    RuntimeWarning
        TRW and LBP, when message entries end at their floor ``1e-300``
        (float32: ``1e-37``): parameters that differ by more than about
        ``690 * rho`` (float32: ``85 * rho``) need smaller entries, and the
        marginals and log-partition estimate may then be inaccurate even
        where ``converged`` is True. Mean field and exact
        inference have no such limit.
    """
    method = check_method(method)
    edges, unary, pairwise = validate_model(edges, unary, pairwise)
    n_iter, tol, max_iter = check_iteration_controls(n_iter, tol, max_iter)
    with call_workspace():  # no fresh pages for this thread's next call
        rho = resolve_rho(rho, method, unary.shape[0], edges)
        state, result = run_inference(edges, unary, pairwise, method, rho, n_iter, tol, max_iter)
        if method in ("trw", "lbp"):
            _warn_floored(method, state)
        del state
        return InferenceResult(owned(result.unary), owned(result.pairwise), result.log_partition, result.n_iter,
                               result.converged, owned(result.rho))
