"""TRW and back TRW on 4-connected image grids with two labels, one number
per message.

With two labels a normalised message ``m`` is one number, its ratio
``r = m(1) / m(0)``. These kernels keep ``q = r ** rho`` (rho = 1/2 or 1 on
every edge) in planes laid out as those of :mod:`sklearn_margcrf._trw_grid`
with one label, run the same schedule (the same four phases, line by line)
and compute the same messages in exact arithmetic: the update of
Eq. TRW-msgs from sender ``u`` to ``v``,
``m(x_v) ~ sum_u exp(theta_uv / rho + theta_u(x_u)) prod_w m_wu(x_u) ** rho_wu / m_vu(x_u)``,
is in ratios, with ``E = exp(theta_u(1) - theta_u(0))``, the sender's other
messages ``q_o`` (own family) and ``x_a``, ``x_b`` (the other family), the
reverse message ``q_r`` and the table ``t = exp(theta_uv / rho)`` (``t_n``,
``t_d``: its two mixed entries in the sweep's orientation)::

    g = E q_o x_a x_b,      D = q_r (rho = 1/2) or 1 (rho = 1)
    r = (t_n D + g t_11) / (t_00 D + g t_d),      q = r ** rho

one division and, for rho = 1/2, one square root per message, against
three divisions and six square roots of the line kernels, and half their
message planes (figures: ``docs/results/bench_gradients.txt``).

Where a factor or a sum leaves the range in which that arithmetic is exact
to rounding (``_limits``: tiny, huge), the lane is computed again in the
log domain from ``theta`` and ``log q`` and counted as a fallback. Ratios
are clamped to ``[floor, 1 / floor]``: a message entry at the slot kernels'
floor, which :func:`message_pairs` gives back as exactly ``floor``.

The reverse sweeps (step 8 of Algorithm "Back TRW") differentiate these
updates, in reverse order, restoring each message from the snapshot of its
iteration (one number per message: half the stack of the normalised
messages). Their adjoints are of logarithms (``dL / d log q``, as the slot
kernels scale theirs by the messages): with ``w_n``, ``w_d`` the shares of
the ``g`` terms in the two sums, each update passes bounded multiples of
``dL / d log r`` back (see :func:`_reverse_phase`), the same expressions on
the lanes of plain arithmetic and, with the shares from the log domain, on
the others. Steps 6 and 7 are ``trw``'s, on the slot layout
(:func:`message_pairs`, :func:`q_adjoints` convert). Compared with the
normalised iterations of the slot kernels the values agree to rounding, and
beyond: where those floor a message whose sums underflowed, these keep it
(their clamp is the floor of a whole message).
"""

import math

import numpy as np
from numba import njit

from ._trw_grid import _AFTER, _BEFORE, _transpose_all, _transpose_plane, _views
from .trw import _RHO_HALF, _RHO_ONE, _limits_of, _push


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _q_bounds(half, floor, one):
    """The clamp of ``q``: the ratios ``floor`` and ``1 / floor``, to the power rho."""
    low = math.sqrt(floor) if half else floor
    return low, one / low


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _pair_of_q(q, half, floor, one):
    """The normalised message ``(m(0), m(1))`` of ``q``; at the clamp, the
    floored entry is exactly ``floor``."""
    low, high = _q_bounds(half, floor, one)
    if q <= low:
        return one, floor
    if q >= high:
        return floor, one
    r = q * q if half else q
    m0 = one / (one + r)
    return max(m0, floor), max(r * m0, floor)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _q_of_pair(m0, m1, half, floor, one):
    low, high = _q_bounds(half, floor, one)
    r = m1 / m0
    q = math.sqrt(r) if half else r
    return min(max(q, low), high)


@njit(cache=True, nogil=True, error_model="numpy")
def q_of_messages(M, slot_pos, half, Q):
    """``Q`` (planes of q, absent neighbours 1) from the (2E, 2) slot-layout messages ``M``."""
    floor, _, _, _, _, _, one = _limits_of(Q)
    Q.fill(one)
    for k in range(M.shape[0]):
        Q[slot_pos[k]] = _q_of_pair(M[k, 0], M[k, 1], half, floor, one)


