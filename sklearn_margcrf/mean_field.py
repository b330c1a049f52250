"""Sequential mean field (paper Sec. "Mean Field") and back mean field
(paper Algorithm "Back Mean Field", Appendix C).

Model
-----
``edges`` (E, 2) int64, ``unary`` (n, K) and ``pairwise`` (E, K, K) float64
with ``pairwise[e, a, b] = theta(x_i = a, x_j = b)`` for ``edges[e] = (i, j)``
(see ``sklearn_margcrf._graph``). Inputs are assumed validated by the
caller; read-only arrays are accepted.

Update and schedule
-------------------
The update is the paper's "Mean Field Updates" theorem for pairwise factors,

    mu_j(x_j) <- softmax_x_j( theta_j(x_j)
                              + sum_{e = (j, i) or (i, j)} sum_{x_i} theta_e(x_j, x_i) mu_i(x_i) ),

computed with a max shift before ``exp`` (finite, normalised marginals for
``|theta|`` up to ~1e3 and beyond). Nodes are updated **sequentially, in
increasing index order j = 0, 1, ..., n-1**, each update using the newest
values of its neighbours (Gauss-Seidel / block-coordinate ascent); one
*iteration* is one such sweep over every node. Duplicate edges are simply
two factors and both contribute.

Initialisation is ``mu_i = softmax(theta_i)`` (the independent model), not the
paper's uniform marginals, so that ``n_iter = 0`` is the independent model for
every inference method of the package; the backward pass carries the gradient
through this initialisation with one more ``backnorm``.

``n_iter = k`` runs exactly k iterations; ``n_iter = None`` iterates until the
largest absolute change of any unary marginal within one iteration is below
``tol`` (``converged = True``) or ``max_iter`` iterations were run. For a fixed
``n_iter``, ``converged`` reports whether the last iteration changed the
marginals by less than ``tol``.

Clique marginals are, as the paper notes for mean field, the outer products
``mu_i mu_j^T`` (computed on first access of ``state.pairwise_marginals``).

Backward
--------
``mode="truncated"`` is Algorithm "Back Mean Field" line by line on the
iterations actually run (needs ``keep_stack=True``): it is the exact gradient
of ``L(mu after n_iter iterations)``. Because every node is updated once per
iteration, the paper's stack of overwritten marginals is stored as per-
iteration snapshots ``stack[t] = mu before iteration t`` of shape
``(n_iter, n, K)``.

``mode="fixed_point"`` differentiates the converged marginals (the paper's
"back-propagation" variant): the marginals are held at their converged values
and reverse sweeps of the same algorithm are repeated until every adjoint
``dL/dmu`` falls below ``tol``; this sums the Neumann series of the implicit
function theorem for the sweep map ``mu = F(mu, theta)``. The
initialisation does not influence the fixed point, so it receives no gradient.
"""

import numpy as np
from numba import njit

from ._backnorm import backnorm
from ._graph import check_n_iter, check_positive, incidence
from ._warnings import warn_at_caller
from .exceptions import BackpropDivergenceError

_ADJOINT_BLOWUP = 1e100  # fixed-point reverse sweeps have diverged beyond this

__all__ = ["MeanFieldState", "mean_field_forward", "mean_field_backward"]


