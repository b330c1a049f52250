"""Tree-reweighted belief propagation (TRW) and back TRW.

Loopy belief propagation is the special case ``rho = 1`` on every edge.

Messages and marginals (paper, Eq. "TRW-msgs" and Theorem "TRW Updates")
------------------------------------------------------------------------
For edge ``c = (i, j)`` the message into ``i`` is ::

    m_c(x_i) ∝ sum_{x_j} exp(theta_c(x_i, x_j) / rho_c) A_cj(x_j),
    A_cj(x_j) = exp(theta_j(x_j)) prod_{d ∋ j} m_d(x_j)^rho_d / m_c(x_j),

(``A_cj`` is the "cavity" of ``j`` with respect to ``c``) and the marginals are ::

    mu_c(x_i, x_j) ∝ exp(theta_c / rho_c) A_ci(x_i) A_cj(x_j),
    mu_i(x_i)      ∝ exp(theta_i(x_i)) prod_{d ∋ i} m_d(x_i)^rho_d.

``TRWState.messages[e, s]`` is the message from edge ``e`` into node
``edges[e, s]``, normalised to sum to one.

Schedule
--------
Messages start uniform (``1 / K``), or from the messages of an earlier pass
on the same graph (``start``: warm starts of inference run to ``tol``). One
iteration updates every message exactly once, in this fixed order:

1. forward sweep, ``e = 0, 1, ..., E - 1``: update the message into
   ``edges[e, 1]`` (sent by ``edges[e, 0]``);
2. backward sweep, ``e = E - 1, ..., 1, 0``: update the message into
   ``edges[e, 0]`` (sent by ``edges[e, 1]``).

Updates are sequential (Gauss-Seidel: each sees every message updated before
it). On the row-major ordering of :func:`sklearn_margcrf.grid_edges`
(horizontal edges row by row, then vertical edges) the forward sweep passes
information rightwards along every row and then downwards along every column,
and the backward sweep upwards and then leftwards, like the monotone-chain
schedules of Meltzer et al.

This order *defines* the schedule; the K = 2 forward sweep executes it in
another one (``_interleave``). Along an image row each update depends on
the one just before it, so the rows' updates are alternated pairwise (the
rows are independent), which lets the processor overlap them. Every two
updates that touch a common message keep their order, so every update
computes the same values and the results are bitwise those of the order
above.

``n_iter = k`` runs exactly ``k`` iterations (``k = 0`` gives the marginals of
uniform messages: ``softmax(unary)`` and the normalised
``exp(theta_c / rho_c + theta_i + theta_j)``); ``n_iter = None`` iterates
until the largest absolute change of any unary marginal over one iteration is
below ``tol``, or ``max_iter`` iterations were run. (The rule looks at unary
marginals only: with saturated marginals, i.e. huge ``|theta|``, it can stop
while messages still move.)

Numerical stability
-------------------
- The potentials are tabulated once per call with a max shift:
  ``exp((theta_c - max theta_c) / rho_c)`` and ``exp(theta_v - max theta_v)``,
  so every table entry lies in ``[0, 1]`` and no ``exp`` is evaluated during
  message passing. The shifts are constants that cancel in every
  normalisation, so they change neither the result nor its gradient.
- Messages are sum-normalised after every update and floored at
  ``1e-300`` (float32: ``1e-37``): never zero, so every division by a message is
  finite. Besides the messages we store their powers ``m ** rho`` (``sqrt``
  for ``rho = 0.5``, nothing for ``rho = 1``, ``pow`` only for other ``rho``)
  and their inverses, so an update costs products, sums and a few divisions.
- If a normalising sum leaves ``[1e-200, 1e300]`` (underflow or overflow; only
  for huge ``|theta|``), that one message (or marginal) is recomputed in the
  log domain from the raw ``theta`` and the logs of the messages. This rare
  fallback costs nothing when unused (``TRWState.n_fallback`` counts its uses).
  The backward pass applies the same test and the same fallback, so the
  gradient is the exact gradient of what the forward pass computes.
- A message entry at the floor is a constant of the forward pass, so the
  backward pass accumulates no adjoint for it (exact for the floored forward,
  and it keeps the adjoints finite).
- The adjoint messages are kept *scaled*: ``Madj = m dL/dm`` (the loss's
  sensitivity to ``log m``), whose terms ``rho_d h`` (step 8(e)) stay in the
  range of the losses' gradients however small ``m`` is, whereas ``dL/dm``
  alone grows like ``1 / m`` (beyond float32's range near its floor). This
  also spares step 8(e) its divisions. Step 8(b) forms
  ``nu / m = g - g . m = Madj / m - sum Madj`` (``backnorm_ratio_of_scaled``)
  and step 8(c) is evaluated as ``((A tab) / Z) * (nu / m)``:
  ``(A tab) / Z <= m`` keeps it within ``|nu|``, whereas ``nu / m / Z`` alone
  overflows when ``m`` and ``Z`` are both tiny. Where ``nu / m`` itself would
  leave the range (the sum of its magnitudes above ``1e300``, float32
  ``1e30``), the update takes the rare path (``_rare_adjoint_terms``):
  ``val = ((s / Z) / m) Madj - (s / Z) sum Madj``, every factor at most
  ``|Madj|``, with ``s / Z`` from the log domain.
- Limitation: a message entry smaller than ``1e-300`` cannot be represented,
  so when parameter differences exceed roughly ``690 rho`` the floor can shift
  the marginals away from the exact TRW fixed point (they stay finite and
  normalised; :func:`floored_message_entries` counts the final entries at the
  floor, and inference through :func:`sklearn_margcrf.infer` or the gradients
  warns when there are any).

Precision
---------
The kernels compute in the dtype of ``unary`` and ``pairwise``: float64, or
float32 when both are float32 (half the memory and memory traffic: tables,
messages, snapshots, marginals and gradients are all float32). In float32 the
floor is ``1e-37`` and the log-domain range ``[1e-25, 1e30]``, so messages are
exact up to parameter differences of about ``85 rho``; measured on random
grids, marginals and truncated gradients agree with float64 to 1e-5 for
``|theta| <= 20`` (``rho >= 0.5``), and stay finite and normalised (but drift
from float64) beyond. The adjoint messages are of the compute dtype too
(scaled, see above).

Variants
--------
Every kernel has one body. Its first argument ``kt`` is a tuple whose length
is K (``(0,) * K``, or ``()`` for a generic build), so numba compiles one
version per K, in which the label loops have constant trip counts that the
compiler unrolls and vectorises; the limits of the compute dtype arrive as a
named tuple ``lim``. Both are chosen in Python (``_label_token``, ``_limits``).

Back TRW (paper, Algorithm "Back TRW" and Appendix C)
------------------------------------------------------
``trw_backward(mode="truncated")`` differentiates exactly the ``n_iter``
iterations of a forward pass run with ``keep_stack=True``. The paper pushes
every overwritten message on a stack; since each message is overwritten
exactly once per iteration we keep one snapshot of all messages per iteration,
``stack[t] = messages before iteration t`` (``n_iter * 2E * K`` floats, twice
that when ``rho`` is neither all 1 nor all 0.5, where the powers ``m ** rho``
are kept too so that the reverse pass needs no ``pow``). ``_reverse_sweep``
follows step 8 of the Algorithm and ``_backward_start`` steps 6 and 7;
comments give the step numbers.

``trw_backward(mode="fixed_point")`` is the paper's "back-propagation" (Eaton
and Ghahramani's back BP generalised to TRW): the messages are held at their
converged values and reverse sweeps (step 8 without restoring messages) are
repeated, accumulating the parameter adjoints, until the largest adjoint
message is below ``tol``. At a fixed point every intermediate state of an
iteration equals the fixed point, so each reverse sweep is the exact
vector-Jacobian product of one iteration, and the sum over sweeps is the
Neumann series of the implicit-function gradient.

Implementation notes
--------------------
Only products, sums, divisions and (``rho = 0.5``) square roots occur per
message update; no ``exp``/``log``/``pow`` unless the fallback runs or ``rho``
is general. The product over the sender's messages runs over its slots
backwards, which on grid orderings multiplies the most recently updated
message last (a shorter dependency chain between consecutive updates).
Messages are stored internally in "slot" order: slot ``k`` of the incidence
structure (``sklearn_margcrf._graph.incidence``, node by node) holds the
message from edge ``incidence.edge[k]`` into its node, so the messages into a
node are contiguous. The schedule is tabulated once per call (for each update:
target slot, reverse slot, the sender's slot range and the sender), together
with the potential tables, one per edge (the forward sweep reads edge ``c``'s
table as it is stored, the backward sweep transposed: half the tables' memory
of one per update). Every kernel allocates its scratch space once, outside
the per-message loop. The forward sweep runs in interleaved order for K = 2
(through an index array); with more labels an update does enough work for the
processor to overlap consecutive ones by itself.

On the edges of :func:`sklearn_margcrf.grid_edges`, a fixed number of
iterations can run on the line kernels of ``sklearn_margcrf._trw_grid``
(the image's lines of independent updates as vector loops, messages in
per-direction planes): bitwise the same values, chosen where they measured
faster (``_use_grid_kernels``: K = 2 and K >= 8; for forward + backward on
200 x 300, K = 2: 1.2-1.3x in float64 and 1.4-1.8x in float32, K = 8:
1.3x in float64, 1.4x in float32). Without planes of inverses they also
keep less in memory. With two labels and rho 1/2 or 1 (loopy BP) they keep
one number per message instead (``sklearn_margcrf._trw_grid_binary``: the
ratio of its two entries, to the power rho), which needs one division and
at most one square root per update and half the memory traffic: the same
iterations up to rounding rather than bitwise, and about twice as fast as
the line kernels for forward + backward (``docs/scaling.rst``).

Checkpointed reverse mode: with ``checkpoints`` the forward pass keeps only
some snapshots, and ``trw_backward`` recomputes the others from them
(binomial checkpointing, ``sklearn_margcrf._checkpoints``), in the same order
and with the same arithmetic, so the gradient is bitwise that of the full stack.
"""

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from ._backnorm import backnorm, backnorm_ratio_of_scaled
from ._checkpoints import check_checkpoints, checkpoint_plan, incomplete_stack
from ._graph import incidence, model_dtype
from ._warnings import warn_at_caller
from ._workspace import scratch, scratch_copy, scratch_full
from .exceptions import BackpropDivergenceError

__all__ = ["TRWState", "floored_message_entries", "trw_forward", "trw_backward"]

__all__ = ["TRWState", "floored_message_entries", "trw_forward", "trw_backward"]

# Numerical limits per compute dtype (see "Numerical stability"): the message
# floor, the range of normalising sums outside which the log-domain path runs,
# the inverse of a floored entry, and 0, 1/2, 1 of the dtype. float32 keeps the
# same margins in its narrower range: 1 / floor and K / floor stay finite for
# K <= 30.
_LIMIT_VALUES = {
    np.dtype(np.float64): (1e-300, 1e-200, 1e300),
    np.dtype(np.float32): (1e-37, 1e-25, 1e30),
}