@njit(cache=True, nogil=True, error_model="numpy")
def message_pairs(Q, slot_pos, half, M):
    """The (2E, 2) slot-layout messages of the planes ``Q``."""
    floor, _, _, _, _, _, one = _limits_of(Q)
    for k in range(M.shape[0]):
        M[k, 0], M[k, 1] = _pair_of_q(Q[slot_pos[k]], half, floor, one)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _log_add(a, b):
    top = max(a, b)
    return top + math.log1p(math.exp(-abs(a - b)))


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _log_terms(backward, half, a, l, snd, geometry, unary, pairwise, qo, qr, xa, xb):
    """The logs of the update at ``(a, l)``, from ``theta`` and ``log q``:
    the two terms of each sum, ``(t_n + log D, log g + t_11)`` and
    ``(t_00 + log D, log g + t_d)`` (tables without their shift)."""
    e = geometry[0] + a * geometry[1] + l * geometry[2]
    u = snd * geometry[3] + l * geometry[4]
    inv_rho = 2.0 if half else 1.0
    log_g = (unary[u, 1] - unary[u, 0]) + math.log(qo) + math.log(xa) + math.log(xb)
    log_d = math.log(qr) if half else 0.0
    if backward:  # the sender is x_j: the receiver's label indexes the table's rows
        tn, td = pairwise[e, 1, 0], pairwise[e, 0, 1]
    else:
        tn, td = pairwise[e, 0, 1], pairwise[e, 1, 0]
    return (tn * inv_rho + log_d, log_g + pairwise[e, 1, 1] * inv_rho,
            pairwise[e, 0, 0] * inv_rho + log_d, log_g + td * inv_rho)


@njit(cache=True, nogil=True, error_model="numpy")
def _log_lane(backward, half, a, l, snd, geometry, unary, pairwise, qo, qr, xa, xb):
    """``q`` of the update at ``(a, l)`` in the log domain (the rare lanes of :func:`_phase`)."""
    n0, n1, d0, d1 = _log_terms(backward, half, a, l, snd, geometry, unary, pairwise, qo, qr, xa, xb)
    log_r = _log_add(n0, n1) - _log_add(d0, d1)
    return math.exp(log_r / 2.0) if half else math.exp(log_r)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _plain(p1, p2, num, den, tiny, huge):
    """Whether an update is exact to rounding in plain arithmetic: both
    partial products of ``g`` and both sums normal and finite (``&``, not
    ``and``: no branches, so that the lane loops stay vector code)."""
    return (p1 > tiny) & (p1 < huge) & (p2 > tiny) & (p2 < huge) & (num > tiny) & (num < huge) & (den > tiny) & (
        den < huge)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _update_lines(backward, Qo, Xx, Eo, T, a):
    """The lines an update at ``(a, .)`` reads, its sender's index and its
    receiver's: ``(snd, rcv, q_o, q_r, x_a, x_b, E, t_n, t_11, t_00, t_d)``."""
    snd = a + 1 if backward else a
    rcv = a if backward else a + 1
    po = _AFTER if backward else _BEFORE  # the sender's other own messages
    pr = _BEFORE if backward else _AFTER  # the reverse messages into the sender
    tn, td = (T[a, 1, 0], T[a, 0, 1]) if backward else (T[a, 0, 1], T[a, 1, 0])
    return (snd, rcv, Qo[snd, po, 0], Qo[snd, pr, 0], Xx[snd, _BEFORE, 0], Xx[snd, _AFTER, 0], Eo[snd], tn,
            T[a, 1, 1], T[a, 0, 0], td)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _sums(half, one, e, qo, qr, xa, xb, tn, t11, t00, td):
    """Lane values of an update: the partial products of ``g``, ``g``, and
    the two sums ``t_n D + g t_11``, ``t_00 D + g t_d``."""
    p1 = e * qo
    p2 = xa * xb
    g = p1 * p2
    d = qr if half else one
    return p1, p2, g, tn * d + g * t11, t00 * d + g * td