class MeanFieldState:
    """Result of :func:`mean_field_forward` and what the backward pass needs.

    Attributes
    ----------
    unary_marginals : (n, K) float64
    pairwise_marginals : (E, K, K) float64
        Outer products ``mu_i mu_j^T`` (computed lazily, then cached).
    n_iter : int
        Number of iterations (sweeps over all nodes) that were run.
    converged : bool
        Whether the last iteration changed no unary marginal by ``tol`` or more.
    last_change : float
        Largest absolute change of a unary marginal in the last iteration
        (``inf`` if no iteration was run).
    stack : (n_iter, n, K) float64 or None
        ``stack[t]`` holds the marginals before iteration ``t`` (only with
        ``keep_stack=True``). A read-only-by-convention view of the stored
        snapshots, which are kept with the node axis reversed for the backward.
    edges, unary, pairwise :
        The model (references to the caller's arrays, not copies).
    initial_marginals : (n, K) float64
        ``softmax(unary)``, the starting point.
    tol : float
        The forward tolerance.
    """

    def __init__(self, edges, unary, pairwise, inc, unary_marginals, initial_marginals,
                 n_iter, converged, last_change, stack_rev, tol):
        self.edges = edges
        self.unary = unary
        self.pairwise = pairwise
        self.incidence = inc
        self.unary_marginals = unary_marginals
        self.initial_marginals = initial_marginals
        self.n_iter = int(n_iter)
        self.converged = bool(converged)
        self.last_change = float(last_change)
        self.tol = float(tol)
        self._stack_rev = stack_rev  # (n_iter, n, K), node axis reversed
        self._pairwise_marginals = None
        self._reversed_model = None

    @property
    def stack(self):
        """(n_iter, n, K) view: ``stack[t]`` = the marginals before iteration t."""
        return None if self._stack_rev is None else self._stack_rev[:, ::-1, :]

    @property
    def pairwise_marginals(self):
        if self._pairwise_marginals is None:
            self._pairwise_marginals = _outer_marginals(self.edges, self.unary_marginals)
        return self._pairwise_marginals

    def _reversed(self):
        """(edges, pairwise, incidence) of the graph relabelled in reverse
        (node j -> n-1-j, edge e -> E-1-e), built once and cached."""
        if self._reversed_model is None:
            n = self.unary_marginals.shape[0]
            edges_r = np.ascontiguousarray((n - 1) - self.edges[::-1])
            pairwise_r = np.ascontiguousarray(self.pairwise[::-1])
            self._reversed_model = (edges_r, pairwise_r, incidence(n, edges_r))
        return self._reversed_model

    @property
    def n_nodes(self):
        return self.unary_marginals.shape[0]

    def __repr__(self):
        return (f"MeanFieldState(n_nodes={self.unary_marginals.shape[0]}, "
                f"n_states={self.unary_marginals.shape[1]}, n_edges={self.edges.shape[0]}, "
                f"n_iter={self.n_iter}, converged={self.converged}, "
                f"stack={'yes' if self.stack is not None else 'no'})")


# ---------------------------------------------------------------------------
# numba kernels
# ---------------------------------------------------------------------------

@njit(cache=True)
def _softmax_rows(theta, out):
    """out[i] = softmax(theta[i]) with a max shift."""
    n, k_states = theta.shape
    for i in range(n):
        m = theta[i, 0]
        for a in range(1, k_states):
            if theta[i, a] > m:
                m = theta[i, a]
        z = 0.0
        for a in range(k_states):
            v = np.exp(theta[i, a] - m)
            out[i, a] = v
            z += v
        inv = 1.0 / z
        for a in range(k_states):
            out[i, a] *= inv


@njit(cache=True)
def _outer_kernel(edges, mu, out):
    k_states = mu.shape[1]
    for e in range(edges.shape[0]):
        i = edges[e, 0]
        j = edges[e, 1]
        for a in range(k_states):
            for b in range(k_states):
                out[e, a, b] = mu[i, a] * mu[j, b]


def _outer_marginals(edges, mu):
    out = np.empty((edges.shape[0], mu.shape[1], mu.shape[1]))
    if edges.shape[0]:
        _outer_kernel(edges, mu, out)
    return out


@njit(cache=True)
def _update_node(j, ptr, inc_edge, inc_side, edges, unary, pairwise, mu, field):
    """Step 2(b) for node j, any K: mu(x_j) propto exp(theta(x_j)
    + sum_{c: j in c} sum_{x_i} theta_c(x_j, x_i) mu(x_i)), max-shifted.
    Writes mu[j] in place; returns max_a |new - old|."""
    k_states = mu.shape[1]
    for a in range(k_states):
        field[a] = unary[j, a]
    for k in range(ptr[j], ptr[j + 1]):
        e = inc_edge[k]
        if inc_side[k] == 0:  # edges[e] = (j, i): theta_e[x_j, x_i]
            i = edges[e, 1]
            for a in range(k_states):
                acc = 0.0
                for b in range(k_states):
                    acc += pairwise[e, a, b] * mu[i, b]
                field[a] += acc
        else:  # edges[e] = (i, j): theta_e[x_i, x_j]
            i = edges[e, 0]
            for b in range(k_states):
                mib = mu[i, b]
                for a in range(k_states):
                    field[a] += pairwise[e, b, a] * mib
    m = field[0]
    for a in range(1, k_states):
        if field[a] > m:
            m = field[a]
    z = 0.0
    for a in range(k_states):
        v = np.exp(field[a] - m)
        field[a] = v
        z += v
    inv = 1.0 / z
    change = 0.0
    for a in range(k_states):
        new = field[a] * inv
        d = abs(new - mu[j, a])
        if d > change:
            change = d
        mu[j, a] = new
    return change