def _limits(dtype):
    """(floor, tiny, huge, 1 / floor, 0, 1/2, 1) as scalars of ``dtype``."""
    t = np.dtype(dtype).type
    floor, tiny, huge = (t(v) for v in _LIMIT_VALUES[np.dtype(dtype)])
    return floor, tiny, huge, t(1) / floor, t(0), t(0.5), t(1)


def _limits_of(array):
    """:func:`_limits` of ``array``'s dtype, inside the kernels."""
    return _limits(array.dtype)


@overload(_limits_of, inline="always")
def _limits_of_compiled(array):
    # Compile-time constants: passed in as arguments, the limits measured up to
    # 1.5x slower in the K = 2 sweep.
    values = _limits(np.float32 if array.dtype == types.float32 else np.float64)
    floor, tiny, huge, inv_floor, zero, half, one = values
    return lambda array: (floor, tiny, huge, inv_floor, zero, half, one)


_ADJOINT_BLOWUP = 1e100  # fixed-point reverse sweeps have diverged beyond this


#: Smallest message entry per compute dtype, as quoted to users.
MESSAGE_FLOOR = {dtype: values[0] for dtype, values in _LIMIT_VALUES.items()}


def floor_clause(dtype):
    """What messages at the floor of ``dtype`` mean, in the words of every
    floor warning (``infer``, ``loss_and_grad``, a fit's): the floor, and the
    parameter differences (times rho) whose messages reach it."""
    dtype = np.dtype(dtype)
    floor = MESSAGE_FLOOR[dtype]
    return (f"the floor {floor:g} of {dtype}: some parameters differ by more than about {int(-np.log(floor))} * rho, "
            "beyond what the messages can represent")


# rho classes, chosen in Python, branched on in the kernels
_RHO_GENERAL = 0  # m ** rho
_RHO_ONE = 1  # m (loopy BP): the power array *is* the message array
_RHO_HALF = 2  # sqrt(m)

# The kernels are compiled for a constant number of labels K up to this many:
# the label loops then have constant trip counts, which the compiler unrolls
# and vectorises (K = 8 forward sweep: 0.33 instead of 0.40 s for 20
# iterations on a 200 x 300 grid; back TRW 1.5x faster for K = 3 to 5, and for
# K = 8 float64 0.77-0.82 against 0.91-0.93 s, once the pairwise adjoints are
# accumulated in loops with constant strides). Larger K run one generic
# compilation.
_MAX_SPECIALISED_K = 8

# Merge this many independent chains in the K = 2 forward sweep (see
# ``_interleave``; 232 x 315 grid, 20 iterations: 102-106, 115-118 and
# 128-129 ms for 2, 3 and 4 chains).
_INTERLEAVE_WIDTH = 2


def _use_grid_kernels(n_states, dtype):
    """Whether a fixed number of iterations on an image grid runs the line
    kernels of ``sklearn_margcrf._trw_grid`` by default (same values; for two
    labels with rho 1/2 or 1, the one-number messages of
    ``sklearn_margcrf._trw_grid_binary``, the same up to rounding; the
    figures below are of the line kernels). Measured (200 x 300, 20
    iterations, rho = 1/2, forward + backward, one thread, minimum CPU time
    per gradient over repeated runs): K = 2 float64
    0.21-0.23 s against 0.26-0.28 s with the slot kernels, float32 0.13-0.16
    against 0.22-0.23 s. Since their cavity loops run as vector code (the
    other family's messages gathered first), in-process alternating runs on
    a 2-core AMD EPYC (median ratio of 3-5 pairs, grid / slot): K = 3 float64
    1.03, K = 4 0.92, K = 8 0.79 (float32 0.70), K = 12 0.64; peak memory at
    K = 8 618 against 643 MB (float32 321 against 336). Each new (K, dtype,
    rho class) costs about half a minute of compilation once: only where
    the gain is clear."""
    return n_states == 2 or n_states >= 8


def _label_token(n_states, specialise=True):
    """The kernels' first argument: a tuple whose *length* is K (its type, so
    numba compiles one specialisation per K) or empty for the generic build."""
    return (0,) * n_states if specialise and n_states <= _MAX_SPECIALISED_K else ()


@njit(cache=True, nogil=True, inline="always")
def _n_states(kt, eu):
    """K: a compile-time constant for a specialised build, else eu's width."""
    return len(kt) if len(kt) > 0 else eu.shape[1]


@njit(cache=True, nogil=True, inline="always")
def _live(value, message, floor, zero):
    """``value`` unless the message entry ``message`` sits at the floor. A
    floored entry is a constant of the forward pass, so no adjoint is
    accumulated for it (this keeps the backward pass finite and exact for the
    floored forward: the adjoint of a floored entry is zero when its update
    is reversed, step 8(b))."""
    return value if message > floor else zero


@njit(cache=True, nogil=True, inline="always")
def _slot_rho(rho_mode, rho_slot, k, half, one):
    """``rho_slot[k]``, as a constant for the uniform classes: that spares the
    reverse sweeps one memory stream (3-5% of a K = 2 backward pass)."""
    if rho_mode == _RHO_HALF:
        return half
    if rho_mode == _RHO_ONE:
        return one
    return rho_slot[k]


# ---------------------------------------------------------------------------
# setup: tables
# ---------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _shifted_exp_unary(unary, eu):
    """``eu[v, x] = exp(theta_v(x) - max theta_v)``."""
    n, K = unary.shape
    for i in range(n):
        top = unary[i, 0]
        for x in range(1, K):
            if unary[i, x] > top:
                top = unary[i, x]
        for x in range(K):
            eu[i, x] = math.exp(unary[i, x] - top)


@njit(cache=True, nogil=True, inline="always")
def _pairwise_top(pairwise, c):
    """max theta_c, the shift of edge ``c``'s table."""
    K = pairwise.shape[1]
    top = pairwise[c, 0, 0]
    for a in range(K):
        for b in range(K):
            if pairwise[c, a, b] > top:
                top = pairwise[c, a, b]
    return top


# exp of a block of values <= 0 in float64, in three loops the compiler
# vectorises (libm's exp is a call per entry: 40 ms for the 7.7 M entries of
# the tables at 200 x 300, K = 8, against about 5 ms here). Cody-Waite
# reduction ``x = k ln 2 + r``, ``|r| <= ln(2) / 2``, the Taylor polynomial of
# degree 13 (truncation below 1e-17) and ``2 ** k`` built in the exponent bits.
_EXP_SHIFTER = 6755399441055744.0  # 1.5 * 2 ** 52: x + it rounds x to an integer
_EXP_SHIFTER_BITS = 0x4338000000000000  # its bits: the integer sits in the low ones
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2 in two parts: k * _LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10
_EXP_LOW = -708.0  # below this, 0 (exp(-708) ~ 3e-308: the normal range ends)
_TABLE_BLOCK = 16384  # entries per block: the block and its bits stay in L2


@njit(cache=True, nogil=True, error_model="numpy")
def _exp_nonpositive(x, bits):
    """``x[:] = exp(x)`` for float64 ``x <= 0`` (0 below ``_EXP_LOW``), within
    about an ulp of libm, the same value wherever an entry sits (no
    contraction into fused multiply-adds); ``bits``: int64 scratch as long."""
    n = x.shape[0]
    scale = bits.view(np.float64)
    for i in range(n):
        v = max(x[i], _EXP_LOW)
        t = v * _LOG2E + _EXP_SHIFTER
        k = t - _EXP_SHIFTER
        r = (v - k * _LN2_HI) - k * _LN2_LO
        p = 1.0 / 6227020800.0
        p = p * r + 1.0 / 479001600.0
        p = p * r + 1.0 / 39916800.0
        p = p * r + 1.0 / 3628800.0
        p = p * r + 1.0 / 362880.0
        p = p * r + 1.0 / 40320.0
        p = p * r + 1.0 / 5040.0
        p = p * r + 1.0 / 720.0
        p = p * r + 1.0 / 120.0
        p = p * r + 1.0 / 24.0
        p = p * r + 1.0 / 6.0
        p = p * r + 0.5
        p = p * r + 1.0
        p = p * r + 1.0
        scale[i] = t
        x[i] = p if x[i] >= _EXP_LOW else 0.0
    for i in range(n):  # 2 ** k from the integer k in t's low bits
        bits[i] = (bits[i] - _EXP_SHIFTER_BITS + 1023) << 52
    for i in range(n):
        x[i] *= scale[i]


@njit(cache=True, nogil=True, error_model="numpy")
def _table_block(kt, pairwise, rho, first, stride, n, block, bits):
    """``block[j K^2 + x_i K + x_j] = exp((theta_c - max theta_c) / rho_c)``
    in float64 for the ``n`` edges ``c = first + j stride``: the tables of
    :func:`_build_tables` and of the grid kernels (one computation, the same
    values)."""
    K = _n_states(kt, pairwise[0])
    KK = K * K
    for j in range(n):
        c = first + j * stride
        top = _pairwise_top(pairwise, c)
        inv_rho = 1.0 / rho[c]
        for a in range(K):
            for b in range(K):
                block[j * KK + a * K + b] = (pairwise[c, a, b] - top) * inv_rho
    _exp_nonpositive(block[:n * KK], bits[:n * KK])