@njit(cache=True, nogil=True, error_model="numpy")
def _phase(backward, rho_token, Qo, Xx, Eo, T, geometry, unary, pairwise, lines):
    """One phase of a TRW iteration in ratios, line after line (the order of
    ``_trw_grid._phase``); returns the number of log-domain lanes. ``Qo``,
    ``Xx``: ``[a, p, 0, l]`` planes of q (own family; the other family's,
    transposed), ``Eo[a, l]``: E, ``T[a, x_i, x_j, l]``: the family's tables."""
    half = len(rho_token) == _RHO_HALF
    floor, tiny, huge, _, _, _, one = _limits_of(Qo)
    low, high = _q_bounds(half, floor, one)
    A = Qo.shape[0]
    L = Qo.shape[3]
    pt = _AFTER if backward else _BEFORE  # the plane written
    num = lines[0]
    den = lines[1]
    n_fallback = 0
    for step in range(A - 1):
        a = A - 2 - step if backward else step
        snd, rcv, qo, qr, xa, xb, e, tn, t11, t00, td = _update_lines(backward, Qo, Xx, Eo, T, a)
        out = Qo[rcv, pt, 0]
        n_bad = 0
        for l in range(L):
            p1, p2, _, n, m = _sums(half, one, e[l], qo[l], qr[l], xa[l], xb[l], tn[l], t11[l], t00[l], td[l])
            num[l] = n
            den[l] = m
            n_bad += not _plain(p1, p2, n, m, tiny, huge)
        for l in range(L):
            r = num[l] / den[l]
            out[l] = min(max(math.sqrt(r) if half else r, low), high)
        if n_bad:
            for l in range(L):
                if not _plain(e[l] * qo[l], xa[l] * xb[l], num[l], den[l], tiny, huge):
                    q = _log_lane(backward, half, a, l, snd, geometry, unary, pairwise, qo[l], qr[l], xa[l], xb[l])
                    out[l] = min(max(q, low), high)
            n_fallback += n_bad
    return n_fallback


@njit(cache=True, nogil=True, error_model="numpy")
def _run(n_sweeps, push_slot, stack, H, W, Q, X, E_h, E_v, T_h, T_v, rho_token, geometry_h, geometry_v, unary,
         pairwise, lines):
    """``n_sweeps`` iterations on the planes ``Q``, as ``_trw_grid._run``
    (``X``: room for the other family's q, transposed); before iteration
    ``it`` the planes are kept in ``stack[push_slot[it]]`` when that is >= 0."""
    _transpose_all(H, W, Q, X)
    Qh, Qv = _views(Q, H, W, 1)
    Vh, Hv = _views(X, H, W, 1)
    n_fallback = 0
    for it in range(n_sweeps):
        if push_slot[it] >= 0:
            _push(stack, stack[:0], push_slot[it], Q, Q)
        for phase in range(4):
            backward = phase >= 2  # at run time: one compilation for both sweeps
            written = _AFTER if backward else _BEFORE
            if phase == 0 or phase == 3:
                n_fallback += _phase(backward, rho_token, Qh, Vh, E_h, T_h, geometry_h, unary, pairwise, lines)
                _transpose_plane(Qh, written, Hv)
            else:
                n_fallback += _phase(backward, rho_token, Qv, Hv, E_v, T_v, geometry_v, unary, pairwise, lines)
                _transpose_plane(Qv, written, Vh)
    return n_fallback


def unary_ratios(eu_planes):
    """``E = eu(1) / eu(0)`` of a family's ``[a, x, l]`` shifted exponentials
    (inf where ``eu(0)`` underflowed: those lanes take the log-domain path)."""
    with np.errstate(divide="ignore", over="ignore"):
        return np.divide(eu_planes[:, 1], eu_planes[:, 0])


def rho_token_of(rho_mode):
    """The rho class these kernels run (1/2 or 1) as a tuple length, else None."""
    return (0,) * rho_mode if rho_mode in (_RHO_HALF, _RHO_ONE) else None


# ---------------------------------------------------------------------------
# the reverse sweeps (Algorithm "Back TRW", step 8, for the updates above)
# ---------------------------------------------------------------------------