@njit(cache=True)
def _update_node_k2(j, ptr, inc_edge, inc_side, edges, unary, pairwise, mu):
    """:func:`_update_node` specialised to K = 2 (the field lives in registers;
    about 1.5x faster on binary grids). Same arithmetic, same result."""
    f0 = unary[j, 0]
    f1 = unary[j, 1]
    for k in range(ptr[j], ptr[j + 1]):
        e = inc_edge[k]
        if inc_side[k] == 0:
            i = edges[e, 1]
            m0 = mu[i, 0]
            m1 = mu[i, 1]
            f0 += pairwise[e, 0, 0] * m0 + pairwise[e, 0, 1] * m1
            f1 += pairwise[e, 1, 0] * m0 + pairwise[e, 1, 1] * m1
        else:
            i = edges[e, 0]
            m0 = mu[i, 0]
            m1 = mu[i, 1]
            f0 += pairwise[e, 0, 0] * m0 + pairwise[e, 1, 0] * m1
            f1 += pairwise[e, 0, 1] * m0 + pairwise[e, 1, 1] * m1
    m = f0 if f0 > f1 else f1
    e0 = np.exp(f0 - m)
    e1 = np.exp(f1 - m)
    inv = 1.0 / (e0 + e1)
    n0 = e0 * inv
    n1 = e1 * inv
    change = abs(n0 - mu[j, 0])
    d = abs(n1 - mu[j, 1])
    if d > change:
        change = d
    mu[j, 0] = n0
    mu[j, 1] = n1
    return change


@njit(cache=True)
def _mf_forward_kernel(ptr, inc_edge, inc_side, edges, unary, pairwise, mu,
                       n_sweeps, tol, stop_on_tol, stack_rev):
    """Run up to ``n_sweeps`` sequential mean-field iterations on ``mu`` in place.

    Algorithm "Back Mean Field", step 2: for every iteration t and node
    j = 0..n-1, (a) push mu_j -- here the whole snapshot of the marginals at
    the start of iteration t, stored in reversed node order
    ``stack_rev[t, n-1-j] = mu_j`` (only if ``stack_rev.shape[0] > 0``) so
    that the reverse sweeps of the backward read it forwards in memory --
    and (b) recompute mu_j from theta and the current neighbour marginals.

    Returns (iterations run, largest |change| of a marginal in the last one).
    """
    n, k_states = mu.shape
    keep = stack_rev.shape[0] > 0
    field = np.empty(k_states)
    change = np.inf
    done = 0
    for t in range(n_sweeps):
        if keep:  # step 2(a), for all nodes of this iteration at once
            for r in range(n):
                for a in range(k_states):
                    stack_rev[t, r, a] = mu[n - 1 - r, a]
        change = 0.0
        if k_states == 2:
            for j in range(n):  # step 2(b)
                d = _update_node_k2(j, ptr, inc_edge, inc_side, edges, unary, pairwise, mu)
                if d > change:
                    change = d
        else:
            for j in range(n):  # step 2(b)
                d = _update_node(j, ptr, inc_edge, inc_side, edges, unary, pairwise, mu, field)
                if d > change:
                    change = d
        done = t + 1
        if stop_on_tol and change < tol:
            break
    return done, change


# The backward kernels below run on the graph with nodes and edges relabelled
# in reverse (node j -> n-1-j, edge e -> E-1-e; see MeanFieldState._reversed):
# Algorithm "Back Mean Field" visits the nodes in the reverse of the forward
# order, and walking the arrays backwards in memory is ~4x slower than
# forwards on the target machine once they leave the cache. In the relabelled
# graph the paper's reverse order j = n-1..0 is simply r = 0..n-1.