def table_blocks(K):
    """``(edges per block, block, bits)``: the scratch of :func:`_table_block`
    (from the workspace: 128 KiB each, fresh pages per call under Dask's
    malloc setting otherwise)."""
    per_block = max(1, _TABLE_BLOCK // (K * K))
    return per_block, scratch(per_block * K * K, np.float64), scratch(per_block * K * K, np.int64)


@njit(cache=True, nogil=True)
def _build_tables(kt, unary, pairwise, rho, eu, tabs, rsum, per_block, block, bits):
    """Max-shifted exponential tables.

    ``eu[v, x] = exp(theta_v(x) - max theta_v)``, ``tabs[c, x_i, x_j] =
    exp((theta_c - max theta_c) / rho_c)`` (once per edge: the backward
    sweep's step ``2E-1-c``, from ``j`` into ``i``, reads it transposed), and
    for schedule step ``st`` (forward sweep: ``st = c``, from ``i`` into ``j``;
    backward sweep: ``st = 2E-1-c``) ``rsum[st, x_u] = sum_{x_v} tab(x_u,
    x_v)`` over the states of the receiver ``v`` (row sums of ``tabs[c]``,
    column sums for the backward sweep), in the order of ``x_v``.
    ``per_block``, ``block``, ``bits``: from :func:`table_blocks`.
    """
    K = _n_states(kt, unary)
    E = pairwise.shape[0]
    _shifted_exp_unary(unary, eu)
    for c0 in range(0, E, per_block):
        c1 = min(c0 + per_block, E)
        _table_block(kt, pairwise, rho, c0, 1, c1 - c0, block, bits)
        for c in range(c0, c1):
            o = (c - c0) * K * K
            for a in range(K):
                for b in range(K):
                    tabs[c, a, b] = block[o + a * K + b]
            back = 2 * E - 1 - c
            for a in range(K):
                row = tabs[c, a, 0]
                column = tabs[c, 0, a]
                for b in range(1, K):
                    row += tabs[c, a, b]
                    column += tabs[c, b, a]
                rsum[c, a] = row
                rsum[back, a] = column


# ---------------------------------------------------------------------------
# rare paths: log-domain recomputation (never inlined into the hot loops)
# ---------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _log_cavity(u, r, lo, hi, unary, rho_slot, M, out):
    """``out[x] = log A(x) = theta_u(x) + sum_{k in slots(u)} rho_k log m_k(x) - log m_r(x)``."""
    K = out.shape[0]
    for x in range(K):
        out[x] = unary[u, x] - math.log(M[r, x])
    for k in range(lo, hi):
        rk = rho_slot[k]
        for x in range(K):
            out[x] += rk * math.log(M[k, x])


@njit(cache=True, nogil=True)
def _log_joint(st, sched, unary, pairwise, slot_edge, slot_side, rho_slot, rho_sched, M, cav, q):
    """Normalised ``q[x_u, x_v] = s(x_c) / sum s`` of schedule step ``st``,
    computed in the log domain from the raw parameters."""
    t = sched[st, 0]
    r = sched[st, 1]
    u = sched[st, 4]
    c = slot_edge[t]
    s = slot_side[t]
    _log_cavity(u, r, sched[st, 2], sched[st, 3], unary, rho_slot, M, cav)
    _log_joint_of_cavity(c, s, rho_sched[st], pairwise, cav, q)


@njit(cache=True, nogil=True)
def _log_joint_of_cavity(c, s, rho_c, pairwise, cav, q):
    """The rest of :func:`_log_joint`, from the log cavity ``cav`` of the
    sender (``s``: the receiver's side of edge ``c``)."""
    K = cav.shape[0]
    inv_rho = 1.0 / rho_c
    top = -np.inf
    for xu in range(K):
        for xv in range(K):
            if s == 1:
                v = pairwise[c, xu, xv] * inv_rho + cav[xu]
            else:
                v = pairwise[c, xv, xu] * inv_rho + cav[xu]
            q[xu, xv] = v
            if v > top:
                top = v
    total = 0.0
    for xu in range(K):
        for xv in range(K):
            q[xu, xv] = math.exp(q[xu, xv] - top)
            total += q[xu, xv]
    for xu in range(K):
        for xv in range(K):
            q[xu, xv] /= total


@njit(cache=True, nogil=True, inline="always")
def _message_entry(m, rho_mode, rho, floor, one):
    """A new message entry ``m``, floored, with its inverse and its power ``m ** rho``."""
    if m < floor:
        m = floor
    if rho_mode == _RHO_HALF:
        power = math.sqrt(m)
    elif rho_mode == _RHO_GENERAL:
        power = m ** rho
    else:
        power = m
    return m, one / m, power


@njit(cache=True, nogil=True, inline="always")
def _store_message_entry(M, MP, IM, t, x, m, rho_mode, rho, floor, one):
    """Write message entry ``m`` (floored), its inverse and its power ``m ** rho``."""
    m, inverse, power = _message_entry(m, rho_mode, rho, floor, one)
    M[t, x] = m
    IM[t, x] = inverse
    if rho_mode != _RHO_ONE:  # _RHO_ONE: MP is M
        MP[t, x] = power


@njit(cache=True, nogil=True)
def _log_message(st, sched, unary, pairwise, slot_edge, slot_side, rho_slot, rho_sched, rho_mode, M, MP, IM, cav, q):
    """Log-domain version of the message update of step ``st`` (fallback)."""
    K = cav.shape[0]
    floor, _, _, _, _, _, one = _limits_of(M)
    t = sched[st, 0]
    _log_joint(st, sched, unary, pairwise, slot_edge, slot_side, rho_slot, rho_sched, M, cav, q)
    for xv in range(K):
        m = q[0, xv]
        for xu in range(1, K):
            m += q[xu, xv]
        _store_message_entry(M, MP, IM, t, xv, m, rho_mode, rho_sched[st], floor, one)


# ---------------------------------------------------------------------------
# marginals (Theorem "TRW Updates"; Algorithm "Back TRW" steps 3 and 4)
# ---------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _unary_marginals(kt, ptr, eu, unary, rho_slot, M, MP, mu_u):
    """mu_i ∝ exp(theta_i) prod_{d∋i} m_d^rho_d. Returns the number of fallbacks."""
    n = mu_u.shape[0]
    K = _n_states(kt, eu)
    _, tiny, huge, _, zero, _, one = _limits_of(eu)
    n_fallback = 0
    for i in range(n):
        for x in range(K):
            mu_u[i, x] = eu[i, x]
        for k in range(ptr[i], ptr[i + 1]):
            for x in range(K):
                mu_u[i, x] *= MP[k, x]
        total = zero
        for x in range(K):
            total += mu_u[i, x]
        if total > tiny and total < huge:
            inv = one / total
            for x in range(K):
                mu_u[i, x] *= inv
            continue
        n_fallback += 1
        for x in range(K):
            mu_u[i, x] = unary[i, x]
        for k in range(ptr[i], ptr[i + 1]):
            for x in range(K):
                mu_u[i, x] += rho_slot[k] * math.log(M[k, x])
        top = mu_u[i, 0]
        for x in range(1, K):
            if mu_u[i, x] > top:
                top = mu_u[i, x]
        total = zero
        for x in range(K):
            mu_u[i, x] = math.exp(mu_u[i, x] - top)
            total += mu_u[i, x]
        for x in range(K):
            mu_u[i, x] /= total
    return n_fallback


@njit(cache=True, nogil=True)
def _pairwise_marginals(edges, ptr, slot_of, tabs, eu, unary, pairwise, rho, rho_slot, M, MP, IM, mu_p):
    """mu_c ∝ exp(theta_c / rho_c) A_ci A_cj, ``mu_p`` (E, K*K) row-major in (x_i, x_j)."""
    E = edges.shape[0]
    K = eu.shape[1]
    _, tiny, huge, _, zero, _, one = _limits_of(eu)
    ai = np.empty(K, eu.dtype)
    aj = np.empty(K, eu.dtype)
    n_fallback = 0
    for c in range(E):
        i = edges[c, 0]
        j = edges[c, 1]
        a = slot_of[c, 0]  # message into i
        b = slot_of[c, 1]  # message into j
        for x in range(K):
            ai[x] = eu[i, x]
            aj[x] = eu[j, x]
        for k in range(ptr[i], ptr[i + 1]):
            for x in range(K):
                ai[x] *= MP[k, x]
        for k in range(ptr[j], ptr[j + 1]):
            for x in range(K):
                aj[x] *= MP[k, x]
        for x in range(K):
            ai[x] *= IM[a, x]
            aj[x] *= IM[b, x]
        total = zero
        for xi in range(K):
            for xj in range(K):
                v = tabs[c, xi, xj] * ai[xi] * aj[xj]  # forward-sweep table = (x_i, x_j) layout
                mu_p[c, xi * K + xj] = v
                total += v
        if total > tiny and total < huge:
            inv = one / total
            for k in range(K * K):
                mu_p[c, k] *= inv
            continue
        n_fallback += 1
        _log_cavity(i, a, ptr[i], ptr[i + 1], unary, rho_slot, M, ai)
        _log_cavity(j, b, ptr[j], ptr[j + 1], unary, rho_slot, M, aj)
        inv_rho = 1.0 / rho[c]
        top = -np.inf
        for xi in range(K):
            for xj in range(K):
                v = pairwise[c, xi, xj] * inv_rho + ai[xi] + aj[xj]
                mu_p[c, xi * K + xj] = v
                if v > top:
                    top = v
        total = zero
        for k in range(K * K):
            mu_p[c, k] = math.exp(mu_p[c, k] - top)
            total += mu_p[c, k]
        for k in range(K * K):
            mu_p[c, k] /= total
    return n_fallback


@njit(cache=True, nogil=True)
def _max_abs_diff(a, b):
    n, K = a.shape
    worst = 0.0
    for i in range(n):
        for x in range(K):
            d = abs(a[i, x] - b[i, x])
            if d > worst:
                worst = d
    return worst


# ---------------------------------------------------------------------------
# forward: one iteration (Algorithm "Back TRW" step 2, Eq. TRW-msgs)
# ---------------------------------------------------------------------------
# Schedule step st: sched[st] = (t, r, lo, hi, u): t = slot of the message
# being updated (edge c into v), r = slot of the reverse message (edge c into
# the sender u), lo:hi = slots of the messages into u.
#   A(x_u)  = eu[u] * prod_{k in lo:hi} MP[k] * IM[r]        (cavity)
#   m0(x_v) = sum_{x_u} tab(x_u, x_v) A(x_u)   (tab: tabs[c] or its transpose)
#   M[t]    = max(m0 / sum m0, floor),  MP[t] = M[t] ** rho_c,  IM[t] = 1 / M[t]


@njit(cache=True, nogil=True, inline="always")
def _propagate(K, st, n_steps, cav, tabs, out):
    """``out[x_v] = sum_{x_u} tab(x_u, x_v) cav[x_u]`` for schedule step
    ``st``, summed in the order of ``x_u``: the forward sweep's table is
    ``tabs[st]``, the backward sweep's ``tabs[n_steps-1-st]`` transposed."""
    if st < n_steps // 2:
        for xv in range(K):
            out[xv] = cav[0] * tabs[st, 0, xv]
        for xu in range(1, K):
            a = cav[xu]
            for xv in range(K):
                out[xv] += a * tabs[st, xu, xv]
    else:
        c = n_steps - 1 - st
        for xv in range(K):
            acc = cav[0] * tabs[c, xv, 0]
            for xu in range(1, K):
                acc += cav[xu] * tabs[c, xv, xu]
            out[xv] = acc


@njit(cache=True, nogil=True)
def _sweep(kt, order, sched, tabs, eu, rho_sched, rho_mode, M, MP, IM, unary, pairwise, slot_edge, slot_side,
           rho_slot, cav, out, q):
    """One TRW iteration, its steps in the order ``order`` (see
    ``_interleave``); ``cav``, ``out`` (K,) and ``q`` (K, K) are scratch.
    Returns the number of log-domain fallbacks."""
    K = _n_states(kt, eu)
    floor, tiny, huge, _, _, _, one = _limits_of(eu)
    n_fallback = 0
    for p in range(order.shape[0]):
        st = order[p]
        t = sched[st, 0]
        r = sched[st, 1]
        u = sched[st, 4]
        # cavity; the product runs over the slots backwards, which puts the
        # most recently updated message last on grid-like orderings (shorter
        # dependency chain); the reverse sweep uses the same order
        for x in range(K):
            cav[x] = eu[u, x] * IM[r, x]
        for k in range(sched[st, 3] - 1, sched[st, 2] - 1, -1):
            for x in range(K):
                cav[x] *= MP[k, x]
        _propagate(K, st, sched.shape[0], cav, tabs, out)
        total = out[0]
        for x in range(1, K):
            total += out[x]
        if total > tiny and total < huge:
            inv = one / total
            for x in range(K):
                _store_message_entry(M, MP, IM, t, x, out[x] * inv, rho_mode, rho_sched[st], floor, one)
        else:
            n_fallback += 1
            _log_message(st, sched, unary, pairwise, slot_edge, slot_side, rho_slot, rho_sched, rho_mode, M, MP, IM,
                         cav, q)
    return n_fallback


# ---------------------------------------------------------------------------
# backward: step 8 of Algorithm "Back TRW", one iteration in reverse order
# ---------------------------------------------------------------------------
# For schedule step st (pair (c, i) of the paper, i = receiver v, j = sender
# u), with Madj = dL/dm (slot layout) and M holding the messages as they were
# right after the update:
#   (a) s(x_c) = tab * A(x_u), A recomputed exactly as in the forward pass
#   (b) nu = backnorm(dL/dm_ci, m_ci); dL/dm0(x_i) = nu(x_i) / m0(x_i) with the
#       unnormalised m0 = Z m_ci, Z = sum s, so s nu / m0 = (s / Z)(nu / m_ci).
#       (The paper writes nu / m_c(x_i); the division by the normaliser Z is
#       implicit there.) Let val(x_c) = (s / Z)(nu / m_ci) and h = sum_{x_i} val.
#   (c) dL/dtheta_c += val / rho_c  (accumulated into g_p in (x_i, x_j) layout;
#       the common factor 1 / rho_c of every pairwise term is applied at the end)
#   (d) dL/dtheta_j += h
#   (e) dL/dm_d(x_j) += (rho_d - [c = d]) h / m_d(x_j) for all d ∋ j
#   (f) restore m_ci from the stack (truncated mode only)
#   (g) dL/dm_ci = 0


@njit(cache=True, nogil=True, inline="always")
def _pairwise_adjoint(K, forward, c, cav, tabs, inv, rv, g_p, h):
    """Step 8(c) and the sum h of (d) in the normal case, for a step of the
    forward sweep (``(x_u, x_v) = (x_i, x_j)``) or of the backward sweep
    (``(x_j, x_i)``) on edge ``c``: ``val = cav[x_u] tab(x_i, x_j) inv
    rv[x_v]`` into ``g_p[c, x_i K + x_j]`` and ``h[x_u]``. The loops run over
    ``x_v`` outer and ``x_u`` inner: K independent sums for h."""
    for xv in range(K):
        b = rv[xv]
        for xu in range(K):
            xi, xj = (xu, xv) if forward else (xv, xu)
            val = cav[xu] * tabs[c, xi, xj] * inv * b
            g_p[c, xi * K + xj] += val
            h[xu] += val


@njit(cache=True, nogil=True, inline="always")
def _moderate(K, rv, huge):
    """Whether the ``nu / m`` of a reverse update sum to less than ``huge`` in
    magnitude (false for an infinity or NaN among them); otherwise, as when
    ``Z`` leaves its range, the update takes the rare path, which never forms
    ``nu / m``. (The grid kernels sum in the same order.)"""
    spread = abs(rv[0])
    for x in range(1, K):
        spread += abs(rv[x])
    return spread < huge


@njit(cache=True, nogil=True)
def _rare_adjoint_terms(K, q, scaled, m, one, h):
    """Step 8(c) on the rare path (shared with the grid kernels): the terms
    ``val[x_u, x_v] = q (nu / m)(x_v)`` written over ``q`` (the normalised
    ``s / Z`` from the log domain), their sums over ``x_v`` added to ``h``.
    With ``scaled = m dL/dm``, ``nu / m = scaled / m - sum(scaled)``, and the
    ratio ``q / m <= 1`` is formed first, so that no factor overflows even
    where ``scaled / m`` would."""
    total = scaled[0]
    for x in range(1, K):
        total += scaled[x]
    for xv in range(K):
        b = scaled[xv]
        iv = one / m[xv]
        for xu in range(K):
            w = q[xu, xv]
            val = (w * iv) * b - w * total
            q[xu, xv] = val
            h[xu] += val


@njit(cache=True, nogil=True)
def _reverse_sweep(kt, slot, restore, sched, tabs, rsum, eu, rho_sched, rho_mode, rho_slot, M, MP, IM, Madj,
                   stack, stack_pow, g_u, g_p, unary, pairwise, slot_edge, slot_side, cav, rv, h, q):
    """Step 8 for every pair in reverse order; with ``restore``, the messages
    are restored from ``stack[slot]`` (and ``stack_pow[slot]``)."""
    K = _n_states(kt, eu)
    floor, tiny, huge, _, zero, half, one = _limits_of(eu)
    keep_pow = stack_pow.shape[0] > 0
    n_steps = sched.shape[0]
    n_fwd = n_steps // 2
    for st in range(n_steps - 1, -1, -1):
        t = sched[st, 0]
        r = sched[st, 1]
        lo = sched[st, 2]
        hi = sched[st, 3]
        u = sched[st, 4]
        # (b) nu = backnorm(dL/dm_ci, m_ci); keep nu / m_ci (Madj[t] holds
        # m_ci dL/dm_ci: see "Numerical stability")
        backnorm_ratio_of_scaled(Madj[t], IM[t], rv)
        # (a) s = tab * A(x_u)
        for x in range(K):
            cav[x] = eu[u, x] * IM[r, x]
        for k in range(hi - 1, lo - 1, -1):
            for x in range(K):
                cav[x] *= MP[k, x]
        z = cav[0] * rsum[st, 0]
        for x in range(1, K):
            z += cav[x] * rsum[st, x]
        # (c) goes to g_p[c, x_i * K + x_j]: forward sweep (st < E): c = st,
        # (x_u, x_v) = (x_i, x_j); backward sweep: c = 2E-1-st, (x_u, x_v) =
        # (x_j, x_i)
        back = n_steps - 1 - st
        for x in range(K):
            h[x] = zero
        if z > tiny and z < huge and _moderate(K, rv, huge):
            # val = ((A tab) / Z) (nu / m_ci): (A tab) / Z <= m_ci keeps it
            # within |nu|, whereas nu / m_ci / Z alone overflows when m_ci and
            # Z are both tiny
            inv = one / z
            if st < n_fwd:  # a constant in each inlined copy
                _pairwise_adjoint(K, True, st, cav, tabs, inv, rv, g_p, h)
            else:
                _pairwise_adjoint(K, False, back, cav, tabs, inv, rv, g_p, h)
        else:
            _log_joint(st, sched, unary, pairwise, slot_edge, slot_side, rho_slot, rho_sched, M, cav, q)
            c, su, sv = (st, K, 1) if st < n_fwd else (back, 1, K)
            _rare_adjoint_terms(K, q, Madj[t], M[t], one, h)
            for xv in range(K):
                for xu in range(K):
                    g_p[c, xu * su + xv * sv] += q[xu, xv]
        # (d)
        for x in range(K):
            g_u[u, x] += h[x]
        # (e) rho_d h / m_d for every d ∋ j, then -h / m_c for d = c
        #     (times m_d: Madj is scaled)
        for k in range(lo, hi):
            rk = _slot_rho(rho_mode, rho_slot, k, half, one)
            for x in range(K):
                Madj[k, x] += _live(rk * h[x], M[k, x], floor, zero)
        for x in range(K):
            Madj[r, x] -= _live(h[x], M[r, x], floor, zero)
        # (f) pull m_ci from the stack
        if restore:
            for x in range(K):
                m = stack[slot, t, x]
                M[t, x] = m
                IM[t, x] = one / m
                if rho_mode == _RHO_HALF:
                    MP[t, x] = math.sqrt(m)
                elif keep_pow:
                    MP[t, x] = stack_pow[slot, t, x]
        # (g)
        for x in range(K):
            Madj[t, x] = zero


# ---------------------------------------------------------------------------
# drivers
# ---------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _push(stack, stack_pow, slot, M, MP):
    """Step 2(a): keep the messages (and powers) an iteration overwrites."""
    _copy_into(stack[slot], M)
    if stack_pow.shape[0] > 0:
        _copy_into(stack_pow[slot], MP)


@njit(cache=True, nogil=True, inline="always")
def _copy_into(target, source):
    """``target[...] = source`` for contiguous arrays of one size, as a loop.
    numba's array assignment compiles its shape-mismatch message (f-strings,
    ``str``, ``join``) into the kernel that uses it: a first TRW gradient
    compiled in 47.0-47.6 s with it, 38.5-38.7 s without (2026-12-05, Zen 1,
    ``benchmarks/bench_compile.py``)."""
    t = target.reshape(-1)
    s = source.reshape(-1)
    if t.shape[0] != s.shape[0]:
        raise ValueError("_copy_into: arrays of different sizes")
    for i in range(s.shape[0]):
        t[i] = s[i]


@njit(cache=True, nogil=True)
def _trw_forward_kernel(
    kt, sched, order, tabs, eu, rho_sched, rho_mode, M, MP, IM, unary, pairwise, slot_edge, slot_side, rho_slot,
    edges, ptr, slot_of, rho, n_iter, tol, max_iter, push_slot, stack, stack_pow, mu_u, mu_p, check=True,
):
    """TRW in place on ``M`` / ``MP`` / ``IM`` (messages, their rho-powers,
    their inverses; slot layout). ``n_iter >= 0``: exactly that many
    iterations (``check`` False: converged stays False, without the
    marginals before the last); ``n_iter < 0``: until the largest change of a unary marginal
    is below ``tol`` or ``max_iter`` iterations. Iteration ``it`` keeps the
    messages (and powers) it starts from in ``stack[push_slot[it]]`` when
    that is >= 0 (step 2(a)); ``push_slot`` is empty when nothing is kept.

    Returns (iterations run, converged, number of log-domain fallbacks).
    """
    K = eu.shape[1]
    cav = np.empty(K, eu.dtype)
    out = np.empty(K, eu.dtype)
    q = np.empty((K, K), eu.dtype)
    prev = np.empty_like(mu_u)
    keep = push_slot.shape[0] > 0
    fixed = n_iter >= 0
    limit = n_iter if fixed else max_iter
    n_fallback = 0
    converged = False
    it = 0
    if not fixed:
        n_fallback += _unary_marginals(kt, ptr, eu, unary, rho_slot, M, MP, prev)
    while it < limit:
        if fixed and check and it == limit - 1:  # marginals before the last iteration, for .converged
            n_fallback += _unary_marginals(kt, ptr, eu, unary, rho_slot, M, MP, prev)
        if keep and push_slot[it] >= 0:
            _push(stack, stack_pow, push_slot[it], M, MP)
        n_fallback += _sweep(  # 2(b)
            kt, order, sched, tabs, eu, rho_sched, rho_mode, M, MP, IM, unary, pairwise, slot_edge, slot_side,
            rho_slot, cav, out, q,
        )
        it += 1
        if fixed and it < limit:
            continue
        n_fallback += _unary_marginals(kt, ptr, eu, unary, rho_slot, M, MP, mu_u)
        if check and _max_abs_diff(mu_u, prev) < tol:
            converged = True
            break
        _copy_into(prev, mu_u)
    if it == 0:
        n_fallback += _unary_marginals(kt, ptr, eu, unary, rho_slot, M, MP, mu_u)  # step 4
    n_fallback += _pairwise_marginals(
        edges, ptr, slot_of, tabs, eu, unary, pairwise, rho, rho_slot, M, MP, IM, mu_p
    )  # step 3
    return it, converged, n_fallback


@njit(cache=True, nogil=True)
def _sweeps_kernel(
    kt, n_sweeps, sched, order, tabs, eu, rho_sched, rho_mode, unary, pairwise, slot_edge, slot_side, rho_slot,
    M, MP, IM,
):
    """``n_sweeps`` iterations in place on ``M``, ``MP``, ``IM`` (checkpointed
    reverse mode recomputing the forward pass's iterations)."""
    K = eu.shape[1]
    cav = np.empty(K, eu.dtype)
    out = np.empty(K, eu.dtype)
    q = np.empty((K, K), eu.dtype)
    for _ in range(n_sweeps):
        _sweep(kt, order, sched, tabs, eu, rho_sched, rho_mode, M, MP, IM, unary, pairwise, slot_edge, slot_side,
               rho_slot, cav, out, q)


@njit(cache=True, nogil=True)
def _backward_start(edges, ptr, slot_of, rho_slot, M, mu_u, mu_p, gmu_u, gmu_p, g_u, g_p, Madj):
    """Algorithm "Back TRW", steps 6 and 7 (step 5, the loss, is the caller's):
    the adjoints of the marginals pushed onto ``g_u``, ``g_p`` (the latter
    *not* yet multiplied by the common factor 1 / rho_c of steps 6(b) and
    8(c)) and the adjoint messages ``Madj``, scaled by the messages ``M``
    (see "Numerical stability")."""
    E = edges.shape[0]
    n, K = mu_u.shape
    floor, _, _, _, zero, _, _ = _limits_of(mu_u)
    nu = np.empty(K, Madj.dtype)
    nu_c = np.empty(K * K, Madj.dtype)
    row = np.empty(K, Madj.dtype)
    col = np.empty(K, Madj.dtype)
    # 6. For all c: nu_c = backnorm(dL/dmu_c, mu_c) and push it back
    #    (skipped when the loss has no pairwise term: gmu_p has no rows)
    for c in range(E if gmu_p.shape[0] > 0 else 0):
        i = edges[c, 0]
        j = edges[c, 1]
        backnorm(gmu_p[c], mu_p[c], nu_c)  # 6(a)
        for x in range(K):
            row[x] = zero
            col[x] = zero
        for xi in range(K):
            for xj in range(K):
                v = nu_c[xi * K + xj]
                g_p[c, xi * K + xj] += v  # 6(b) (times 1 / rho_c at the end)
                row[xi] += v
                col[xj] += v
        for x in range(K):  # 6(c)
            g_u[i, x] += row[x]
            g_u[j, x] += col[x]
        # 6(d): dL/dm_d(x_i) += (rho_d - [c = d]) / m_d(x_i) sum_{x_j} nu_c, same
        # for j (times m_d(x_i): Madj is scaled)
        for k in range(ptr[i], ptr[i + 1]):
            for x in range(K):
                Madj[k, x] += _live(rho_slot[k] * row[x], M[k, x], floor, zero)
        for k in range(ptr[j], ptr[j + 1]):
            for x in range(K):
                Madj[k, x] += _live(rho_slot[k] * col[x], M[k, x], floor, zero)
        a = slot_of[c, 0]
        b = slot_of[c, 1]
        for x in range(K):
            Madj[a, x] -= _live(row[x], M[a, x], floor, zero)
            Madj[b, x] -= _live(col[x], M[b, x], floor, zero)
    # 7. For all i: nu_i = backnorm(dL/dmu_i, mu_i)
    for i in range(n):
        backnorm(gmu_u[i], mu_u[i], nu)  # 7(a)
        for x in range(K):
            g_u[i, x] += nu[x]  # 7(b)
        for k in range(ptr[i], ptr[i + 1]):  # 7(c): dL/dm_d(x_i) += rho_d nu_i / m_d(x_i) (times m_d)
            rk = rho_slot[k]
            for x in range(K):
                Madj[k, x] += _live(rk * nu[x], M[k, x], floor, zero)


@njit(cache=True, nogil=True)
def _reverse_iterations(
    kt, slots, fixed_point, tol, max_sweeps, sched, tabs, rsum, eu, rho_sched, rho_mode, rho_slot, M, MP, IM,
    Madj, stack, stack_pow, g_u, g_p, unary, pairwise, slot_edge, slot_side,
):
    """Step 8, repeated. Truncated mode: one reverse sweep for each entry of
    ``slots``, restoring the messages from ``stack[slots[j]]`` after sweep
    ``j``. Fixed-point mode: up to ``max_sweeps`` sweeps at the fixed messages,
    until the largest adjoint message is below ``tol`` (or blows up).

    Returns (number of reverse sweeps, largest remaining adjoint message).
    """
    K = eu.shape[1]
    cav = np.empty(K, eu.dtype)
    rv = np.empty(K, Madj.dtype)
    h = np.empty(K, Madj.dtype)
    q = np.empty((K, K), eu.dtype)
    sweeps = max_sweeps if fixed_point else slots.shape[0]
    residual = 0.0
    n_sweeps = 0
    for j in range(sweeps):
        slot = 0 if fixed_point else slots[j]
        _reverse_sweep(
            kt, slot, not fixed_point, sched, tabs, rsum, eu, rho_sched, rho_mode, rho_slot, M, MP, IM, Madj,
            stack, stack_pow, g_u, g_p, unary, pairwise, slot_edge, slot_side, cav, rv, h, q,
        )
        n_sweeps += 1
        if fixed_point:  # the largest |dL/dm| = |Madj / m|, in float64 (it may exceed float32)
            residual = 0.0
            for k in range(Madj.shape[0]):
                for x in range(K):
                    v = abs(np.float64(Madj[k, x]) * np.float64(IM[k, x]))
                    if v > residual:
                        residual = v
            if residual < tol or not residual < _ADJOINT_BLOWUP:
                break
    return n_sweeps, residual


# ---------------------------------------------------------------------------
# Python wrappers
# ---------------------------------------------------------------------------


class TRWState:
    """Result of :func:`trw_forward`, with everything :func:`trw_backward` needs.

    Attributes
    ----------
    unary_marginals : (n, K) ndarray
    pairwise_marginals : (E, K, K) ndarray, laid out like ``pairwise``
        (computed on first access by the states of the grid kernels: a loss
        of the unary marginals alone never needs them)
    messages : (E, 2, K) ndarray (computed on access), ``messages[e, s]`` is
        the message from edge ``e`` into ``edges[e, s]``
    n_iter : int, iterations run
    converged : bool, whether the largest change of a unary marginal over the
        last iteration was below ``tol`` (False when no iteration ran)
    stack : (n_iter, 2E, K) ndarray or None, the messages at the start of each
        iteration in internal slot order (``keep_stack=True``); with fewer
        snapshots than iterations (``checkpointed``) accessing it raises
        ValueError
    stack_buffer : (n_slots, 2E, K) ndarray or None, the one buffer of kept
        snapshots (``keep_stack=True``): the messages before iteration ``t``
        in slot ``checkpoint_plan.forward_slots[t]`` (slot ``t`` without
        checkpointing); with checkpointing the backward pass recomputes the
        others into the slots it frees and into the last, the work slot
    checkpoint_plan : ``sklearn_margcrf._checkpoints.CheckpointPlan`` or
        None, where the snapshots are kept (``kept_iterations``) and how the
        backward recomputes the others
    checkpointed : bool, whether fewer snapshots than iterations were kept
    n_fallback : int, how many messages / marginals needed the log-domain path

    All arrays are of the compute dtype (float32 or float64).
    """

    def __init__(self, **fields):
        self.__dict__.update(fields)

    @property
    def messages(self):
        return self.slot_messages[self.slot_of]

    @property
    def pairwise_marginals(self):
        if self._pairwise_marginals is None:
            self._pairwise_marginals = _grid_pairwise_marginals(self)
        return self._pairwise_marginals

    @property
    def slot_messages(self):
        """(2E, K) the final messages in the slot layout (a new array for a state of the grid kernels)."""
        if self._slot_messages is None:
            return self.grid_kernels.slot_messages(self.grid_planes[0])
        return self._slot_messages

    @property
    def checkpointed(self):
        return self.checkpoint_plan is not None and self.checkpoint_plan.checkpointed

    @property
    def stack(self):
        if self.stack_buffer is None:
            return None
        if self.checkpointed:
            raise incomplete_stack(self.checkpoint_plan.n_snapshots, self.n_iter, "trw_forward")
        return self.stack_buffer

    def __repr__(self):
        n, K = self.unary_marginals.shape
        kept = "no" if self.stack_buffer is None else f"{self.checkpoint_plan.n_snapshots} of {self.n_iter}"
        return (
            f"TRWState(n_nodes={n}, n_edges={self.edges.shape[0]}, K={K}, dtype={self.unary.dtype}, "
            f"n_iter={self.n_iter}, converged={self.converged}, snapshots={kept})"
        )


def floored_message_entries(state):
    """How many entries of the final messages of ``state`` sit at the floor
    (``MESSAGE_FLOOR`` of the compute dtype): where parameters differ by more
    than about ``690 rho`` (float64; ``85 rho`` in float32), a message entry
    the floor replaced may have been needed, and the marginals can then be off
    (see "Numerical stability" above)."""
    # the planes of the grid kernels hold the same entries, and 1 where a neighbour is absent
    # (those of two labels hold one number per message: counted in the slot layout)
    planes = state.grid_planes is not None and not state.grid_kernels.binary
    messages = state.grid_planes[0] if planes else state.slot_messages
    return int(_count_at_most(messages.reshape(-1), _limits(messages.dtype)[0]))


@njit(cache=True, nogil=True)
def _count_at_most(values, bound):
    count = 0
    for v in values:
        count += v <= bound
    return count


def _writable(array, dtype):
    """Contiguous array of ``dtype``; read-only input is copied, so that one
    compiled signature serves every call. Copies are scratch memory (in a fit,
    rho and memory-mapped edges at every evaluation)."""
    array = np.asarray(array)
    if array.dtype == dtype and array.flags.c_contiguous and array.flags.writeable:
        return array
    return scratch_copy(array, dtype)


def _rho_mode(rho):
    if rho.size == 0 or np.all(rho == 1.0):
        return _RHO_ONE
    if np.all(rho == 0.5):
        return _RHO_HALF
    return _RHO_GENERAL


@njit(cache=True, nogil=True)
def _slot_map(rho, slot_edge, slot_side, slot_of, rho_slot):
    """The slot of each (edge, side) and the rho of each slot."""
    for k in range(slot_edge.shape[0]):
        slot_of[slot_edge[k], slot_side[k]] = k
        rho_slot[k] = rho[slot_edge[k]]


@njit(cache=True, nogil=True)
def _build_schedule(edges, rho, ptr, slot_of, sched, rho_sched):
    """Fill the schedule: step ``st`` is (t, r, lo, hi, u) -- see above."""
    E = edges.shape[0]
    for c in range(E):
        # forward sweep: step c, into edges[c, 1], sent by u = edges[c, 0]
        u = edges[c, 0]
        sched[c, 0] = slot_of[c, 1]
        sched[c, 1] = slot_of[c, 0]
        sched[c, 2] = ptr[u]
        sched[c, 3] = ptr[u + 1]
        sched[c, 4] = u
        rho_sched[c] = rho[c]
        # backward sweep: step 2E-1-c, into edges[c, 0], sent by u = edges[c, 1]
        st = 2 * E - 1 - c
        u = edges[c, 1]
        sched[st, 0] = slot_of[c, 0]
        sched[st, 1] = slot_of[c, 1]
        sched[st, 2] = ptr[u]
        sched[st, 3] = ptr[u + 1]
        sched[st, 4] = u
        rho_sched[st] = rho[c]


@njit(cache=True, nogil=True)
def _interleave(sched, edges, slot_edge, slot_side, n, width, order):
    """Fill ``order`` with an execution order of the schedule steps in which
    independent chains alternate, so that consecutive steps need not wait for
    each other.

    Step ``st`` writes slot ``t`` and reads the slots of its sender ``u``
    (``lo:hi``, all of them); it also counts as writing ``u`` and its edge
    ``c``, so that the order would serve the reverse sweeps too, which
    accumulate into ``Madj`` of ``u``'s slots, ``g_u[u]`` and ``g_p[c]`` (they
    run in canonical order all the same: see "Implementation notes"). Two
    steps conflict when they share one of these and one of them writes it;
    ``order`` keeps every conflicting pair in canonical order, so every step
    reads the values it reads in canonical order: the results are bitwise
    equal. With ``v`` the receiver (the node of ``t``), steps ``a`` and ``b``
    conflict exactly when ``u_a = u_b``, ``v_a = u_b`` or ``u_a = v_b`` (a
    shared edge or written slot implies one of these).

    The canonical order is cut into maximal chains (each step conflicts with
    the one before it: on grid orderings, the horizontal messages of one image
    row), and up to ``width`` consecutive chains, no two of which conflict,
    are merged round-robin. Linear time: the senders and receivers of the
    chains taken into a group are stamped with its number.
    """
    n_steps = sched.shape[0]
    send = sched[:, 4]
    recv = np.empty(n_steps, dtype=np.int32)
    for st in range(n_steps):
        t = sched[st, 0]
        recv[st] = edges[slot_edge[t], slot_side[t]]
    starts = np.empty(n_steps + 1, dtype=np.int32)  # chain k: starts[k]:starts[k+1]
    n_chains = 0
    for st in range(n_steps):
        if st == 0 or not (send[st - 1] == send[st] or recv[st - 1] == send[st] or send[st - 1] == recv[st]):
            starts[n_chains] = st
            n_chains += 1
    starts[n_chains] = n_steps
    sent = np.zeros(n, dtype=np.int32)  # stamps
    received = np.zeros(n, dtype=np.int32)
    group = 0
    pos = 0
    first = 0
    while first < n_chains:
        if starts[first + 1] - starts[first] == 1:
            # a group starting with a lone step would keep canonical order anyway
            order[pos] = starts[first]
            pos += 1
            first += 1
            continue
        group += 1
        last = first  # the group: chains first..last-1
        while last < n_chains and last - first < width:
            steps = range(starts[last], starts[last + 1])
            free = True
            for st in steps:
                if sent[send[st]] == group or received[send[st]] == group or sent[recv[st]] == group:
                    free = False
                    break
            if not free:
                break
            for st in steps:
                sent[send[st]] = group
                received[recv[st]] = group
            last += 1
        end = pos + starts[last] - starts[first]
        k = 0
        while pos < end:  # round-robin
            for chain in range(first, last):
                if starts[chain] + k < starts[chain + 1]:
                    order[pos] = starts[chain] + k
                    pos += 1
            k += 1
        first = last


def _slots(n, edges, rho):
    """The slot layout: ``ptr``, ``slot_edge``, ``slot_side``, ``slot_of``, ``rho_slot``."""
    inc = incidence(n, edges)
    slot_of = scratch((edges.shape[0], 2), np.int64)
    rho_slot = scratch(2 * edges.shape[0], rho.dtype)
    _slot_map(rho, inc.edge, inc.side, slot_of, rho_slot)
    return inc.ptr, inc.edge, inc.side, slot_of, rho_slot


def _schedule(n, edges, rho, ptr, slot_edge, slot_side, slot_of, interleave):
    """The tabulated schedule of the slot kernels (see the module docstring)
    and the order of its execution (interleaved or canonical)."""
    E = edges.shape[0]
    sched = np.empty((2 * E, 5), dtype=np.int32)
    rho_sched = np.empty(2 * E, rho.dtype)
    _build_schedule(edges, rho, ptr, slot_of, sched, rho_sched)
    # unsigned: numba then needs no wraparound of negative indices on st
    order = np.arange(2 * E, dtype=np.uint32)
    if interleave:
        _interleave(sched, edges, slot_edge, slot_side, n, _INTERLEAVE_WIDTH, order)
    return sched, order, rho_sched


def trw_forward(edges, unary, pairwise, rho, n_iter=None, tol=1e-6, max_iter=1000, keep_stack=False, checkpoints=None,
                start=None):
    """Tree-reweighted belief propagation (loopy BP for ``rho = 1``).

    Parameters
    ----------
    edges : (E, 2) int64
    unary : (n, K) float32 or float64
    pairwise : (E, K, K) float32 or float64, ``pairwise[e, a, b] = theta(x_i=a, x_j=b)``
        Computation runs in float32 when ``unary`` and ``pairwise`` are both
        float32, in float64 otherwise; every returned array has that dtype.
    rho : (E,) float, edge appearance probabilities, > 0
    n_iter : int >= 0 or None
        Exactly this many iterations, or (None) until the largest change of a
        unary marginal over one iteration is below ``tol`` (at most
        ``max_iter`` iterations).
    tol : float, default=1e-6
        Convergence threshold when ``n_iter`` is None.
    max_iter : int, default=1000
        Iteration cap when ``n_iter`` is None.
    keep_stack : bool
        Keep snapshots of the messages for ``trw_backward(mode="truncated")``;
        needs an integer ``n_iter``.
    checkpoints : int >= 1 or None
        With ``keep_stack``: keep only this many snapshots (at most
        ``n_iter``); the backward pass recomputes the iterations between them
        (see ``sklearn_margcrf._checkpoints``). None keeps one per
        iteration while they fit ``STACK_MEMORY_BUDGET`` and as many as fit
        otherwise. One snapshot is ``2E * K`` floats (twice that for a
        ``rho`` that is neither all ones nor all one half; ``4 n`` for two
        labels on the edges of ``grid_edges`` with rho all 1 or all 1/2,
        one number per message and per absent neighbour).
    start : (2E, K) array or None
        The messages to start from, in internal slot order
        (``TRWState.slot_messages`` of an earlier pass on the same graph);
        None starts from uniform messages.

    Returns
    -------
    TRWState
    """
    return _forward(edges, unary, pairwise, rho, n_iter, tol, max_iter, keep_stack, checkpoints, start=start)


def _forward(edges, unary, pairwise, rho, n_iter=None, tol=1e-6, max_iter=1000, keep_stack=False, checkpoints=None,
             specialise=True, interleave=None, start=None, grid=None, check_converged=True):
    """:func:`trw_forward`; ``check_converged=False`` with an integer
    ``n_iter``: no marginals before the last iteration, ``converged`` None
    (for callers that do not read it). The kernel variant as arguments: ``specialise``
    compiles the label loops for the constant K (K <= ``_MAX_SPECIALISED_K``),
    ``interleave`` runs the sweeps in interleaved order (default: for K = 2
    only, where it measured faster), ``grid`` runs a fixed number of
    iterations on the edges of ``grid_edges`` with the line kernels of
    ``sklearn_margcrf._trw_grid`` (default: where they measured faster,
    see ``_use_grid_kernels``). Every variant computes the same values."""
    dtype = model_dtype(unary, pairwise)
    unary = _writable(unary, dtype)
    n, K = unary.shape
    edges = _writable(edges, np.int64).reshape(-1, 2)
    E = edges.shape[0]
    pairwise = _writable(pairwise, dtype).reshape(E, K, K)
    rho = _writable(rho, dtype).reshape(E)
    if keep_stack and n_iter is None:
        raise ValueError(
            "keep_stack=True needs an integer n_iter: truncated back TRW differentiates a fixed number of iterations"
        )
    shape = None
    if grid is None:
        grid = _use_grid_kernels(K, dtype)
    if grid and n_iter is not None and n_iter > 0:
        from ._trw_grid import grid_shape

        shape = grid_shape(n, edges)
    if interleave is None:
        interleave = K == 2
    ptr, slot_edge, slot_side, slot_of, rho_slot = _slots(n, edges, rho)
    sched = order = rho_sched = None  # the grid kernels need no slot schedule (_slot_tables builds it if asked)
    if shape is None:
        sched, order, rho_sched = _schedule(n, edges, rho, ptr, slot_edge, slot_side, slot_of, interleave)
    mode = _rho_mode(rho)
    kt = _label_token(K, specialise)
    eu = scratch((n, K), dtype)
    if shape is None:
        tabs = scratch((E, K, K), dtype)
        rsum = scratch((2 * E, K), dtype)
        _build_tables(kt, unary, pairwise, rho, eu, tabs, rsum, *table_blocks(K))
    else:  # the grid kernels keep their own tables, once per edge
        tabs = rsum = None
        _shifted_exp_unary(unary, eu)
    if start is None:
        M = scratch_full((2 * E, K), 1.0 / K, dtype)
    else:
        M = scratch_copy(np.reshape(start, (2 * E, K)), dtype)  # a copy: the kernel updates it in place
    # as the kernels invert, so that recomputed iterations match (the grid
    # kernels derive the inverses and, for rho = 1/2, the powers at the end:
    # not held during the iterations, at the peak of memory)
    IM = MP = None
    if shape is None:
        IM = np.divide(1, M, out=scratch(M.shape, dtype))
    if mode == _RHO_ONE:
        MP = M
    elif mode == _RHO_HALF:
        if shape is None:
            MP = np.sqrt(M, out=scratch(M.shape, dtype))
    elif start is None:
        MP = scratch((2 * E, K), dtype)
        MP[...] = np.power(M[0, 0], rho_slot)[:, None]
    else:
        MP = np.power(M, rho_slot[:, None], out=scratch(M.shape, dtype))
    grid_kernels = grid_planes = None
    if shape is not None:
        from ._trw_grid import GridKernels

        grid_kernels = GridKernels(*shape, kt, unary, pairwise, rho, eu, rho_slot, mode, slot_edge, slot_side,
                                   slot_of, ptr)
        slot_edge = slot_side = None  # the grid kernels need them no more (memory: 2 of 2E int64)
    # one snapshot: the slot layout, or the planes' (flat) for the grid kernels
    snapshot_shape = (2 * E, K) if grid_kernels is None else (grid_kernels.plane_size,)
    snapshots = stack_pow = np.empty((0, *snapshot_shape), dtype)
    push_slot = np.empty(0, np.int64)
    plan = None
    if keep_stack and n_iter > 0:
        kept_per_message = 1 if grid_kernels is not None and grid_kernels.binary else K
        snapshot_bytes = 2 * E * kept_per_message * dtype.itemsize * (2 if mode == _RHO_GENERAL else 1)
        plan = checkpoint_plan(n_iter, check_checkpoints(checkpoints), snapshot_bytes)
        snapshots = scratch((plan.n_slots, *snapshot_shape), dtype)
        if mode == _RHO_GENERAL:
            stack_pow = scratch((plan.n_slots, *snapshot_shape), dtype)
        push_slot = plan.forward_slots
    mu_u = scratch((n, K), dtype)
    check = bool(check_converged) or n_iter is None  # to tol: the check is the loop's
    mu_p = None  # the grid kernels' states compute their pairwise marginals on first access
    if grid_kernels is None:
        mu_p = scratch((E, K * K), dtype)
        it, converged, n_fallback = _trw_forward_kernel(
            kt, sched, order, tabs, eu, rho_sched, mode, M, MP, IM, unary, pairwise, slot_edge, slot_side, rho_slot,
            edges, ptr, slot_of, rho, -1 if n_iter is None else int(n_iter), float(tol), int(max_iter),
            push_slot, snapshots, stack_pow, mu_u, mu_p, check,
        )
    else:
        grid_planes, it, converged, n_fallback = _grid_forward(
            grid_kernels, int(n_iter), push_slot, snapshots, stack_pow, M, MP, tol, kt, unary, ptr, rho_slot, eu, mu_u,
            check,
        )
    return TRWState(
        unary_marginals=mu_u,
        _pairwise_marginals=None if mu_p is None else mu_p.reshape(E, K, K),
        n_iter=int(it),
        converged=bool(converged) if check else None,
        stack_buffer=snapshots if plan is not None else None,
        snapshot_powers=stack_pow,
        buffer_reused=False,
        checkpoint_plan=plan,
        n_fallback=int(n_fallback),
        # a state of the grid kernels keeps its messages (and powers) only in
        # their planes, and no inverses: derived where needed (slot_messages,
        # _slot_message_arrays)
        _slot_messages=None if grid_kernels is not None else M,
        slot_powers=None if grid_kernels is not None else MP,
        slot_inverses=None if grid_kernels is not None else IM,
        edges=edges,
        unary=unary,
        pairwise=pairwise,
        rho=rho,
        rho_mode=mode,
        ptr=ptr,
        slot_edge=slot_edge,
        slot_side=slot_side,
        slot_of=slot_of,
        sched=sched,
        order=order,
        rho_sched=rho_sched,
        rho_slot=rho_slot,
        eu=eu,
        tabs=tabs,
        rsum=rsum,
        tol=tol,
        label_token=kt,
        grid_kernels=grid_kernels,
        grid_planes=grid_planes,
    )


def _grid_planes(grid_kernels, M, MP, rho_mode):
    """The slot-layout messages and powers as flat planes (absent neighbours:
    1); the power planes are the message planes unless rho is general (for
    rho = 1/2 the line kernels keep square roots in planes of their own, and
    the two-label kernels' planes hold ``m(1) / m(0)`` to the power rho)."""
    flat_M = grid_kernels.planes_of(M)
    return flat_M, grid_kernels.planes_of(MP) if rho_mode == _RHO_GENERAL else flat_M


def _grid_forward(grid_kernels, n_iter, push_slot, snapshots, stack_pow, M, MP, tol, kt, unary, ptr, rho_slot, eu,
                  mu_u, check=True):
    """``n_iter >= 1`` iterations on the planes and the unary marginals, as
    ``_trw_forward_kernel`` runs them for a fixed number of iterations
    (with ``check``, marginals before the last iteration for ``converged``; the pairwise
    marginals on first access, :func:`_grid_pairwise_marginals`). ``M`` (and
    ``MP`` for a general rho; slot layout) hold the start and receive the
    final messages; the slot-layout powers for rho = 1/2 are derived at
    the end. Returns the planes ``(M, P)``, the iterations,
    whether converged (False without ``check``) and the number of fallbacks."""
    mode = grid_kernels.rho_mode
    planes = _grid_planes(grid_kernels, M, MP, mode)
    push = push_slot if push_slot.shape[0] else np.full(n_iter, -1, np.int64)

    def slot_powers():
        """The messages of the planes into ``M``; their powers (slot layout)."""
        grid_kernels.slot_messages(planes[0], out=M)
        if mode == _RHO_ONE:
            return M
        if mode == _RHO_HALF:
            return np.sqrt(M, out=scratch(M.shape, M.dtype))
        return grid_kernels.slot_messages(planes[1], out=MP)

    head = n_iter - 1 if check else n_iter  # with check, the last iteration after the marginals before it
    n_fallback = grid_kernels.run(*planes, head, push[:head], snapshots, stack_pow)
    prev = None
    if check:
        prev = scratch(mu_u.shape, mu_u.dtype)
        n_fallback += _unary_marginals(kt, ptr, eu, unary, rho_slot, M, slot_powers(), prev)
        n_fallback += grid_kernels.run(*planes, 1, push[head:], snapshots, stack_pow)
    n_fallback += _unary_marginals(kt, ptr, eu, unary, rho_slot, M, slot_powers(), mu_u)
    converged = check and _max_abs_diff(mu_u, prev) < tol
    return planes, n_iter, converged, n_fallback


def _grid_pairwise_marginals(state):
    """The pairwise marginals of a state of the grid kernels, from the final
    messages as the slot path computes them (the same values, bit for bit),
    on first access: a loss of the unary marginals alone then pays neither
    for them nor for the slot-layout tables they read (K = 8, float64,
    200 x 300: two arrays of 61 MB). Like every array of the state, they
    read its scratch memory: access them inside the workspace of the
    forward pass (``sklearn_margcrf._workspace``)."""
    E, K = state.pairwise.shape[:2]
    M, MP, IM = _slot_message_arrays(state)
    mu_p = scratch((E, K * K), state.unary.dtype)
    state.n_fallback += int(_pairwise_marginals(
        state.edges, state.ptr, state.slot_of, state.grid_kernels.forward_tables(), state.eu, state.unary,
        state.pairwise, state.rho, state.rho_slot, M, MP, IM, mu_p,
    ))
    return mu_p.reshape(E, K, K)


def _keep_checkpoints(state):
    """Rerun the forward iterations from the first snapshot (the initial
    messages, never overwritten), keeping the checkpoints in their slots."""
    push_slot = state.checkpoint_plan.forward_slots
    M, MP, IM = _work_arrays(state, 0)
    if state.grid_kernels is not None:
        state.grid_kernels.run(M, MP, state.n_iter, push_slot, state.stack_buffer, state.snapshot_powers)
        return
    n, K = state.unary.shape
    _trw_forward_kernel(
        state.label_token, state.sched, state.order, state.tabs, state.eu, state.rho_sched, state.rho_mode, M, MP, IM,
        state.unary, state.pairwise, state.slot_edge, state.slot_side, state.rho_slot, state.edges, state.ptr,
        state.slot_of, state.rho, state.n_iter, 0.0, state.n_iter, push_slot, state.stack_buffer,
        state.snapshot_powers, np.empty((n, K), M.dtype), np.empty((len(state.edges), K * K), M.dtype),
    )


def _work_arrays(state, load):
    """``(M, MP, IM)`` to rerun iterations in place in the work slot, from
    snapshot ``load`` (-1: what the work slot holds), with the powers and
    inverses derived as the forward pass derived them, so that recomputed
    iterations match bit for bit. The grid kernels read no inverses (None)
    and, for rho = 1/2, no powers of the caller's (the line kernels derive
    their own, the two-label kernels' planes hold ``m(1) / m(0)`` to the
    power rho)."""
    work = state.checkpoint_plan.work_slot
    stack, powers = state.stack_buffer, state.snapshot_powers
    if load >= 0:
        stack[work] = stack[load]
        if powers.shape[0]:
            powers[work] = powers[load]
    M = stack[work]
    grid = state.grid_kernels is not None
    IM = None if grid else np.divide(1, M, out=scratch(M.shape, M.dtype))
    if state.rho_mode == _RHO_ONE or (state.rho_mode == _RHO_HALF and grid):
        MP = M
    elif state.rho_mode == _RHO_HALF:
        MP = np.sqrt(M, out=scratch(M.shape, M.dtype))
    else:
        MP = powers[work]
    return M, MP, IM


def _advance(state, load, n_sweeps, store):
    """Checkpointed reverse mode, a plan's ``("advance", load, n_sweeps,
    store)``: rerun ``n_sweeps`` iterations exactly as the forward pass ran
    them, in place in the work slot (from snapshot ``load`` unless -1), and
    keep the result in slot ``store`` too unless -1."""
    M, MP, IM = _work_arrays(state, load)
    if state.grid_kernels is not None:
        state.grid_kernels.run(M, MP, n_sweeps)
    else:
        _sweeps_kernel(
            state.label_token, n_sweeps, state.sched, state.order, state.tabs, state.eu, state.rho_sched,
            state.rho_mode, state.unary, state.pairwise, state.slot_edge, state.slot_side, state.rho_slot, M, MP, IM,
        )
    if store >= 0:
        work = state.checkpoint_plan.work_slot
        state.stack_buffer[store] = M
        if state.snapshot_powers.shape[0]:
            state.snapshot_powers[store] = state.snapshot_powers[work]


def _reverse_stack(state, reverse):
    """Step 8 for every kept iteration, last to first, as the state's
    checkpoint plan orders: ``reverse(slots)`` reverses the iterations that
    start from those snapshots, in that order; checkpointed, the plan's
    advances recompute the snapshots in between."""
    plan = state.checkpoint_plan
    if plan.checkpointed:
        if state.buffer_reused:  # an earlier backward wrote over snapshots: keep them again
            _keep_checkpoints(state)
        state.buffer_reused = True
    for step in plan.steps:
        if step[0] == "advance":
            _advance(state, *step[1:])
        else:
            reverse(step[1])


def trw_backward(state, grad_unary_marginals, grad_pairwise_marginals, mode="truncated", tol=1e-10, max_iter=10000,
                 on_divergence="warn"):
    """Gradient of a loss of the TRW marginals with respect to the parameters.

    Parameters
    ----------
    state : TRWState from :func:`trw_forward`
    grad_unary_marginals : (n, K), dL/dmu_i
    grad_pairwise_marginals : (E, K, K), dL/dmu_c (None for zeros)
    mode : "truncated" or "fixed_point"
        "truncated" (forward run with an integer ``n_iter`` and
        ``keep_stack=True``): Algorithm "Back TRW", the exact gradient of the
        loss of the marginals after exactly ``n_iter`` iterations (with
        checkpoints, the iterations between them are recomputed first).
        "fixed_point" (forward run to convergence): back-propagation with the
        messages held at their converged values; reverse sweeps are repeated
        until the largest adjoint message is below ``tol``; after ``max_iter``
        sweeps a RuntimeWarning is issued and the current estimate returned.
    tol, max_iter : used by "fixed_point" only.
    on_divergence : {"warn", "raise"}
        "fixed_point" only: when the reverse sweeps do not converge (or blow
        up, which stops them early), warn and return the current estimate, or
        raise :class:`~sklearn_margcrf.exceptions.BackpropDivergenceError`.

    Returns
    -------
    grad_unary : (n, K), of the state's dtype
    grad_pairwise : (E, K, K), of the state's dtype
    """
    edges = state.edges
    n, K = state.unary.shape
    E = edges.shape[0]
    dtype = state.unary.dtype
    gmu_u = _writable(grad_unary_marginals, dtype).reshape(n, K)
    if grad_pairwise_marginals is None:
        gmu_p = np.zeros((0, K * K), dtype)  # step 6 is skipped
    else:
        gmu_p = _writable(grad_pairwise_marginals, dtype).reshape(E, K * K)
    if mode == "truncated":
        if state.stack_buffer is None and state.n_iter > 0:
            raise ValueError(
                "mode='truncated' needs a forward pass run with an integer n_iter and keep_stack=True"
            )
        fixed_point = False
    elif mode == "fixed_point":
        fixed_point = True
        if not state.converged:
            warn_at_caller(
                "trw_backward(mode='fixed_point'): the forward pass did not converge, so the messages are not a "
                "fixed point and the back-propagated gradient is only approximate",
                RuntimeWarning,
            )
    else:
        raise ValueError(f"mode must be 'truncated' or 'fixed_point', got {mode!r}")
    if state.grid_kernels is not None:
        if not fixed_point:
            return _grid_backward(state, gmu_u, gmu_p)
        _slot_tables(state)  # fixed point: the slot kernels, at the messages the forward pass ended with
    M, MP, IM = _slot_message_arrays(state)
    g_u, g_p, Madj = _backward_start_of(state, M, gmu_u, gmu_p)
    if not fixed_point:  # the kernel restores them from the snapshots, step by step: copies
        M, IM = scratch_copy(M), scratch_copy(IM)
        MP = M if state.rho_mode == _RHO_ONE else scratch_copy(MP)
    kt = state.label_token

    def reverse(slots, snapshots, snapshot_powers, sweeps=0):
        return _reverse_iterations(
            kt, slots, fixed_point, float(tol), int(sweeps), state.sched, state.tabs, state.rsum, state.eu,
            state.rho_sched, state.rho_mode, state.rho_slot, M, MP, IM, Madj, snapshots, snapshot_powers, g_u, g_p,
            state.unary, state.pairwise, state.slot_edge, state.slot_side,
        )

    if fixed_point:
        n_sweeps, residual = reverse(np.empty(0, np.int64), state.eu[:0, None], state.eu[:0, None], max_iter)
    elif state.n_iter > 0:
        _reverse_stack(state, lambda slots: reverse(slots, state.stack_buffer, state.snapshot_powers))
    if fixed_point and max_iter > 0 and E > 0 and not residual < tol:
        if on_divergence == "raise":
            raise BackpropDivergenceError(
                f"back TRW at the converged messages did not converge in {n_sweeps} reverse sweeps "
                f"(largest adjoint message {residual:.3g}, tol {tol:g})"
            )
        warn_at_caller(
            f"trw_backward(mode='fixed_point') did not converge in {max_iter} reverse sweeps (largest adjoint "
            f"message {residual:.3g} >= tol={tol:g}); returning the current estimate",
            RuntimeWarning,
        )
    g_p /= state.rho[:, None]  # the common 1 / rho_c of steps 6(b) and 8(c)
    return g_u, g_p.reshape(E, K, K)


def _slot_tables(state):
    """Give a state of the grid kernels the schedule and tables of the slot kernels."""
    if state.tabs is None:
        E, K = state.pairwise.shape[:2]
        inc = incidence(len(state.unary), state.edges)  # the slot layout, which grid states do not keep
        state.slot_edge, state.slot_side = inc.edge, inc.side
        state.sched, state.order, state.rho_sched = _schedule(
            len(state.unary), state.edges, state.rho, state.ptr, state.slot_edge, state.slot_side, state.slot_of,
            K == 2,
        )
        state.tabs = np.empty((E, K, K), state.unary.dtype)
        state.rsum = np.empty((2 * E, K), state.unary.dtype)
        _build_tables(state.label_token, state.unary, state.pairwise, state.rho, np.empty_like(state.eu), state.tabs,
                      state.rsum, *table_blocks(K))


def _slot_message_arrays(state):
    """The messages the forward pass ended with, their powers and inverses, in
    the slot layout. A state of the grid kernels keeps only the messages when
    rho is 1 or 1/2 (the kernels read neither powers nor inverses): these are
    derived here as the kernels derive them (``sqrt(m)``, ``1 / m``, the same
    rounding)."""
    M = state.slot_messages
    IM = _slot_inverses(state, M)
    if state.rho_mode == _RHO_ONE:
        return M, M, IM
    MP = state.slot_powers
    if MP is None and state.rho_mode == _RHO_HALF:
        MP = np.sqrt(M, out=scratch(M.shape, M.dtype))
    elif MP is None:
        MP = state.grid_kernels.slot_messages(state.grid_planes[1])
    return M, MP, IM


def _slot_inverses(state, messages):
    """``1 / m`` of the messages the forward pass ended with (slot layout):
    kept by states of the slot kernels, derived for those of the grid kernels
    from ``messages``, their slot layout."""
    if state.slot_inverses is not None:
        return state.slot_inverses
    return np.divide(1, messages, out=scratch(messages.shape, messages.dtype))


def _backward_start_of(state, M, gmu_u, gmu_p, pairwise_out=True):
    """Steps 6 and 7: fresh ``g_u``, ``g_p`` (without the 1 / rho_c) and
    adjoint messages (scaled), from the final messages ``M`` (slot layout);
    ``pairwise_out=False`` (only when ``gmu_p`` is empty: no pairwise terms,
    which leaves ``g_p`` at zero): ``g_p`` of no rows."""
    n, K = state.unary.shape
    E = state.edges.shape[0]
    g_u = scratch_full((n, K), 0, state.unary.dtype)
    g_p = scratch_full((E if pairwise_out else 0, K * K), 0, state.unary.dtype)
    Madj = scratch_full((2 * E, K), 0, state.unary.dtype)
    # step 6 reads the pairwise marginals only when the loss has a pairwise term
    mu_p = state.pairwise_marginals.reshape(E, K * K) if gmu_p.shape[0] else gmu_p
    _backward_start(state.edges, state.ptr, state.slot_of, state.rho_slot, M,
                    state.unary_marginals, mu_p, gmu_u, gmu_p, g_u, g_p, Madj)
    return g_u, g_p, Madj


def _grid_backward(state, gmu_u, gmu_p):
    """Truncated back TRW with the grid kernels (the slot path's steps, on the planes)."""
    kernels = state.grid_kernels
    if kernels.binary:
        return _binary_grid_backward(state, gmu_u, gmu_p)
    E, K = state.pairwise.shape[:2]
    pairwise_terms = gmu_p.shape[0] > 0  # else steps 6-7 leave g_p at zero
    g_u, g_p, Madj = _backward_start_of(state, state.slot_messages, gmu_u, gmu_p, pairwise_terms)
    Madj = kernels.grid.to_grid(Madj, fill=0.0)
    GP_h, GP_v = kernels.split_pairwise(g_p if pairwise_terms else None)
    dtype = g_u.dtype
    del g_p  # the pairwise adjoints live in GP_h, GP_v until the end
    M = scratch_copy(state.grid_planes[0])
    P = scratch_copy(state.grid_planes[1]) if state.rho_mode == _RHO_GENERAL else M
    snapshots, powers = state.stack_buffer, state.snapshot_powers
    no_powers = np.empty(0, M.dtype)

    def reverse(slots):
        for slot in slots:
            kernels.reverse(True, M, P, snapshots[slot], powers[slot] if powers.shape[0] else no_powers, Madj,
                            GP_h, GP_v, g_u)

    _reverse_stack(state, reverse)
    del M, P, Madj, reverse  # before the gradient's own array (peak memory)
    g_p = scratch((E, K * K), dtype)
    kernels.join_pairwise(GP_h, GP_v, state.rho, g_p)
    return g_u, g_p.reshape(E, K, K)


def _binary_grid_backward(state, gmu_u, gmu_p):
    """Truncated back TRW for the one-number messages of two labels
    (``sklearn_margcrf._trw_grid_binary``): steps 6 and 7 as on the slot
    layout, their message adjoints converted to those of the planes, then the
    reverse sweeps of those updates."""
    from . import _trw_grid_binary as binary
    from ._trw_grid import _transpose_all

    kernels = state.grid_kernels
    grid = kernels.grid
    H, W = grid.height, grid.width
    E = state.pairwise.shape[0]
    pairwise_terms = gmu_p.shape[0] > 0
    messages = state.slot_messages
    g_u, g_p, Madj = _backward_start_of(state, messages, gmu_u, gmu_p, pairwise_terms)
    dtype = g_u.dtype
    Q = scratch_copy(state.grid_planes[0])  # restored from the snapshots, step by step
    Qadj = scratch(Q.shape, dtype)
    binary.q_adjoints(Madj, messages, Q, kernels.q_slot_pos, kernels.binary_half, Qadj)
    del Madj, messages
    GP_h, GP_v = kernels.split_pairwise(g_p if pairwise_terms else None)
    del g_p
    X = scratch(Q.shape, dtype)  # not the forward kernel's: the advances of a checkpointed pass write that
    _transpose_all(H, W, Q, X)
    held = scratch(H * W, dtype)  # a phase's senders' adjoints of log g
    EG_h = scratch_full(kernels.E_h.shape, 0, dtype)
    EG_v = scratch_full(kernels.E_v.shape, 0, dtype)
    snapshots = state.stack_buffer

    def reverse(slots):
        for slot in slots:
            binary.reverse_sweep(H, W, Q, X, Qadj, held, snapshots[slot], kernels.E_h, kernels.E_v, EG_h, EG_v,
                                 kernels.T_h, kernels.T_v, GP_h, GP_v, kernels.binary_token, grid.geometry_h,
                                 grid.geometry_v, state.unary, state.pairwise, kernels.lines)

    _reverse_stack(state, reverse)
    del Q, Qadj, X, held, reverse
    binary.add_unary_adjoints(EG_h, 1, W, g_u)  # [c, r]
    binary.add_unary_adjoints(EG_v, W, 1, g_u)  # [r, c]
    g_p = scratch((E, 4), dtype)
    kernels.join_pairwise(GP_h, GP_v, state.rho, g_p)
    return g_u, g_p.reshape(E, 2, 2)