@njit(cache=True, nogil=True, error_model="numpy")
def q_adjoints(Madj, M, Q, slot_pos, half, Qadj):
    """The scaled adjoints ``dL / d log q`` of the planes ``Q`` from those of
    the slot-layout messages ``M`` (``Madj``: ``s(x) = m(x) dL / dm(x)``, as
    ``trw._backward_start`` gives them): ``d log m(0) / d log r = -m(1)``,
    ``d log m(1) / d log r = m(0)`` and ``log q = rho log r``. Scaled, every
    adjoint of the reverse sweeps stays bounded where messages are tiny."""
    floor, _, _, _, zero, _, one = _limits_of(Q)
    low, high = _q_bounds(half, floor, one)
    inv_rho = 2 * one if half else one
    Qadj.fill(zero)
    for k in range(M.shape[0]):
        pos = slot_pos[k]
        if Q[pos] <= low or Q[pos] >= high:  # a floored entry: the clamp passes nothing back
            continue
        Qadj[pos] = (Madj[k, 1] * M[k, 0] - Madj[k, 0] * M[k, 1]) * inv_rho


@njit(cache=True, nogil=True, error_model="numpy")
def _log_weights(backward, half, a, l, snd, geometry, unary, pairwise, qo, qr, xa, xb):
    """The shares of the ``g`` terms in the two sums of the update at
    ``(a, l)``, in the log domain (the lanes :func:`_log_lane` computed)."""
    n0, n1, d0, d1 = _log_terms(backward, half, a, l, snd, geometry, unary, pairwise, qo, qr, xa, xb)
    return math.exp(n1 - _log_add(n0, n1)), math.exp(d1 - _log_add(d0, d1))


@njit(cache=True, nogil=True, error_model="numpy")
def _reverse_phase(backward, rho_token, Qo, Xx, Ao, held, Eo, T, GP, snap_o, geometry, unary, pairwise, lines):
    """The updates of :func:`_phase` in reverse order. All adjoints are of
    logarithms (bounded where messages are tiny): ``Ao``: ``dL / d log q`` of
    ``Qo``; ``held[a, l]``: sender ``(a, l)``'s ``dL / d log g``, which
    :func:`_add_held` passes on to ``log E`` and to the other family's
    planes after the phase; ``GP[a, x_i 2 + x_j, l]``: ``dL / d log T``. With
    ``w_n``, ``w_d`` the shares of the ``g`` terms in the two sums, ``log r``
    passes ``w_n - w_d`` to ``log g`` (so to ``log E``, ``log q_o``,
    ``log x_a``, ``log x_b``), ``w_d - w_n`` to ``log q_r`` (rho = 1/2) and
    ``1 - w_n``, ``w_n``, ``w_d - 1``, ``-w_d`` to the logs of ``t_n``,
    ``t_11``, ``t_00``, ``t_d``. The written messages are restored from the
    snapshot planes ``snap_o``, their adjoints spent."""
    half = len(rho_token) == _RHO_HALF
    floor, tiny, huge, _, zero, _, one = _limits_of(Qo)
    low, high = _q_bounds(half, floor, one)
    rho = one / 2 if half else one
    A = Qo.shape[0]
    L = Qo.shape[3]
    pt = _AFTER if backward else _BEFORE
    pr = _BEFORE if backward else _AFTER
    po = _AFTER if backward else _BEFORE
    gn, gd = (2, 1) if backward else (1, 2)  # t_n, t_d as x_i 2 + x_j
    w_num = lines[0]
    w_den = lines[1]
    for step in range(A - 1):
        a = step if backward else A - 2 - step
        snd, rcv, qo, qr, xa, xb, e, tn, t11, t00, td = _update_lines(backward, Qo, Xx, Eo, T, a)
        ao, ar, hg = Ao[snd, po, 0], Ao[snd, pr, 0], held[snd]
        out, adj, snap = Qo[rcv, pt, 0], Ao[rcv, pt, 0], snap_o[rcv, pt, 0]
        g00, g11, gtn, gtd = GP[a, 0], GP[a, 3], GP[a, gn], GP[a, gd]
        # the shares, in plain arithmetic (vector code), then again in the log domain where needed
        n_bad = 0
        for l in range(L):
            p1, p2, g, num, den = _sums(half, one, e[l], qo[l], qr[l], xa[l], xb[l], tn[l], t11[l], t00[l], td[l])
            w_num[l] = g * t11[l] / num
            w_den[l] = g * td[l] / den
            n_bad += not _plain(p1, p2, num, den, tiny, huge)
        if n_bad:
            for l in range(L):
                p1, p2, _, num, den = _sums(half, one, e[l], qo[l], qr[l], xa[l], xb[l], tn[l], t11[l], t00[l], td[l])
                if not _plain(p1, p2, num, den, tiny, huge):
                    w_num[l], w_den[l] = _log_weights(backward, half, a, l, snd, geometry, unary, pairwise, qo[l],
                                                      qr[l], xa[l], xb[l])
        for l in range(L):
            live = (out[l] > low) & (out[l] < high)  # else clamped: nothing passes back
            adjoint_log_r = rho * adj[l] if live else zero
            wn = w_num[l]
            wd = w_den[l]
            adjoint_log_g = adjoint_log_r * (wn - wd)
            ao[l] += adjoint_log_g
            hg[l] = adjoint_log_g  # log E's, x_a's and x_b's too: added after the phase
            if half:
                ar[l] -= adjoint_log_g
            gtn[l] += adjoint_log_r * (one - wn)
            g11[l] += adjoint_log_r * wn
            g00[l] -= adjoint_log_r * (one - wd)
            gtd[l] -= adjoint_log_r * wd
            out[l] = snap[l]
            adj[l] = zero