@njit(cache=True)
def _mf_reverse_sweep(ptr, inc_edge, inc_side, edges, pairwise, mu, gmu,
                      g_unary, g_pairwise, nu, stack_rev, t, restore):
    """One reverse iteration t of Algorithm "Back Mean Field", step 5.

    All arrays are in the reversed labelling. On entry ``mu`` holds the
    marginals as they were at the end of iteration t and ``gmu`` the adjoints
    dL/dmu of those versions. With ``restore`` the overwritten marginals are
    pulled from ``stack_rev[t]`` (truncated mode); without it they are held
    fixed (fixed-point mode).
    """
    n, k_states = mu.shape
    for j in range(n):  # = original nodes n-1, n-2, ..., 0
        # 5(a): nu_j = backnorm(dL/dmu_j, mu_j)
        backnorm(gmu[j], mu[j], nu)
        # 5(b): dL/dtheta(x_j) += nu(x_j)
        for a in range(k_states):
            g_unary[j, a] += nu[a]
        for k in range(ptr[j], ptr[j + 1]):
            e = inc_edge[k]
            if inc_side[k] == 0:  # edges[e] = (j, i), theta_e[x_j, x_i]
                i = edges[e, 1]
                # 5(c): dL/dtheta_c(x_j, x_i) += nu(x_j) mu(x_i)
                for a in range(k_states):
                    na = nu[a]
                    for b in range(k_states):
                        g_pairwise[e, a, b] += na * mu[i, b]
                # 5(d): dL/dmu(x_i) += sum_{x_j} nu(x_j) theta_c(x_j, x_i)
                for b in range(k_states):
                    acc = 0.0
                    for a in range(k_states):
                        acc += nu[a] * pairwise[e, a, b]
                    gmu[i, b] += acc
            else:  # edges[e] = (i, j), theta_e[x_i, x_j]
                i = edges[e, 0]
                for b in range(k_states):
                    mib = mu[i, b]
                    acc = 0.0
                    for a in range(k_states):
                        # 5(c): dL/dtheta_c(x_i, x_j) += mu(x_i) nu(x_j)
                        g_pairwise[e, b, a] += mib * nu[a]
                        # 5(d): dL/dmu(x_i) += sum_{x_j} theta_c(x_i, x_j) nu(x_j)
                        acc += pairwise[e, b, a] * nu[a]
                    gmu[i, b] += acc
        # 5(e): pull mu_j from the stack
        if restore:
            for a in range(k_states):
                mu[j, a] = stack_rev[t, j, a]
        # 5(f): the adjoint of the (older) value now in mu_j starts at zero
        for a in range(k_states):
            gmu[j, a] = 0.0


@njit(cache=True)
def _mf_backward_truncated(ptr, inc_edge, inc_side, edges, pairwise, mu, gmu,
                           g_unary, g_pairwise, stack_rev, n_sweeps):
    """Step 5 for t = n_sweeps-1..0, then the initialisation.

    ``mu`` ends as the initial marginals softmax(theta); the remaining adjoint
    ``gmu = dL/dmu^(0)`` is pushed through the initialisation
    ``mu^(0)_i = softmax(theta_i)``: dL/dtheta_i += backnorm(gmu_i, mu^(0)_i).
    """
    n, k_states = mu.shape
    nu = np.empty(k_states)
    for tt in range(n_sweeps):
        t = n_sweeps - 1 - tt
        _mf_reverse_sweep(ptr, inc_edge, inc_side, edges, pairwise, mu, gmu,
                          g_unary, g_pairwise, nu, stack_rev, t, True)
    for i in range(n):
        backnorm(gmu[i], mu[i], nu)
        for a in range(k_states):
            g_unary[i, a] += nu[a]


@njit(cache=True)
def _mf_backward_fixed_point(ptr, inc_edge, inc_side, edges, pairwise, mu, gmu,
                             g_unary, g_pairwise, tol, max_iter):
    """Reverse sweeps at the fixed point until max |dL/dmu| < tol.

    Returns (sweeps run, largest remaining adjoint).
    """
    n, k_states = mu.shape
    nu = np.empty(k_states)
    dummy = np.empty((0, 0, 0))
    largest = np.inf
    sweeps = 0
    for s in range(max_iter):
        _mf_reverse_sweep(ptr, inc_edge, inc_side, edges, pairwise, mu, gmu,
                          g_unary, g_pairwise, nu, dummy, 0, False)
        sweeps = s + 1
        largest = 0.0
        for i in range(n):
            for a in range(k_states):
                v = abs(gmu[i, a])
                if v > largest:
                    largest = v
        if largest < tol or not largest < _ADJOINT_BLOWUP:
            break
    return sweeps, largest


