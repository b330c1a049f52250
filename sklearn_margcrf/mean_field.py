"""Sequential mean field (paper Sec. "Mean Field") and back mean field
(paper Algorithm "Back Mean Field", Appendix C).

Model
-----
``edges`` (E, 2) int64, ``unary`` (n, K) and ``pairwise`` (E, K, K) of one
float dtype with ``pairwise[e, a, b] = theta(x_i = a, x_j = b)`` for
``edges[e] = (i, j)`` (see ``sklearn_margcrf._graph``). Inputs are assumed
validated by the caller; read-only arrays are accepted.

Precision
---------
Everything is computed in the dtype of ``unary``: float32 input gives float32
marginals, snapshots and gradients (half the memory), anything else float64.
The max shift keeps the marginals finite and normalised in either dtype for
``|theta|`` up to 1e3 and far beyond (until the field of a node, a sum of
``degree + 1`` parameters, overflows the dtype).

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

On the edges of :func:`sklearn_margcrf.grid_edges` (with tables of at most
200 bytes: K <= 5 in float64, K <= 7 in float32) an iteration runs the same
updates diagonal by diagonal, each node reading exactly the values it reads
in index order, with its exponentials in vector instructions
(``trw._exp_nonpositive``, within about an ulp of the ``np.exp`` of the
node-by-node updates): 2-4 times faster per iteration (see ``_grid_sweep``
and ``docs/scaling.rst``).

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

With ``checkpoints = s < n_iter`` (or ``checkpoints=None`` when the full
stack exceeds ``STACK_MEMORY_BUDGET``) the forward pass keeps only ``s``
snapshots, and the backward pass recomputes the others from them as
binomial checkpointing plans (``sklearn_margcrf._checkpoints``: one buffer of
``s`` slots and a work slot). The recomputed iterations are the same
floating-point operations as the forward ones, so the gradient equals the
full-stack gradient bit for bit.

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
from ._checkpoints import STACK_MEMORY_BUDGET, check_checkpoints, checkpoint_plan, incomplete_stack
from ._graph import check_n_iter, check_positive, incidence
from ._trw_grid import grid_shape
from ._warnings import warn_at_caller
from ._workspace import scratch, scratch_copy, scratch_full
from .exceptions import BackpropDivergenceError
from .trw import _exp_nonpositive, _label_token, _writable

__all__ = ["MeanFieldState", "mean_field_forward", "mean_field_backward"]


class MeanFieldState:
    """Result of :func:`mean_field_forward` and what the backward pass needs.

    Every float array is in the compute dtype, that of ``unary`` (float32 or
    float64).

    Attributes
    ----------
    unary_marginals : (n, K)
    pairwise_marginals : (E, K, K)
        Outer products ``mu_i mu_j^T`` (computed lazily, then cached).
    n_iter : int
        Number of iterations (sweeps over all nodes) that were run.
    converged : bool
        Whether the last iteration changed no unary marginal by ``tol`` or more.
    last_change : float
        Largest absolute change of a unary marginal in the last iteration
        (``inf`` if no iteration was run).
    stack : (n_iter, n, K) or None
        ``stack[t]`` holds the marginals before iteration ``t`` (only with
        ``keep_stack=True``). A read-only-by-convention view of the stored
        snapshots, which are kept with the node axis reversed for the backward.
        Complete only without checkpointing: when the forward kept fewer
        snapshots than iterations (``checkpointed``), accessing it raises
        ``ValueError``; the marginals before iteration ``t`` of
        ``checkpoint_plan.kept_iterations`` are
        ``stack_buffer[checkpoint_plan.forward_slots[t], ::-1]``.
    checkpoint_plan : ``sklearn_margcrf._checkpoints.CheckpointPlan`` or None
        With ``keep_stack=True`` (and at least one iteration): where the
        forward kept its snapshots and how the backward recomputes the others.
    stack_buffer : (n_slots, n, K) or None
        The one buffer holding the snapshots (node axis reversed), the
        marginals before iteration ``t`` in slot ``t`` without checkpointing;
        with checkpointing ``s`` slots of kept snapshots (the backward pass
        recomputes others into those it frees) and a work slot.
    checkpointed : bool
        Whether the forward kept fewer snapshots than iterations.
    edges, unary, pairwise :
        The model (references to the caller's arrays, not copies).
    initial_marginals : (n, K)
        The starting point: ``softmax(unary)``, or the forward's ``start``.
    tol : float
        The forward tolerance.
    """

    def __init__(self, edges, unary, pairwise, inc, unary_marginals, initial_marginals,
                 n_iter, converged, last_change, stack_rev, plan, tol, inc_node, skewed):
        self.edges = edges
        self.unary = unary
        self.pairwise = pairwise
        self.incidence = inc
        self._inc_node = inc_node  # _update_node's other ends
        self._skewed = skewed  # the grid's arrays of the forward sweeps (_skewed_model), or none
        self.unary_marginals = unary_marginals
        self.initial_marginals = initial_marginals
        self.n_iter = int(n_iter)
        self.converged = bool(converged)
        self.last_change = float(last_change)
        self.tol = float(tol)
        self._stack_rev = stack_rev  # (n_slots, n, K), node axis reversed
        self.checkpoint_plan = plan
        # whether a checkpointed backward has overwritten snapshots with recomputed ones
        self._buffer_reused = False
        self._pairwise_marginals = None
        self._reversed_model = None

    @property
    def checkpointed(self):
        return self.checkpoint_plan is not None and self.checkpoint_plan.checkpointed

    @property
    def stack_buffer(self):
        return self._stack_rev

    @property
    def stack(self):
        """(n_iter, n, K) view: ``stack[t]`` = the marginals before iteration t."""
        if self._stack_rev is None:
            return None
        if self.checkpointed:
            raise incomplete_stack(self.checkpoint_plan.n_snapshots, self.n_iter, "mean_field_forward")
        return self._stack_rev[:, ::-1, :]

    @property
    def pairwise_marginals(self):
        if self._pairwise_marginals is None:
            self._pairwise_marginals = _outer_marginals(self.edges, self.unary_marginals)
        return self._pairwise_marginals

    def _sweeps(self, mu, n_sweeps, save_slot, resume=False):
        """Recompute ``n_sweeps`` forward iterations of this model from ``mu``
        (in place), keeping the snapshots of ``save_slot`` in the buffer;
        ``resume``: see :func:`_mf_forward_kernel`."""
        inc = self.incidence
        _mf_forward_kernel(_mf_label_token(mu.shape[1]), inc.ptr, inc.edge, inc.side, self._inc_node, self.unary,
                           self.pairwise, mu, n_sweeps, self.tol, False, self._stack_rev, save_slot, self._skewed,
                           resume)

    def _advance(self, work, load, n_sweeps, save_slot):
        """An "advance" of the checkpoint plan: ``n_sweeps`` iterations from
        the snapshot in slot ``load`` (``load < 0``: from where the last
        advance ended, in ``work``), keeping the snapshots of ``save_slot``.
        On a grid the marginals stay skewed from one advance to the next
        (``work`` unused)."""
        on_grid = self._skewed[2].shape[0] > 0
        if load >= 0 and on_grid:
            _load_snapshot(self._skewed[2], self._stack_rev[load])
        elif load >= 0:
            work[...] = self._stack_rev[load, ::-1]
        self._sweeps(work, n_sweeps, save_slot, resume=on_grid)

    def _reversed(self):
        """(edges, pairwise, incidence) of the graph relabelled in reverse
        (node j -> n-1-j, edge e -> E-1-e), built once and cached."""
        if self._reversed_model is None:
            n = self.unary_marginals.shape[0]
            edges_r = np.subtract(n - 1, self.edges[::-1], out=scratch(self.edges.shape, self.edges.dtype))
            pairwise_r = scratch_copy(self.pairwise[::-1])
            self._reversed_model = (edges_r, pairwise_r, incidence(n, edges_r))
        return self._reversed_model

    @property
    def n_nodes(self):
        return self.unary_marginals.shape[0]

    def __repr__(self):
        if self._stack_rev is None:
            stack = "no"
        elif self.checkpointed:
            stack = f"{self.checkpoint_plan.n_snapshots} checkpoints"
        else:
            stack = "yes"
        return (f"MeanFieldState(n_nodes={self.unary_marginals.shape[0]}, "
                f"n_states={self.unary_marginals.shape[1]}, n_edges={self.edges.shape[0]}, "
                f"n_iter={self.n_iter}, converged={self.converged}, "
                f"dtype={self.unary_marginals.dtype}, stack={stack})")


# ---------------------------------------------------------------------------
# numba kernels
#
# Every kernel computes in the dtype of its float arguments (float32 or
# float64, one compiled specialisation each): scalars start from
# ``dtype.type(0)`` / ``dtype.type(1)`` of an argument, never from a float
# literal, which would promote the arithmetic to float64.
# ---------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _softmax_rows(theta, out):
    """out[i] = softmax(theta[i]) with a max shift."""
    n, k_states = theta.shape
    zero = out.dtype.type(0)
    one = out.dtype.type(1)
    for i in range(n):
        m = theta[i, 0]
        for a in range(1, k_states):
            if theta[i, a] > m:
                m = theta[i, a]
        z = zero
        for a in range(k_states):
            v = np.exp(theta[i, a] - m)
            out[i, a] = v
            z += v
        inv = one / z
        for a in range(k_states):
            out[i, a] *= inv


@njit(cache=True, nogil=True)
def _outer_kernel(edges, mu, out):
    k_states = mu.shape[1]
    for e in range(edges.shape[0]):
        i = edges[e, 0]
        j = edges[e, 1]
        for a in range(k_states):
            for b in range(k_states):
                out[e, a, b] = mu[i, a] * mu[j, b]


def _outer_marginals(edges, mu):
    out = scratch((edges.shape[0], mu.shape[1], mu.shape[1]), mu.dtype)
    if edges.shape[0]:
        _outer_kernel(edges, mu, out)
    return out


@njit(cache=True, nogil=True, inline="always")
def _update_node(j, ptr, inc_edge, inc_side, inc_node, unary, pairwise, mu, field, k_states):
    """Step 2(b) for node j: mu(x_j) propto exp(theta(x_j)
    + sum_{c: j in c} sum_{x_i} theta_c(x_j, x_i) mu(x_i)), max-shifted.
    Writes mu[j] in place; returns max_a |new - old|.

    ``k_states`` is passed by the caller so that a constant (K = 2) compiles
    this one body into fully unrolled code where it is inlined. ``inc_node[k]``
    is the other end of incidence ``k``'s edge: one dependent load fewer than
    reading it from ``edges``.

    Measured (2026-12-02, 200x300, K = 2, in-process alternating runs): this
    and the single exp below take 0.81 (float64) and 0.92 (float32) of the
    time of the previous body, with the same values bit for bit."""
    zero = mu.dtype.type(0)
    for a in range(k_states):
        field[a] = unary[j, a]
    for k in range(ptr[j], ptr[j + 1]):
        e = inc_edge[k]
        i = inc_node[k]
        if inc_side[k] == 0:  # edges[e] = (j, i): theta_e[x_j, x_i]
            for a in range(k_states):
                acc = zero
                for b in range(k_states):
                    acc += pairwise[e, a, b] * mu[i, b]
                field[a] += acc
        else:  # edges[e] = (i, j): theta_e[x_i, x_j]
            for b in range(k_states):
                mib = mu[i, b]
                for a in range(k_states):
                    field[a] += pairwise[e, b, a] * mib
    if k_states == 2:
        # the larger field's exp(0) is 1: one exp instead of two, and the
        # same values as the general loop below
        one = mu.dtype.type(1)
        big = 1 if field[1] > field[0] else 0
        v = np.exp(field[1 - big] - field[big])
        field[big] = one
        field[1 - big] = v
        z = one + v
    else:
        m = field[0]
        for a in range(1, k_states):
            if field[a] > m:
                m = field[a]
        z = zero
        for a in range(k_states):
            v = np.exp(field[a] - m)
            field[a] = v
            z += v
    inv = mu.dtype.type(1) / z
    change = zero
    for a in range(k_states):
        new = field[a] * inv
        d = abs(new - mu[j, a])
        if d > change:
            change = d
        mu[j, a] = new
    return change


@njit(cache=True, nogil=True, inline="always")
def _push_snapshot(mu, stack_rev, slot):
    """Step 2(a) for all nodes of an iteration at once: ``stack_rev[slot, n-1-j] = mu_j``."""
    n, k_states = mu.shape
    for r in range(n):
        for a in range(k_states):
            stack_rev[slot, r, a] = mu[n - 1 - r, a]


def _mf_label_token(n_states):
    """The first argument of :func:`_mf_forward_kernel`: TRW's label token,
    specialised (unrolled) for two labels only. Chosen here rather than
    branched on inside the kernel, which then compiled both bodies, unrolled
    and not, into every build: compiling the kernel took 19.8 s, now 9.9 s
    (K = 2, float64, a first-generation EPYC)."""
    return _label_token(n_states, specialise=n_states == 2)


@njit(cache=True, nogil=True)
def _mf_forward_kernel(kt, ptr, inc_edge, inc_side, inc_node, unary, pairwise, mu,
                       n_sweeps, tol, stop_on_tol, stack_rev, save_slot, skewed, resume=False):
    """Run up to ``n_sweeps`` sequential mean-field iterations on ``mu`` in place.

    Algorithm "Back Mean Field", step 2: for every iteration t and node
    j = 0..n-1, (a) push mu_j and (b) recompute mu_j from theta and the
    current neighbour marginals. The pushes of one iteration are kept as one
    snapshot of the marginals at its start, and only where ``save_slot[t] >=
    0`` (``save_slot``: ``n_sweeps + 1`` entries, the last for the marginals
    after the last iteration run, or none): it goes to
    ``stack_rev[save_slot[t]]``, in reversed node order ``stack_rev[s, n-1-j]
    = mu_j`` so that the reverse sweeps of the backward read it forwards in
    memory. On a grid (``skewed`` from :func:`_skewed_model`, else arrays
    of size 0) the iterations run diagonal by diagonal (:func:`_grid_sweep`)
    on the skewed marginals: the same updates, their exps within an ulp.
    With ``resume`` the marginals are those that the skewed arrays hold
    (where the last call left them, or :func:`_load_snapshot`), and stay
    there; ``mu`` then only gives the shape.

    ``kt``: :func:`_mf_label_token`, whose length is K (unrolled) or 0.

    Returns (iterations run, largest |change| of a marginal in the last one).
    """
    n = mu.shape[0]
    k_states = len(kt) if len(kt) > 0 else mu.shape[1]
    U, T, M, F, acc, X, bits = skewed
    on_grid = M.shape[0] > 0
    if on_grid and not resume:
        _skew_copy(M, mu, False, False)
    field = np.empty(k_states, dtype=mu.dtype)
    change = mu.dtype.type(np.inf)
    keep = save_slot.shape[0] > 0
    done = 0
    for t in range(n_sweeps + 1):
        if keep and save_slot[t] >= 0 and on_grid:
            _skew_copy(M, stack_rev[save_slot[t]], True, True)
        elif keep and save_slot[t] >= 0:
            _push_snapshot(mu, stack_rev, save_slot[t])
        if t == n_sweeps or (t > 0 and stop_on_tol and change < tol):
            break
        change = mu.dtype.type(0)
        if on_grid:
            change = _grid_sweep(U, T, M, F, acc, X, bits, k_states)
        else:
            for j in range(n):
                d = _update_node(j, ptr, inc_edge, inc_side, inc_node, unary, pairwise, mu, field, k_states)
                if d > change:
                    change = d
        done = t + 1
    if on_grid and not resume:
        _skew_copy(M, mu, True, False)
    return done, change


# ---------------------------------------------------------------------------
# Mean field on 4-connected grids (``grid_edges``): the same sweep, by diagonals
#
# In row-major order node (r, c) reads the new marginals of its left and upper
# neighbours and the old ones of its right and lower neighbours: those of the
# diagonals r + c = s - 1 and s + 1. So the nodes of a diagonal can be updated
# together, diagonal after diagonal, each reading exactly what it reads in row
# order and adding its terms in the same order, and a loop over them runs in
# vector instructions, exp included (``trw._exp_nonpositive``: within about an
# ulp of numpy's, so the marginals differ from the node-by-node ones in their
# last bits, as tests/test_mean_field.py checks). The grid's arrays are
# stored skewed, ``[.., q, p]`` with q = r + c + 2 and p = r + 1, so that a
# diagonal and its neighbours' diagonals are contiguous; a ring of zeros
# around the grid stands for the absent neighbours and edges (their terms add
# an exact zero). Measured (2026-12-05, 200 x 300, 20 iterations, minimum of
# 3 forward passes, per iteration beyond a pass of none), node by node against
# by diagonals: K = 2 1.90 / 0.59 ms in float64, 2.19 / 0.45 in float32; K = 3
# 4.50 / 1.77 and 3.64 / 1.04; K = 5 6.47 / 5.50 and 5.81 / 2.81; K = 7 in
# float32 8.61 / 5.74; K = 8 in float64 10.2 / 12.2 (slower: beyond 200 bytes
# per table the diagonals' K x K passes over their lanes cost more than they
# save, and the skewed tables, 40% larger than the edges' and built at each
# forward pass, 54 ms at K = 8 with the first builder, cost more still). The node-by-node updates keep
# numpy's exp: the polynomial of trw._exp_nonpositive in a scalar chain made
# them 1.4-1.7 times slower.
# ---------------------------------------------------------------------------

def _skewed_model(height, width, unary, pairwise):
    """``(U, T, M, F, acc, X, bits)`` of :func:`_mf_forward_kernel` on a
    ``height`` x ``width`` grid: the skewed unary ``U[x, q, p]``, tables
    ``T[0, x_i, x_j, q, p]`` of the horizontal edges at their right node and
    ``T[1]`` of the vertical ones at their lower node, room for the
    marginals, and the scratch of a diagonal."""
    K = unary.shape[1]
    shape = (height + width + 3, height + 2)
    U = scratch((K,) + shape, unary.dtype)
    T = scratch((2, K, K) + shape, unary.dtype)
    _skew_model(height, width, unary, pairwise, U, T)
    return (U, T, scratch_full((K,) + shape, 0, unary.dtype), np.empty((K, height), unary.dtype),
            np.empty(height, unary.dtype), np.empty((K, height)), np.empty(height, np.int64))


def _no_grid(dtype):
    """The ``skewed`` argument of :func:`_mf_forward_kernel` off a grid."""
    return (np.empty((0, 0, 0), dtype), np.empty((0, 0, 0, 0, 0), dtype), np.empty((0, 0, 0), dtype),
            np.empty((0, 0), dtype), np.empty(0, dtype), np.empty((0, 0)), np.empty(0, np.int64))


@njit(cache=True, nogil=True)
def _skew_model(H, W, unary, pairwise, U, T):
    """Every entry of ``U`` and ``T`` (:func:`_skewed_model`), zeros off the
    grid's nodes and edges, diagonal by diagonal in memory order: along a
    diagonal the node, its left edge and its upper edge advance by fixed
    strides, so the loops over its nodes carry no tests (about half the
    time of a test per entry: 1.7 against 3.0 ms at 200 x 300, K = 2)."""
    n_h = H * (W - 1)
    K = unary.shape[1]
    zero = U.dtype.type(0)
    Q = U.shape[1]
    for q in range(Q):
        lo = max(1, q - W)  # the nodes of diagonal q: p = lo..hi, (r, c) = (p - 1, q - p - 1)
        hi = min(H, q - 1)
        for x in range(K):
            U[x, q, :] = zero
            for y in range(K):
                T[0, x, y, q, :] = zero
                T[1, x, y, q, :] = zero
        if lo > hi:
            continue
        for x in range(K):
            u = U[x, q, lo:hi + 1]
            for i in range(hi + 1 - lo):
                u[i] = unary[(lo + i) * (W - 1) + q - W - 1, x]
            for y in range(K):
                # left edges (c > 0: all but p = q - 1), up edges (r > 0: all but p = 1)
                left = T[0, x, y, q, lo:min(hi, q - 2) + 1]
                for i in range(left.shape[0]):
                    left[i] = pairwise[(lo + i) * (W - 2) + q - W - 1, x, y]
                first = max(lo, 2)
                up = T[1, x, y, q, first:hi + 1]
                for i in range(up.shape[0]):
                    up[i] = pairwise[n_h + (first + i) * (W - 1) + q - 2 * W - 1, x, y]


@njit(cache=True, nogil=True, inline="always")
def _skew_copy(M, flat, to_flat, reversed_nodes):
    """``M[x, r + c + 2, r + 1]`` to or from ``flat[j, x]``, j = r W + c
    (``n - 1 - j`` with ``reversed_nodes``: a snapshot of the stack)."""
    H = M.shape[2] - 2
    n = flat.shape[0]
    W = n // H
    for r in range(H):
        for c in range(W):
            j = n - 1 - r * W - c if reversed_nodes else r * W + c
            for x in range(M.shape[0]):
                if to_flat:
                    flat[j, x] = M[x, r + c + 2, r + 1]
                else:
                    M[x, r + c + 2, r + 1] = flat[j, x]


@njit(cache=True, nogil=True)
def _load_snapshot(M, snapshot):
    """The skewed marginals from a snapshot of the stack (reversed node order)."""
    _skew_copy(M, snapshot, False, True)


@njit(cache=True, nogil=True, inline="always")
def _add_side1(Tf, M, F, qt, pt, qm, pm, n, k_states):
    """``F[a] += sum over b of Tf[b, a] M[b]`` term by term in the order of b
    (the node is the edge's second end), along ``n`` nodes of a diagonal:
    the tables at ``[qt, pt:]``, the neighbours' marginals at ``[qm, pm:]``.
    Every array is read through 1-D views looped from 0, which vectorise
    (see ``_trw_grid._transpose_plane``)."""
    for b in range(k_states):
        m = M[b, qm, pm:pm + n]
        for a in range(k_states):
            f = F[a, :n]
            tab = Tf[b, a, qt, pt:pt + n]
            for i in range(n):
                f[i] += tab[i] * m[i]


@njit(cache=True, nogil=True, inline="always")
def _add_side0(Tf, M, F, acc, qt, pt, qm, pm, n, k_states):
    """``F[a] += (sum over b of Tf[a, b] M[b])`` (the node is the edge's first end)."""
    zero = M.dtype.type(0)
    total = acc[:n]
    for a in range(k_states):
        for i in range(n):
            total[i] = zero
        for b in range(k_states):
            m = M[b, qm, pm:pm + n]
            tab = Tf[a, b, qt, pt:pt + n]
            for i in range(n):
                total[i] += tab[i] * m[i]
        f = F[a, :n]
        for i in range(n):
            f[i] += total[i]


@njit(cache=True, nogil=True, inline="always")
def _grid_sweep(U, T, M, F, acc, X, bits, k_states):
    """One iteration of :func:`_update_node` over the grid, diagonal by
    diagonal on the skewed arrays (the same operations in the same order for
    each node, but the exps of ``trw._exp_nonpositive``); returns the
    largest |change| of a marginal."""
    zero = M.dtype.type(0)
    one = M.dtype.type(1)
    H = M.shape[2] - 2
    W = M.shape[1] - H - 3
    change = zero
    for s in range(H + W - 1):
        lo = max(0, s - W + 1)
        n = min(H, s + 1) - lo
        q = s + 2
        p = lo + 1  # node (lo + i, s - lo - i) sits at [q, p + i]
        for a in range(k_states):
            f = F[a, :n]
            u = U[a, q, p:p + n]
            for i in range(n):
                f[i] = u[i]
        # the incidences in _update_node's order: left, right, up, down
        _add_side1(T[0], M, F, q, p, q - 1, p, n, k_states)
        _add_side0(T[0], M, F, acc, q + 1, p, q + 1, p, n, k_states)
        _add_side1(T[1], M, F, q, p, q - 1, p - 1, n, k_states)
        _add_side0(T[1], M, F, acc, q + 1, p + 1, q + 1, p + 1, n, k_states)
        if k_states == 2:  # one exp: the larger field's is 1 (see _update_node)
            f0 = F[0, :n]
            f1 = F[1, :n]
            x = X[0, :n]
            for i in range(n):
                x[i] = np.float64(f0[i] - f1[i] if f1[i] > f0[i] else f1[i] - f0[i])
            _exp_nonpositive(x, bits[:n])
            m0 = M[0, q, p:p + n]
            m1 = M[1, q, p:p + n]
            moved = acc[:n]
            for i in range(n):
                v = M.dtype.type(x[i])
                inv = one / (one + v)
                big = f1[i] > f0[i]
                new0 = v * inv if big else one * inv
                new1 = one * inv if big else v * inv
                moved[i] = max(abs(new0 - m0[i]), abs(new1 - m1[i]))
                m0[i] = new0
                m1[i] = new1
            for i in range(n):  # apart, so that the loop above runs in vector instructions
                if moved[i] > change:
                    change = moved[i]
        else:
            top = acc[:n]
            for i in range(n):
                top[i] = F[0, i]
            for a in range(1, k_states):
                f = F[a, :n]
                for i in range(n):
                    if f[i] > top[i]:
                        top[i] = f[i]
            for a in range(k_states):
                f = F[a, :n]
                x = X[a, :n]
                for i in range(n):
                    x[i] = np.float64(f[i] - top[i])
                _exp_nonpositive(x, bits[:n])
            z = acc[:n]  # the maxima are spent
            for i in range(n):
                z[i] = zero
            for a in range(k_states):
                x = X[a, :n]
                for i in range(n):
                    z[i] += M.dtype.type(x[i])
            for i in range(n):
                z[i] = one / z[i]
            for a in range(k_states):
                x = X[a, :n]
                m = M[a, q, p:p + n]
                for i in range(n):
                    new = M.dtype.type(x[i]) * z[i]
                    d = abs(new - m[i])
                    if d > change:
                        change = d
                    m[i] = new
    return change


# The backward kernels below run on the graph with nodes and edges relabelled
# in reverse (node j -> n-1-j, edge e -> E-1-e; see MeanFieldState._reversed):
# Algorithm "Back Mean Field" visits the nodes in the reverse of the forward
# order, and walking the arrays backwards in memory is ~4x slower than
# forwards on the target machine once they leave the cache. In the relabelled
# graph the paper's reverse order j = n-1..0 is simply r = 0..n-1.

@njit(cache=True, nogil=True, inline="always")
def _mf_reverse_sweep(ptr, inc_edge, inc_side, edges, pairwise, mu, gmu,
                      g_unary, g_pairwise, nu, stack_rev, t, restore, k_states):
    """One reverse iteration t of Algorithm "Back Mean Field", step 5.

    All arrays are in the reversed labelling. On entry ``mu`` holds the
    marginals as they were at the end of iteration t and ``gmu`` the adjoints
    dL/dmu of those versions. With ``restore`` the overwritten marginals are
    pulled from ``stack_rev[t]`` (truncated mode); without it they are held
    fixed (fixed-point mode). ``k_states`` as in :func:`_update_node`.
    """
    n = mu.shape[0]
    zero = mu.dtype.type(0)
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
                    acc = zero
                    for a in range(k_states):
                        acc += nu[a] * pairwise[e, a, b]
                    gmu[i, b] += acc
            else:  # edges[e] = (i, j), theta_e[x_i, x_j]
                i = edges[e, 0]
                for b in range(k_states):
                    mib = mu[i, b]
                    acc = zero
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
            gmu[j, a] = zero


@njit(cache=True, nogil=True)
def _mf_reverse_segment(ptr, inc_edge, inc_side, edges, pairwise, mu, gmu,
                        g_unary, g_pairwise, stack_rev, n_sweeps):
    """Step 5 for the ``n_sweeps`` iterations whose starting marginals are
    ``stack_rev[0 .. n_sweeps-1]``, last to first; ``mu`` ends as
    ``stack_rev[0]`` (reversed labelling)."""
    k_states = mu.shape[1]
    nu = np.empty(k_states, dtype=mu.dtype)
    for tt in range(n_sweeps):
        t = n_sweeps - 1 - tt
        if k_states == 2:  # the same body, unrolled for K = 2
            _mf_reverse_sweep(ptr, inc_edge, inc_side, edges, pairwise, mu, gmu,
                              g_unary, g_pairwise, nu, stack_rev, t, True, 2)
        else:
            _mf_reverse_sweep(ptr, inc_edge, inc_side, edges, pairwise, mu, gmu,
                              g_unary, g_pairwise, nu, stack_rev, t, True, k_states)


@njit(cache=True, nogil=True)
def _mf_backward_initialisation(mu, gmu, g_unary):
    """The gradient through the initialisation ``mu^(0)_i = softmax(theta_i)``:
    dL/dtheta_i += backnorm(dL/dmu^(0)_i, mu^(0)_i)."""
    n, k_states = mu.shape
    nu = np.empty(k_states, dtype=mu.dtype)
    for i in range(n):
        backnorm(gmu[i], mu[i], nu)
        for a in range(k_states):
            g_unary[i, a] += nu[a]


@njit(cache=True, nogil=True)
def _mf_backward_fixed_point(ptr, inc_edge, inc_side, edges, pairwise, mu, gmu,
                             g_unary, g_pairwise, tol, max_iter, blowup):
    """Reverse sweeps at the fixed point until max |dL/dmu| < tol (or beyond
    ``blowup``, a divergence).

    Returns (sweeps run, largest remaining adjoint).
    """
    n, k_states = mu.shape
    nu = np.empty(k_states, dtype=mu.dtype)
    no_stack = np.empty((0, 0, 0), dtype=mu.dtype)
    largest = mu.dtype.type(np.inf)
    sweeps = 0
    for s in range(max_iter):
        if k_states == 2:
            _mf_reverse_sweep(ptr, inc_edge, inc_side, edges, pairwise, mu, gmu,
                              g_unary, g_pairwise, nu, no_stack, 0, False, 2)
        else:
            _mf_reverse_sweep(ptr, inc_edge, inc_side, edges, pairwise, mu, gmu,
                              g_unary, g_pairwise, nu, no_stack, 0, False, k_states)
        sweeps = s + 1
        largest = mu.dtype.type(0)
        for i in range(n):
            for a in range(k_states):
                v = abs(gmu[i, a])
                if v > largest:
                    largest = v
        if largest < tol or not largest < blowup:
            break
    return sweeps, largest


@njit(cache=True, nogil=True)
def _fold_pairwise(edges, mu, grad_pairwise_marginals, gmu):
    """Step 3 for clique marginals mu_c = mu_i (x) mu_j:
    dL/dmu_i += G mu_j and dL/dmu_j += G^T mu_i."""
    k_states = mu.shape[1]
    zero = mu.dtype.type(0)
    for e in range(edges.shape[0]):
        i = edges[e, 0]
        j = edges[e, 1]
        for a in range(k_states):
            acc = zero
            mia = mu[i, a]
            for b in range(k_states):
                g = grad_pairwise_marginals[e, a, b]
                acc += g * mu[j, b]
                gmu[j, b] += g * mia
            gmu[i, a] += acc


# ---------------------------------------------------------------------------
# Python API
# ---------------------------------------------------------------------------

#: Fixed-point reverse sweeps have diverged once an adjoint exceeds this
#: (per compute dtype: far from overflow, far above any converging adjoint).
_ADJOINT_BLOWUP = {np.dtype(np.float32): 1e30, np.dtype(np.float64): 1e100}


def _compute_dtype(unary):
    """float32 for float32 ``unary``, float64 otherwise."""
    return np.dtype(np.float32) if np.asarray(unary).dtype == np.float32 else np.dtype(np.float64)


def _other_ends(edges, inc):
    """``inc_node`` of :func:`_update_node`: for each incidence, the other end of its edge."""
    return np.take(edges.ravel(), 2 * inc.edge + 1 - inc.side, out=scratch(inc.edge.shape, np.int64))


def _saves(slots, last=-1):
    """``save_slot`` of :func:`_mf_forward_kernel`: ``slots[t]`` before iteration ``t``, ``last`` after them."""
    return np.append(np.asarray(slots, np.int64), np.int64(last))


def mean_field_forward(edges, unary, pairwise, n_iter=None, tol=1e-6, max_iter=1000,
                       keep_stack=False, checkpoints=None, start=None):
    """Sequential mean field from ``softmax(unary)`` (or from ``start``).

    Parameters
    ----------
    edges : (E, 2) int64
    unary : (n, K) float32 or float64
        The compute dtype: float32 input is computed in float32, anything
        else in float64.
    pairwise : (E, K, K)
        Of the same dtype as ``unary`` (converted to it otherwise).
    n_iter : int or None
        Exactly this many iterations (sweeps j = 0..n-1), or ``None`` to
        iterate until the largest change of a unary marginal in one iteration
        is below ``tol`` or ``max_iter`` iterations were run.
    tol : float
    max_iter : int
    keep_stack : bool
        Keep the per-iteration snapshots needed by
        ``mean_field_backward(mode="truncated")``.
    checkpoints : int >= 1 or None
        With ``keep_stack``: keep only this many snapshots (see
        ``sklearn_margcrf._checkpoints``); the backward pass recomputes the
        others. ``None`` keeps every iteration while that fits
        ``STACK_MEMORY_BUDGET`` and as many as fit otherwise.
        With ``n_iter=None`` and fewer snapshots than iterations, the forward
        pass runs twice (to find the number of iterations, then to keep the
        planned snapshots).
    start : (n, K) array or None
        The marginals to start from (``unary_marginals`` of an earlier pass
        on the same graph); None starts from ``softmax(unary)``.

    Returns
    -------
    MeanFieldState
    """
    return _mean_field_forward(edges, unary, pairwise, n_iter, tol, max_iter, keep_stack,
                               checkpoints, STACK_MEMORY_BUDGET, start)


def _mean_field_forward(edges, unary, pairwise, n_iter, tol, max_iter, keep_stack, checkpoints,
                        budget, start=None):
    """:func:`mean_field_forward` with the stack memory budget as an argument."""
    dtype = _compute_dtype(unary)
    # read-only input copied (trw._writable): one compiled signature per kernel
    edges = _writable(edges, np.int64).reshape(-1, 2)
    unary = _writable(unary, dtype)
    pairwise = _writable(pairwise, dtype)
    n_nodes, n_states = unary.shape
    if pairwise.size == 0:
        pairwise = pairwise.reshape(edges.shape[0], n_states, n_states)
    n_iter = check_n_iter(n_iter)
    tol = check_positive(tol, "tol")
    max_iter = check_n_iter(max_iter, "max_iter", allow_none=False)
    checkpoints = check_checkpoints(checkpoints)
    inc = incidence(n_nodes, edges)
    inc_node = _other_ends(edges, inc)
    # the grid sweep where it is faster: up to 200 bytes per table (K <= 5 in
    # float64, K <= 7 in float32; measured above _skewed_model); its arrays
    # are not built for a pass of no iteration
    on_grid = n_iter != 0 and edges.shape[0] and n_states ** 2 * dtype.itemsize <= 200
    shape = grid_shape(n_nodes, edges) if on_grid else None
    skewed = _no_grid(dtype) if shape is None else _skewed_model(*shape, unary, pairwise)
    snapshot_bytes = n_nodes * n_states * dtype.itemsize

    if start is None:
        initial = scratch((n_nodes, n_states), dtype)
        _softmax_rows(unary, initial)
    else:
        initial = np.array(start, dtype=dtype).reshape(n_nodes, n_states)
    mu = scratch_copy(initial)

    def run(n_sweeps, stop, stack_rev, save_at):
        return _mf_forward_kernel(_mf_label_token(n_states), inc.ptr, inc.edge, inc.side, inc_node, unary, pairwise,
                                  mu, n_sweeps, tol, stop, stack_rev, save_at, skewed)

    no_stack = np.empty((0, n_nodes, n_states), dtype=dtype)
    no_saves = np.empty(0, np.int64)

    def run_planned(n_sweeps):
        """``n_sweeps`` iterations from ``mu``, keeping the snapshots that
        ``checkpoint_plan`` chooses: (stack, plan, done, change)."""
        if n_sweeps == 0:
            return no_stack, None, 0, np.inf
        plan = checkpoint_plan(n_sweeps, checkpoints, snapshot_bytes, budget)
        stack = scratch((plan.n_slots, n_nodes, n_states), dtype)
        return (stack, plan) + run(n_sweeps, False, stack, _saves(plan.forward_slots))

    stack = plan = None
    if not keep_stack:
        done, change = run(max_iter if n_iter is None else n_iter, n_iter is None, no_stack,
                           no_saves)
    elif n_iter is not None:
        stack, plan, done, change = run_planned(n_iter)
    else:
        # Unknown length: run in growing chunks, each with its own snapshots,
        # while every snapshot is to be kept and fits the budget ...
        chunks, done, chunk, change = [], 0, 16, np.inf
        while done < max_iter and checkpoints is None:
            size = min(chunk, max_iter - done)
            if (done + size) * snapshot_bytes > budget:
                break
            buf = np.empty((size, n_nodes, n_states), dtype=dtype)
            ran, change = run(size, True, buf, _saves(np.arange(size)))
            chunks.append(buf[:ran])
            done += ran
            if change < tol:
                break
            chunk *= 2
        if done == max_iter or change < tol:
            stack = np.concatenate(chunks, axis=0) if chunks else no_stack
            plan = checkpoint_plan(done, done, snapshot_bytes) if done else None
        else:
            # ... otherwise find the length first, then keep the planned snapshots.
            del chunks
            ran, change = run(max_iter - done, True, no_stack, no_saves)
            mu[...] = initial
            stack, plan, done, change = run_planned(done + ran)
    converged = bool(change < tol)
    return MeanFieldState(edges, unary, pairwise, inc, mu, initial, done, converged, change,
                          stack, plan, tol, inc_node, skewed)


def _check_grad(grad, shape, dtype, name):
    if grad is None:
        return scratch_full(shape, 0, dtype)
    grad = np.ascontiguousarray(grad, dtype=dtype)
    if grad.shape != shape:
        if grad.size == 0 and int(np.prod(shape)) == 0:
            return np.zeros(shape, dtype=dtype)
        raise ValueError(f"{name} must have shape {shape}, got {grad.shape}")
    return grad


def _reverse_truncated(state, mu_r, gmu_r, g_unary_r, g_pairwise_r):
    """Algorithm "Back Mean Field", step 5 over all ``state.n_iter`` iterations
    and the initialisation, in the order of the state's checkpoint plan,
    recomputing the snapshots it did not keep (reversed labelling, in place)."""
    edges_r, pairwise_r, inc_r = state._reversed()
    buffer, plan = state._stack_rev, state.checkpoint_plan
    if plan is not None and plan.checkpointed:
        if state._buffer_reused:  # a previous backward wrote over snapshots: keep them again
            state._sweeps(scratch_copy(state.initial_marginals), state.n_iter, _saves(plan.forward_slots))
        state._buffer_reused = True
        work = scratch(state.initial_marginals.shape, buffer.dtype)  # the work slot's marginals, in order
    for step in plan.steps if plan is not None else ():
        if step[0] == "advance":
            _, load, n_sweeps, store = step
            state._advance(work, load, n_sweeps, _saves(np.full(n_sweeps, -1), plan.work_slot if store < 0 else store))
        else:
            slots = step[1]
            # runs of consecutive slots, last first, in one call each
            for run in np.split(slots, np.flatnonzero(np.diff(slots) != -1) + 1):
                _mf_reverse_segment(inc_r.ptr, inc_r.edge, inc_r.side, edges_r, pairwise_r, mu_r, gmu_r,
                                    g_unary_r, g_pairwise_r, buffer[run[-1]:run[0] + 1], run.shape[0])
    _mf_backward_initialisation(mu_r, gmu_r, g_unary_r)


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
        ``n_iter == 0``). With checkpoints the missing snapshots are
        recomputed into the state's buffer (a second
        backward on the same state first re-runs the forward pass to restore
        the planned snapshots; so two threads must not run truncated
        backward passes of one checkpointed state at the same time). ``"fixed_point"``: gradient of the loss at
        the converged marginals (implicit differentiation by repeated reverse
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
    grad_unary : (n, K)
    grad_pairwise : (E, K, K)
        In the dtype of ``state.unary`` (the incoming gradients are converted
        to it).
    """
    edges = state.edges
    n_nodes, n_states = state.unary_marginals.shape
    n_edges = edges.shape[0]
    dtype = state.unary_marginals.dtype
    gmu = scratch_copy(_check_grad(grad_unary_marginals, (n_nodes, n_states), dtype, "grad_unary_marginals"))
    gpm = _check_grad(grad_pairwise_marginals, (n_edges, n_states, n_states), dtype,
                      "grad_pairwise_marginals")
    if mode not in ("truncated", "fixed_point"):
        raise ValueError(f"mode must be 'truncated' or 'fixed_point', got {mode!r}")
    if mode == "truncated" and state._stack_rev is None and state.n_iter > 0:
        raise ValueError(
            "mode='truncated' needs the stack of overwritten marginals: run "
            "mean_field_forward(..., keep_stack=True)")
    # Step 3: dL/dmu of the final marginals, clique terms folded into unary adjoints.
    if n_edges:
        _fold_pairwise(edges, state.unary_marginals, gpm, gmu)
    # Work in the reversed labelling (see the comment above _mf_reverse_sweep).
    mu_r = scratch_copy(state.unary_marginals[::-1])
    gmu_r = scratch_copy(gmu[::-1])
    # Step 4.
    g_unary_r = scratch_full((n_nodes, n_states), 0, dtype)
    g_pairwise_r = scratch_full((n_edges, n_states, n_states), 0, dtype)

    if mode == "truncated":
        _reverse_truncated(state, mu_r, gmu_r, g_unary_r, g_pairwise_r)
    else:
        tol = check_positive(tol, "tol")
        max_iter = check_n_iter(max_iter, "max_iter", allow_none=False)
        if not state.converged:
            warn_at_caller(
                f"mean_field_backward(mode='fixed_point') at marginals that are not converged "
                f"(last change {state.last_change:.3g} >= tol {state.tol:.3g} after "
                f"{state.n_iter} iterations); the gradient assumes a fixed point",
                RuntimeWarning)
        edges_r, pairwise_r, inc_r = state._reversed()
        sweeps, largest = _mf_backward_fixed_point(inc_r.ptr, inc_r.edge, inc_r.side, edges_r,
                                                   pairwise_r, mu_r, gmu_r, g_unary_r,
                                                   g_pairwise_r, tol, max_iter,
                                                   _ADJOINT_BLOWUP[dtype])
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
    return scratch_copy(g_unary_r[::-1]), scratch_copy(g_pairwise_r[::-1])