@njit(cache=True, nogil=True, error_model="numpy")
def _add_held(held, first, n, EG, Ax):
    """After a reverse phase: the adjoint of ``log g`` that each sender
    ``a = first, ..., first + n - 1`` kept in ``held[a, l]`` goes to its
    ``log E`` (``EG[a, l]``) and to the other family's two planes that it
    read, in their layout (``Ax[l, p, 0, a]``, tile by tile). One value
    written per update instead of three accumulated."""
    L = held.shape[1]
    for a in range(first, first + n):
        for l in range(L):
            EG[a, l] += held[a, l]
    for a0 in range(first, first + n, 32):
        a1 = min(a0 + 32, first + n)
        for l in range(L):
            source = held[a0:a1, l]
            before = Ax[l, _BEFORE, 0, a0:a1]
            after = Ax[l, _AFTER, 0, a0:a1]
            for i in range(a1 - a0):
                before[i] += source[i]
                after[i] += source[i]


@njit(cache=True, nogil=True, error_model="numpy")
def reverse_sweep(H, W, Q, X, Qadj, held, snap, E_h, E_v, EG_h, EG_v, T_h, T_v, GP_h, GP_v, rho_token, geometry_h,
                  geometry_v, unary, pairwise, lines):
    """Step 8 for a whole iteration of :func:`_run` (its four phases in
    reverse), restoring the planes ``Q`` from the snapshot ``snap``; ``X``
    holds the other family's planes transposed (kept so), ``held``: room
    for ``H W`` values, a phase's senders' adjoints of ``log g``
    (:func:`_add_held`)."""
    Qh, Qv = _views(Q, H, W, 1)
    Vh, Hv = _views(X, H, W, 1)
    Ah, Av = _views(Qadj, H, W, 1)
    Gh = held[:W * H].reshape((W, H))  # a family's senders' adjoints of log g ([a, l], as E)
    Gv = held[:H * W].reshape((H, W))
    Sh, Sv = _views(snap, H, W, 1)
    for phase in range(4):
        backward = phase < 2
        restored = _AFTER if backward else _BEFORE
        first = 1 if backward else 0  # the senders: first, ..., first + A - 2
        if phase == 0 or phase == 3:
            _reverse_phase(backward, rho_token, Qh, Vh, Ah, Gh, E_h, T_h, GP_h, Sh, geometry_h, unary, pairwise, lines)
            _transpose_plane(Qh, restored, Hv)
            _add_held(Gh, first, W - 1, EG_h, Av)
        else:
            _reverse_phase(backward, rho_token, Qv, Hv, Av, Gv, E_v, T_v, GP_v, Sv, geometry_v, unary, pairwise, lines)
            _transpose_plane(Qv, restored, Vh)
            _add_held(Gv, first, H - 1, EG_v, Ah)


@njit(cache=True, nogil=True, error_model="numpy")
def add_unary_adjoints(EG, stride_a, stride_l, g_u):
    """``g_u[u, 1] += EG[a, l]``, ``g_u[u, 0] -= EG[a, l]`` for the nodes
    ``u = a stride_a + l stride_l`` of a family's layout."""
    for a in range(EG.shape[0]):
        for l in range(EG.shape[1]):
            u = a * stride_a + l * stride_l
            g_u[u, 1] += EG[a, l]
            g_u[u, 0] -= EG[a, l]