@njit(cache=True)
def _fold_pairwise(edges, mu, grad_pairwise_marginals, gmu):
    """Step 3 for clique marginals mu_c = mu_i (x) mu_j:
    dL/dmu_i += G mu_j and dL/dmu_j += G^T mu_i."""
    k_states = mu.shape[1]
    for e in range(edges.shape[0]):
        i = edges[e, 0]
        j = edges[e, 1]
        for a in range(k_states):
            acc = 0.0
            mia = mu[i, a]
            for b in range(k_states):
                g = grad_pairwise_marginals[e, a, b]
                acc += g * mu[j, b]
                gmu[j, b] += g * mia
            gmu[i, a] += acc


# ---------------------------------------------------------------------------
# Python API
# ---------------------------------------------------------------------------

def _contiguous(a, dtype):
    return np.ascontiguousarray(a, dtype=dtype)


def mean_field_forward(edges, unary, pairwise, n_iter=None, tol=1e-6, max_iter=1000,
                       keep_stack=False):
    """Sequential mean field from ``softmax(unary)``.

    Parameters
    ----------
    edges : (E, 2) int64
    unary : (n, K) float64
    pairwise : (E, K, K) float64
    n_iter : int or None
        Exactly this many iterations (sweeps j = 0..n-1), or ``None`` to
        iterate until the largest change of a unary marginal in one iteration
        is below ``tol`` or ``max_iter`` iterations were run.
    tol : float
    max_iter : int
    keep_stack : bool
        Keep the per-iteration snapshots needed by
        ``mean_field_backward(mode="truncated")``.

    Returns
    -------
    MeanFieldState
    """
    edges = _contiguous(edges, np.int64).reshape(-1, 2)
    unary = _contiguous(unary, np.float64)
    pairwise = _contiguous(pairwise, np.float64)
    n_nodes, n_states = unary.shape
    if pairwise.size == 0:
        pairwise = pairwise.reshape(edges.shape[0], n_states, n_states)
    n_iter = check_n_iter(n_iter)
    tol = check_positive(tol, "tol")
    max_iter = check_n_iter(max_iter, "max_iter", allow_none=False)
    inc = incidence(n_nodes, edges)

    initial = np.empty((n_nodes, n_states))
    _softmax_rows(unary, initial)
    mu = initial.copy()

    def run(n_sweeps, stop, stack_rev):
        return _mf_forward_kernel(inc.ptr, inc.edge, inc.side, edges, unary, pairwise, mu,
                                  n_sweeps, tol, stop, stack_rev)

    empty_stack = np.empty((0, n_nodes, n_states))
    stack = None
    if n_iter is not None:
        if keep_stack:
            stack = np.empty((n_iter, n_nodes, n_states))
        done, change = run(n_iter, False, stack if keep_stack else empty_stack)
    elif not keep_stack:
        done, change = run(max_iter, True, empty_stack)
    else:
        # Unknown length: run in growing chunks, each with its own snapshots.
        chunks, done, chunk, change = [], 0, 16, np.inf
        while done < max_iter:
            size = min(chunk, max_iter - done)
            buf = np.empty((size, n_nodes, n_states))
            ran, change = run(size, True, buf)
            chunks.append(buf[:ran])
            done += ran
            if change < tol:
                break
            chunk *= 2
        stack = np.concatenate(chunks, axis=0) if chunks else empty_stack
    converged = bool(change < tol)
    return MeanFieldState(edges, unary, pairwise, inc, mu, initial, done, converged, change,
                          stack, tol)


def _check_grad(grad, shape, name):
    if grad is None:
        return np.zeros(shape)
    grad = np.ascontiguousarray(grad, dtype=np.float64)
    if grad.shape != shape:
        if grad.size == 0 and int(np.prod(shape)) == 0:
            return np.zeros(shape)
        raise ValueError(f"{name} must have shape {shape}, got {grad.shape}")
    return grad


def mean_field_backward(state, grad_unary_marginals, grad_pairwise_marginals, mode="truncated",
                        tol=1e-10, max_iter=10000, on_divergence="warn"):
    """Gradient of a loss of the mean-field marginals with respect to theta.

    Parameters
    ----------
    state : MeanFieldState
    grad_unary_marginals : (n, K) array or None
        dL/dmu_i (``None`` means zero).
    grad_pairwise_marginals : (E, K, K) array or None
        dL/dmu_ij for the clique marginals ``mu_i mu_j^T`` (``None`` means zero).
    mode : {"truncated", "fixed_point"}
        ``"truncated"``: exact gradient of the loss after exactly
        ``state.n_iter`` iterations from ``softmax(unary)`` (Algorithm "Back
        Mean Field"; the forward must have used ``keep_stack=True`` unless
        ``n_iter == 0``). ``"fixed_point"``: gradient of the loss at the
        converged marginals (implicit differentiation by repeated reverse
        sweeps at the fixed point).
    tol : float
        Fixed-point mode: stop when every adjoint dL/dmu is below ``tol``.
    max_iter : int
        Fixed-point mode: maximum number of reverse sweeps; if reached, a
        ``RuntimeWarning`` is issued and the current estimate is returned.
    on_divergence : {"warn", "raise"}
        Fixed-point mode: when the sweeps do not converge (or blow up, which
        stops them early), warn as above or raise
        :class:`~sklearn_margcrf.exceptions.BackpropDivergenceError`.

    Returns
    -------
    grad_unary : (n, K) float64
    grad_pairwise : (E, K, K) float64
    """
    edges = state.edges
    n_nodes, n_states = state.unary_marginals.shape
    n_edges = edges.shape[0]
    gmu = _check_grad(grad_unary_marginals, (n_nodes, n_states), "grad_unary_marginals").copy()
    gpm = _check_grad(grad_pairwise_marginals, (n_edges, n_states, n_states),
                      "grad_pairwise_marginals")
    if mode not in ("truncated", "fixed_point"):
        raise ValueError(f"mode must be 'truncated' or 'fixed_point', got {mode!r}")
    # Step 3: dL/dmu of the final marginals, clique terms folded into unary adjoints.
    if n_edges:
        _fold_pairwise(edges, state.unary_marginals, gpm, gmu)
    # Work in the reversed labelling (see the comment above _mf_reverse_sweep).
    edges_r, pairwise_r, inc_r = state._reversed()
    mu_r = np.ascontiguousarray(state.unary_marginals[::-1])
    gmu_r = np.ascontiguousarray(gmu[::-1])
    # Step 4.
    g_unary_r = np.zeros((n_nodes, n_states))
    g_pairwise_r = np.zeros((n_edges, n_states, n_states))

    if mode == "truncated":
        if state._stack_rev is None and state.n_iter > 0:
            raise ValueError(
                "mode='truncated' needs the stack of overwritten marginals: run "
                "mean_field_forward(..., keep_stack=True)")
        stack_rev = (state._stack_rev if state._stack_rev is not None
                     else np.empty((0, n_nodes, n_states)))
        _mf_backward_truncated(inc_r.ptr, inc_r.edge, inc_r.side, edges_r, pairwise_r, mu_r,
                               gmu_r, g_unary_r, g_pairwise_r, stack_rev, state.n_iter)
    else:
        tol = check_positive(tol, "tol")
        max_iter = check_n_iter(max_iter, "max_iter", allow_none=False)
        if not state.converged:
            warn_at_caller(
                f"mean_field_backward(mode='fixed_point') at marginals that are not converged "
                f"(last change {state.last_change:.3g} >= tol {state.tol:.3g} after "
                f"{state.n_iter} iterations); the gradient assumes a fixed point",
                RuntimeWarning)
        sweeps, largest = _mf_backward_fixed_point(inc_r.ptr, inc_r.edge, inc_r.side, edges_r,
                                                   pairwise_r, mu_r, gmu_r, g_unary_r,
                                                   g_pairwise_r, tol, max_iter)
        if not largest < tol:
            if on_divergence == "raise":
                raise BackpropDivergenceError(
                    f"back mean field at the converged marginals did not converge in {sweeps} reverse "
                    f"sweeps (largest adjoint {largest:.3g}, tol {tol:g})")
            warn_at_caller(
                f"fixed-point back mean field did not converge in {sweeps} reverse sweeps "
                f"(largest remaining adjoint {largest:.3g} >= tol {tol:.3g}); "
                f"returning the current estimate",
                RuntimeWarning)
    return (np.ascontiguousarray(g_unary_r[::-1]), np.ascontiguousarray(g_pairwise_r[::-1]))
