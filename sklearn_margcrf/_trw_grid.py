"""TRW and back TRW on 4-connected image grids, a line of pixels at a time.

On the edges of :func:`sklearn_margcrf.grid_edges` (``H x W``), the schedule of
:mod:`sklearn_margcrf.trw` has four phases per iteration: the forward sweep
over the horizontal edges (messages rightwards, row by row) and then over the
vertical ones (downwards), the backward sweep over the vertical edges
(upwards) and then over the horizontal ones (leftwards). Within a phase, the
updates that send from one image column (horizontal edges) or one image row
(vertical edges) are independent: each reads the messages into its sender,
which no update of the same column / row writes. So a phase runs as a
sequence of *lines*, and each stage of an update (cavity, message,
normaliser, store) is one loop along the line ("lanes"), which the compiler
turns into vector instructions. Only independent updates change places, and
each computes exactly what the general kernels of :mod:`sklearn_margcrf.trw`
compute (the same operations in the same order), so forward and reverse
sweeps give bitwise the same results.

Layout. The messages into pixel ``(r, c)`` from its left, right, upper and
lower neighbours form four planes ``L, R, U, D``. A family's data are stored
line by line, every line contiguous: the horizontal planes as ``[c, p, x, r]``
(``p`` = L or R, ``x`` the label), the vertical ones as ``[r, p, x, c]``; so
are the tables, the adjoints and the pairwise gradients (``[a, x_i K + x_j,
l]``). A phase sees its family through ``(a, l)`` coordinates, ``a`` along the
sweep and ``l`` along the line: own planes ``[a, p, x, l]`` (``_BEFORE``: from
the neighbour at ``a - 1``, ``_AFTER``: from ``a + 1``), read contiguously
along the line. The other family's powers are read from a transposed copy
in the phase's own orientation, which each phase refreshes for the plane it
wrote (:func:`_transpose_plane`); its adjoints are updated after the phase,
in their own order. At the image border the absent neighbour's message is 1,
and so is its power: a product then skips it exactly, and ``rho log 1 = 0``
in the log domain. The powers have planes of their own for a general rho
and for rho = 1/2 (``_RHO_HALF_PLANES``: the square root once per message
written); for rho = 1 they are the messages. (Two labels with rho 1/2 or 1
run :mod:`sklearn_margcrf._trw_grid_binary` instead: one number per
message, see :class:`GridKernels`.) The inverses of the
messages, which the slot kernels keep, are computed where they are read
(``1 / m``, the same rounding), which spares their planes' memory and
traffic. One flat buffer holds the four planes (horizontal, then vertical).

Marginals, steps 6 and 7 of back TRW and the rare log-domain recomputations
are :mod:`sklearn_margcrf.trw`'s, on its slot layout; ``Grid`` converts.
"""

import math

import numpy as np
from numba import njit

from ._workspace import scratch, scratch_copy, scratch_full
from .trw import (
    _RHO_GENERAL,
    _RHO_HALF,
    _RHO_ONE,
    _limits_of,
    _live,
    _n_states,
    _log_cavity,
    _log_joint_of_cavity,
    _message_entry,
    _pairwise_top,
    _push,
    _rare_adjoint_terms,
    _table_block,
    table_blocks,
)

_BEFORE = 0  # plane L (horizontal family) or U (vertical)
_AFTER = 1  # plane R or D

# the grid kernels' own rho class besides trw's three: rho = 1/2 with power
# planes of its own (kept by GridKernels, see there)
_RHO_HALF_PLANES = 3


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _entry_mode(rho_mode):
    """trw's rho class of a grid class (how a message entry and its rho are derived)."""
    return _RHO_HALF if rho_mode == _RHO_HALF_PLANES else rho_mode


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _stores_powers(rho_mode):
    """Whether the power planes are planes of their own, written with the messages."""
    return rho_mode == _RHO_GENERAL or rho_mode == _RHO_HALF_PLANES


def grid_shape(n_nodes, edges):
    """``(H, W)`` when ``edges`` are exactly ``grid_edges(H, W)`` with
    ``H * W = n_nodes`` and at least one edge, else None."""
    height = _grid_height(n_nodes, np.asarray(edges, np.int64))
    return None if height == 0 else (height, n_nodes // height)


@njit(cache=True, nogil=True)
def _grid_height(n, edges):
    """H when ``edges`` are ``grid_edges(H, n // H)``, else 0: checked in one
    pass, without building the grid's edges (which cost a fit 6 MB of
    temporaries per image and evaluation at 232 x 315)."""
    E = edges.shape[0]
    if E == 0:
        return 0
    width = n  # the first vertical edge joins 0 and W; none: one row
    for e in range(E):
        if edges[e, 1] - edges[e, 0] != 1:
            width = edges[e, 1] - edges[e, 0]
            break
    if width < 1 or n % width:
        return 0
    height = n // width
    n_h = height * (width - 1)
    if E != n_h + (height - 1) * width:
        return 0
    for e in range(n_h):  # h(r, c) joins r W + c and r W + c + 1
        i = (e // (width - 1)) * width + e % (width - 1)
        if edges[e, 0] != i or edges[e, 1] != i + 1:
            return 0
    for e in range(n_h, E):  # v(r, c) joins r W + c and (r + 1) W + c
        i = e - n_h
        if edges[e, 0] != i or edges[e, 1] != i + width:
            return 0
    return height


class Grid:
    """The planes of an ``H x W`` grid and their map to the slot layout."""

    def __init__(self, height, width, slot_edge, slot_side, n_states):
        self.height, self.width, self.n_states = height, width, n_states
        self.slot_pos = scratch(slot_edge.shape[0], np.int64)
        _slot_positions(height, width, n_states, slot_edge, slot_side, self.slot_pos)
        # (first edge, edge stride along a, along l, node stride along a, along
        # l, H, W, whether the family's own planes come first in the cavity's
        # product): a run-time value, so that each phase kernel compiles once
        # for both families: 32 instead of 73 s of compilation per (K, dtype,
        # rho class), for whole-process CPU time ratios of 1.03 (float64) and
        # 1.01 (float32), within the noise of the measurement (0.95-1.12)
        self.geometry_h = np.array([0, 1, width - 1, 1, width, height, width, 0], np.int64)
        self.geometry_v = np.array([height * (width - 1), width, 1, width, 1, height, width, 1], np.int64)

    @property
    def size(self):
        return 4 * self.height * self.width * self.n_states

    def to_grid(self, slot_array, fill=1.0):
        """(2E, K) slot layout -> flat planes; absent neighbours get ``fill``."""
        flat = scratch(self.size, slot_array.dtype)
        flat.fill(fill)
        _copy_slots(slot_array, self.slot_pos, self.height, self.width, flat, True)
        return flat

    def to_slots(self, flat, out=None):
        """Flat planes -> (2E, K) slot layout (into ``out`` when given)."""
        if out is None:
            out = scratch((self.slot_pos.shape[0], self.n_states), flat.dtype)
        _copy_slots(out, self.slot_pos, self.height, self.width, flat, False)
        return out


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _views(flat, H, W, K):
    half = 2 * K * H * W
    return flat[:half].reshape((W, 2, K, H)), flat[half:].reshape((H, 2, K, W))


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _label_stride(pos, H, W, K):
    """Distance between the labels of the message at flat position ``pos``."""
    return H if pos < 2 * K * H * W else W


@njit(cache=True, nogil=True, error_model="numpy")
def _slot_positions(H, W, K, slot_edge, slot_side, pos):
    """Flat position of label 0 of each slot's message (label ``x``: ``x`` line lengths further)."""
    n_h = H * (W - 1)
    for k in range(slot_edge.shape[0]):
        e = slot_edge[k]
        s = slot_side[k]
        if e < n_h:  # h(r, c) joins (r, c) and (r, c + 1); planes [x, c, r]
            r = e // (W - 1)
            c = e % (W - 1)
            if s == 0:  # into (r, c) from its right
                pos[k] = (c * 2 + _AFTER) * K * H + r
            else:  # into (r, c + 1) from its left
                pos[k] = ((c + 1) * 2 + _BEFORE) * K * H + r
        else:  # v(r, c) joins (r, c) and (r + 1, c); planes [x, r, c]
            r = (e - n_h) // W
            c = (e - n_h) % W
            if s == 0:  # into (r, c) from below
                pos[k] = 2 * K * H * W + (r * 2 + _AFTER) * K * W + c
            else:  # into (r + 1, c) from above
                pos[k] = 2 * K * H * W + ((r + 1) * 2 + _BEFORE) * K * W + c
    return pos


@njit(cache=True, nogil=True, error_model="numpy")
def _copy_slots(slot_array, slot_pos, H, W, flat, to_planes):
    """Copy between the (2E, K) slot layout and the flat planes (either way)."""
    K = slot_array.shape[1]
    for k in range(slot_array.shape[0]):
        stride = _label_stride(slot_pos[k], H, W, K)
        for x in range(K):
            if to_planes:
                flat[slot_pos[k] + x * stride] = slot_array[k, x]
            else:
                slot_array[k, x] = flat[slot_pos[k] + x * stride]


@njit(cache=True, nogil=True, error_model="numpy")
def build_grid_tables(kt, pairwise, rho, H, W, T_h, T_v, per_block, block, bits):
    """The tables of :func:`sklearn_margcrf.trw._build_tables` per family,
    ``T[a, x_i, x_j, l]`` for the edge from ``(a, l)`` to ``(a + 1, l)``, once
    per edge (each sweep reads it in its orientation); computed along the
    lines, so that the writes run along ``l`` (edge by edge, each entry of a
    horizontal edge's table fell in a cache line of its own); ``per_block``,
    ``block``, ``bits``: from ``trw.table_blocks``."""
    K = _n_states(kt, pairwise[0])
    KK = K * K
    n_h = H * (W - 1)
    for vertical in range(2):
        T = T_v if vertical else T_h
        A = T.shape[0]
        Lw = T.shape[3]
        for a in range(A):
            for l0 in range(0, Lw, per_block):
                n = min(per_block, Lw - l0)
                if vertical:  # edge n_h + a W + l
                    _table_block(kt, pairwise, rho, n_h + a * W + l0, 1, n, block, bits)
                else:  # edge l (W - 1) + a
                    _table_block(kt, pairwise, rho, l0 * (W - 1) + a, W - 1, n, block, bits)
                for xi in range(K):
                    for xj in range(K):
                        target = T[a, xi, xj, l0:l0 + n]  # a view: its loop from 0 (see _transpose_plane)
                        for j in range(n):
                            target[j] = block[j * KK + xi * K + xj]


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _add_row_terms(first, summed, Lw, c, u, v, z):
    """A sender label's term in a line's normalisers: ``z[l] = c[l] * row``
    (``first``), else ``z[l] += c[l] * row``, where ``row`` is ``u[l] + v[l]``
    (``summed``) or ``u[l]``. The row sums come from :func:`build_row_sums`
    (more than two labels: ``u``, a line of ``R``) or are summed here from a
    table's two lines ``u``, ``v``: with two labels (a general rho; rho 1/2
    and 1 run ``_trw_grid_binary``) a row sum is one addition, and not
    keeping them spares 2 E K values (3.8 MB at 200 x 300 in float64). The
    branches stay outside the lane loops."""
    if summed:
        if first:
            for l in range(Lw):
                z[l] = c[l] * (u[l] + v[l])
        else:
            for l in range(Lw):
                z[l] += c[l] * (u[l] + v[l])
    elif first:
        for l in range(Lw):
            z[l] = c[l] * u[l]
    else:
        for l in range(Lw):
            z[l] += c[l] * u[l]


@njit(cache=True, nogil=True, error_model="numpy")
def build_row_sums(T, R):
    """``R[a, d, x, l]``: the sum of edge ``(a, l)``'s table over the
    receiver's label, sender label ``x``, for the forward (``d = 0``) and the
    backward sweep (``d = 1``), as ``trw._build_tables`` sums its rows (the
    same order, so the same rounding). Built once per backward pass for its
    normalisers: summed in each reverse update instead, they took about a
    tenth of a K = 8 backward pass (200 x 300, float64: 0.81-0.83 s against
    0.74-0.76 s without them), for 2 E K values in memory."""
    K = T.shape[1]
    for a in range(T.shape[0]):
        for x in range(K):
            for l in range(T.shape[3]):
                R[a, 0, x, l] = T[a, x, 0, l]
                R[a, 1, x, l] = T[a, 0, x, l]
            for y in range(1, K):
                for l in range(T.shape[3]):
                    R[a, 0, x, l] += T[a, x, y, l]
                    R[a, 1, x, l] += T[a, y, x, l]


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _cavity_line(K, own_first, pr, snd, eu_o, Mo, Po, Xx, cav, one, rho_mode):
    """Step (a): the cavity of every sender of the line, in the product order
    of the slot kernels (slots of the sender backwards: D, U, R, L). The
    other family's powers come from their transposed copy ``Xx`` (see
    :func:`_transpose_plane`), so every read runs along the line."""
    Lw = Mo.shape[3]
    for x in range(K):
        for l in range(Lw):
            v = eu_o[snd, x, l] * (one / Mo[snd, pr, x, l])
            oa = Po[snd, _AFTER, x, l]
            ob = Po[snd, _BEFORE, x, l]
            xa = Xx[snd, _AFTER, x, l]
            xb = Xx[snd, _BEFORE, x, l]
            if own_first:  # vertical family: own planes are U, D
                v = v * oa * ob * xa * xb
            else:
                v = v * xa * xb * oa * ob
            cav[x, l] = v


# the side of the square tiles of _transpose_plane
_TILE = 32


@njit(cache=True, nogil=True, error_model="numpy")
def _transpose_plane(P, p, X):
    """``X[l, p, x, a] = P[a, p, x, l]``: plane ``p`` of a family's powers
    into the other family's orientation, where that family's cavities read
    them along their lines. Copied tile by tile (``_TILE`` entries square),
    so that reads and writes both run along rows of whole cache lines: read
    in place instead, a line's cavity touched a cache line (and, 300 pixels
    along a line at K = 8, a page) per entry. Measured (200 x 300, K = 8,
    float64, 20 iterations, minimum of 5 runs in a process, three process
    pairs): the forward pass 0.49-0.51 s against 0.56-0.59, the backward pass
    0.87-0.89 s against 1.09-1.13 (K = 2: 0.076-0.078 / 0.086-0.091 s and
    0.111-0.118 / 0.132-0.149 s), for one more set of planes in memory.
    Each tile row goes through 1-D views (200 x 300 plane, K = 8, alone:
    0.18 ms against 0.36 in float32, 0.22 against 0.39 in float64; within a
    sweep, where the planes are cold, 0.52-0.63 ms against 0.63-0.75)."""
    A = P.shape[0]
    K = P.shape[2]
    L = P.shape[3]
    for a0 in range(0, A, _TILE):
        a1 = min(a0 + _TILE, A)
        for x in range(K):
            for l0 in range(0, L, _TILE):
                for l in range(l0, min(l0 + _TILE, L)):
                    # one tile row through 1-D views, looped from 0: numba
                    # maps a negative index to its wrapped position, and only
                    # in a loop from 0 can LLVM drop that test
                    source = P[a0:a1, p, x, l]
                    target = X[l, p, x, a0:a1]
                    for i in range(a1 - a0):
                        target[i] = source[i]


@njit(cache=True, nogil=True, error_model="numpy")
def _log_joint_at(K, backward, a, l, snd, geometry, slot_of, ptr, rho_slot, rho_c, unary, pairwise, flat_M, slot_pos,
                  H, W, loc, cav1, q):
    """:func:`sklearn_margcrf.trw._log_joint` of the update at ``(a, l)``: the
    sender's messages gathered from the planes into slot order."""
    e = geometry[0] + a * geometry[1] + l * geometry[2]
    s = 0 if backward else 1
    r = slot_of[e, 1 - s]
    u = snd * geometry[3] + l * geometry[4]
    lo = ptr[u]
    hi = ptr[u + 1]
    for k in range(lo, hi):
        for x in range(K):
            loc[k - lo, x] = flat_M[slot_pos[k] + x * _label_stride(slot_pos[k], H, W, K)]
    _log_cavity(u, r - lo, 0, hi - lo, unary, rho_slot[lo:hi], loc, cav1)
    _log_joint_of_cavity(e, s, rho_c, pairwise, cav1, q)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _store_line(K, Lw, pt, rcv, out, inv, RHOo, Mo, Po, floor, one, rho_mode):
    """The new messages of a line, ``out / total``."""
    for x in range(K):
        for l in range(Lw):
            m, _, p = _message_entry(out[x, l] * inv[l], _entry_mode(rho_mode), RHOo[rcv, pt, l], floor, one)
            Mo[rcv, pt, x, l] = m
            if _stores_powers(rho_mode):  # else Po is Mo
                Po[rcv, pt, x, l] = p


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _message_line(K, Lw, backward, a, T, cav, out):
    """Step (b): ``out[x_v] = sum over x_u of cav[x_u] tab[x_u, x_v]``, the
    terms of each ``out[x_v]`` added in the order of ``x_u``. The loops run in
    the table's memory order, ``[a, x_v, x_u, l]`` for the backward sweep and
    ``[a, x_u, x_v, l]`` for the forward one, so that a line's table streams
    through once (the same sums, bitwise)."""
    if backward:
        for xv in range(K):
            for l in range(Lw):
                out[xv, l] = cav[0, l] * T[a, xv, 0, l]
            for xu in range(1, K):
                for l in range(Lw):
                    out[xv, l] += cav[xu, l] * T[a, xv, xu, l]
    else:
        for xv in range(K):
            for l in range(Lw):
                out[xv, l] = cav[0, l] * T[a, 0, xv, l]
        for xu in range(1, K):
            for xv in range(K):
                for l in range(Lw):
                    out[xv, l] += cav[xu, l] * T[a, xu, xv, l]


@njit(cache=True, nogil=True, error_model="numpy")
def _phase(kt, backward, Mo, Po, Xx, flat_M, eu_o, T, RHOo, rho_token, geometry, slot_of, ptr,
           rho_slot, unary, pairwise, slot_pos, scratch, bad, loc, cav1, q):
    """One phase of a TRW iteration (Eq. TRW-msgs), line after line; returns
    the number of log-domain fallbacks. The forward sweep (``backward`` False)
    writes the ``_BEFORE`` plane at ``a + 1`` from the sender at ``a``, the
    backward sweep the ``_AFTER`` plane at ``a`` from the sender at ``a + 1``."""
    K = len(kt) if len(kt) > 0 else Mo.shape[2]
    floor, tiny, huge, _, _, _, one = _limits_of(eu_o)
    rho_mode = len(rho_token)  # a constant (see GridKernels.rho_token)
    own_first = geometry[7] == 1
    A = Mo.shape[0]
    Lw = Mo.shape[3]
    H = geometry[5]
    W = geometry[6]
    cav = scratch[:K]
    out = scratch[K:2 * K]
    total = scratch[2 * K]
    inv = scratch[2 * K + 1]
    pt = _AFTER if backward else _BEFORE  # the plane written
    pr = _BEFORE if backward else _AFTER  # the reverse messages
    n_fallback = 0
    for step in range(A - 1):
        a = A - 2 - step if backward else step
        snd = a + 1 if backward else a
        rcv = a if backward else a + 1
        _cavity_line(K, own_first, pr, snd, eu_o, Mo, Po, Xx, cav, one, rho_mode)
        _message_line(K, Lw, backward, a, T, cav, out)
        for l in range(Lw):
            total[l] = out[0, l]
        for x in range(1, K):
            for l in range(Lw):
                total[l] += out[x, l]
        n_bad = 0
        for l in range(Lw):
            if not (total[l] > tiny and total[l] < huge):
                bad[n_bad] = l
                n_bad += 1
        for l in range(Lw):
            inv[l] = one / total[l]
        # one loop per rho class, each free of branches
        _store_line(K, Lw, pt, rcv, out, inv, RHOo, Mo, Po, floor, one, rho_mode)
        for b in range(n_bad):  # these lanes again, in the log domain
            l = bad[b]
            n_fallback += 1
            rho_c = RHOo[rcv, pt, l]
            _log_joint_at(K, backward, a, l, snd, geometry, slot_of, ptr, rho_slot, rho_c, unary, pairwise, flat_M,
                          slot_pos, H, W, loc, cav1, q)
            for xv in range(K):
                m = q[0, xv]
                for xu in range(1, K):
                    m += q[xu, xv]
                m, _, p = _message_entry(m, _entry_mode(rho_mode), rho_c, floor, one)
                Mo[rcv, pt, xv, l] = m
                if _stores_powers(rho_mode):
                    Po[rcv, pt, xv, l] = p
    return n_fallback


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _sender_adjoints(K, Lw, snd, pr, h, Mo, RHOo, Ao, floor, zero, half, one, rho_mode):
    """Step (e) for a line, the own family's planes: ``rho_d h / m_d`` into
    the adjoints of the messages into the senders, then ``-h / m_c`` into the
    reverse ones (times ``m``: the adjoints are scaled)."""
    for p in range(2):
        rh = RHOo[snd, p]
        for x in range(K):
            for l in range(Lw):
                rk = _line_rho(rho_mode, rh, l, half, one)
                Ao[snd, p, x, l] += _live(rk * h[x, l], Mo[snd, p, x, l], floor, zero)
    for x in range(K):
        for l in range(Lw):
            Ao[snd, pr, x, l] -= _live(h[x, l], Mo[snd, pr, x, l], floor, zero)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _other_adjoints(K, s0, n, held, Mx, RHOx, Ax, floor, zero, half, one, rho_mode):
    """Step (e) for a whole phase, the other family's planes, from the kept
    ``held[l, x, a] = h`` of every sender: each of these adjoints receives
    one term per phase and none is read within it, so they can wait for the
    end of the phase and then be updated in their own (contiguous) order;
    the senders are at ``s0, ..., s0 + n - 1``."""
    for l in range(Ax.shape[0]):
        for p in range(2):
            rh = RHOx[l, p, s0:s0 + n]
            for x in range(K):
                target, h, m = Ax[l, p, x, s0:s0 + n], held[l, x, s0:s0 + n], Mx[l, p, x, s0:s0 + n]
                for i in range(n):
                    rk = _line_rho(rho_mode, rh, i, half, one)
                    target[i] += _live(rk * h[i], m[i], floor, zero)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _line_rho(rho_mode, rh, i, half, one):
    """Entry ``i`` of a line of rho values ``rh`` (constant for the uniform classes)."""
    if rho_mode == _RHO_HALF:
        return half
    if rho_mode == _RHO_ONE:
        return one
    return rh[i]


@njit(cache=True, nogil=True, error_model="numpy")
def _reverse_phase(kt, backward, restore, Mo, Po, Xx, Mx, flat_M, snap_o, snap_pow_o, eu_o, T, R,
                   RHOo, RHOx, rho_token, Ao, Ax, GP, g_u, geometry, slot_of, ptr, rho_slot, unary, pairwise, slot_pos,
                   scratch, adjoint_scratch, adjoint_held, bad, loc, cav1, q):
    """Step 8 of Algorithm "Back TRW" for every update of a phase, in the
    reverse order of :func:`_phase` (see ``trw._reverse_sweep``, whose steps
    (a)-(g) this follows lane by lane). ``Ao`` / ``Ax``: adjoint messages,
    ``GP[a, x_i K + x_j, l]``: the family's pairwise adjoints; with
    ``restore``, the messages are restored from the snapshot planes
    ``snap_o`` (``snap_pow_o``)."""
    K = len(kt) if len(kt) > 0 else Mo.shape[2]
    floor, tiny, huge, _, zero, half, one = _limits_of(eu_o)
    rho_mode = len(rho_token)
    own_first = geometry[7] == 1
    keep_pow = snap_pow_o.shape[0] > 0
    A = Mo.shape[0]
    Lw = Mo.shape[3]
    H = geometry[5]
    W = geometry[6]
    cav = scratch[:K]
    z = scratch[K]
    inv = scratch[K + 1]
    rv = adjoint_scratch[:K]
    h = adjoint_scratch[K:2 * K]
    dot = adjoint_scratch[2 * K]  # the sum of the scaled adjoints, then of |nu / m|
    held = adjoint_held[:Lw * K * A].reshape((Lw, K, A))
    pt = _AFTER if backward else _BEFORE
    pr = _BEFORE if backward else _AFTER
    d = 1 if backward else 0  # the sweep's row sums
    for step in range(A - 1):
        a = step if backward else A - 2 - step
        snd = a + 1 if backward else a
        rcv = a if backward else a + 1
        # (b) nu / m_ci = g - g . m_ci, from the scaled adjoints m_ci g held
        # in Ao: Ao / m_ci - sum Ao (trw.backnorm_ratio_of_scaled, lane by lane)
        for l in range(Lw):
            dot[l] = Ao[rcv, pt, 0, l]
        for x in range(1, K):
            for l in range(Lw):
                dot[l] += Ao[rcv, pt, x, l]
        for x in range(K):
            for l in range(Lw):
                rv[x, l] = Ao[rcv, pt, x, l] * (one / Mo[rcv, pt, x, l]) - dot[l]
        for l in range(Lw):  # trw._moderate's sum, lane by lane
            dot[l] = abs(rv[0, l])
        for x in range(1, K):
            for l in range(Lw):
                dot[l] += abs(rv[x, l])
        # (a) s = tab * A(x_u), and its sum Z
        _cavity_line(K, own_first, pr, snd, eu_o, Mo, Po, Xx, cav, one, rho_mode)
        kept = R.shape[0] > 0  # the row sums (more than two labels)
        for x in range(K):
            if kept:
                u = v = R[a, d, x]
            elif backward:
                u, v = T[a, 0, x], T[a, 1, x]
            else:
                u, v = T[a, x, 0], T[a, x, 1]
            _add_row_terms(x == 0, not kept, Lw, cav[x], u, v, z)
        n_bad = 0
        for l in range(Lw):
            if z[l] > tiny and z[l] < huge and dot[l] < huge:
                inv[l] = one / z[l]
            else:  # zero contributions here, the rare path's below
                bad[n_bad] = l
                n_bad += 1
                inv[l] = zero
                for x in range(K):
                    cav[x, l] = zero
                    rv[x, l] = zero
        for x in range(K):
            for l in range(Lw):
                h[x, l] = 0.0
        # (c) val = ((A tab) / Z) (nu / m_ci) into g_p; h = sum over x_i
        for outer in range(K):
            for inner in range(K):
                # the table's and the adjoints' memory order (see _message_line);
                # each h[x_u] gets its terms in the order of x_v either way
                xv, xu = (outer, inner) if backward else (inner, outer)
                # the lines chosen before the lane loop, which then has no branch
                tab, gp = (T[a, xv, xu], GP[a, xv * K + xu]) if backward else (T[a, xu, xv], GP[a, xu * K + xv])
                c, r, hu = cav[xu], rv[xv], h[xu]
                for l in range(Lw):
                    val = c[l] * tab[l] * inv[l] * r[l]
                    gp[l] += val
                    hu[l] += val
        for b in range(n_bad):
            l = bad[b]
            _log_joint_at(K, backward, a, l, snd, geometry, slot_of, ptr, rho_slot, RHOo[rcv, pt, l], unary,
                          pairwise, flat_M, slot_pos, H, W, loc, cav1, q)
            _rare_adjoint_terms(K, q, Ao[rcv, pt, :, l], Mo[rcv, pt, :, l], one, h[:, l])
            for xv in range(K):
                gi0 = xv * K if backward else xv
                for xu in range(K):
                    GP[a, gi0 + (xu if backward else xu * K), l] += q[xu, xv]
        # (d) theta_u (in node order for the vertical family, else after the
        # phase); (e) the sender's adjoint messages: own planes now, the other
        # family's after the phase
        if own_first:
            for l in range(Lw):
                for x in range(K):
                    g_u[snd * geometry[3] + l * geometry[4], x] += h[x, l]
        for x in range(K):
            for l in range(Lw):
                held[l, x, snd] = h[x, l]
        _sender_adjoints(K, Lw, snd, pr, h, Mo, RHOo, Ao, floor, zero, half, one, _entry_mode(rho_mode))
        # (f) restore m_ci; (g) its adjoint is spent
        if restore:
            for x in range(K):
                for l in range(Lw):
                    m = snap_o[rcv, pt, x, l]
                    Mo[rcv, pt, x, l] = m
                    if keep_pow:
                        Po[rcv, pt, x, l] = snap_pow_o[rcv, pt, x, l]
                    elif rho_mode == _RHO_HALF_PLANES:  # the snapshots keep no powers: as _message_entry derives them
                        Po[rcv, pt, x, l] = math.sqrt(m)
        for x in range(K):
            for l in range(Lw):
                Ao[rcv, pt, x, l] = 0.0
    first = 1 if backward else 0  # the senders: first, ..., first + A - 2
    _other_adjoints(K, first, A - 1, held, Mx, RHOx, Ax, floor, zero, half, one, _entry_mode(rho_mode))
    if not own_first:  # horizontal family: theta_u in node order, (r, c, x)
        for l in range(Lw):
            for a in range(first, first + A - 1):
                for x in range(K):
                    g_u[a * geometry[3] + l * geometry[4], x] += held[l, x, a]


@njit(cache=True, nogil=True, error_model="numpy")
def grid_sweep(kt, H, W, M, P, X, eu_h, eu_v, T_h, T_v, rho_h, rho_v, rho_token, geometry_h, geometry_v, slot_of,
               ptr, rho_slot, unary, pairwise, slot_pos, scratch, bad, loc, cav1, q):
    """One TRW iteration on the flat plane buffers ``M``, ``P`` (messages,
    powers); returns the number of log-domain fallbacks. ``X`` holds the
    powers transposed (:func:`_transpose_all`) and is kept so: after each
    phase, the plane it wrote."""
    K = eu_h.shape[1]
    Mh, Mv = _views(M, H, W, K)
    Ph, Pv = _views(P, H, W, K)
    Vh, Hv = _views(X, H, W, K)
    n = 0
    for phase in range(4):
        # computed at run time: a literal True / False would compile _phase
        # twice, once per sweep (each compilation of the line kernels takes
        # seconds; they are compiled for every dtype, label and rho class)
        backward = phase >= 2
        written = _AFTER if backward else _BEFORE
        if phase == 0 or phase == 3:  # the horizontal family
            n += _phase(kt, backward, Mh, Ph, Vh, M, eu_h, T_h, rho_h, rho_token, geometry_h, slot_of, ptr, rho_slot,
                        unary, pairwise, slot_pos, scratch, bad, loc, cav1, q)
            _transpose_plane(Ph, written, Hv)
        else:
            n += _phase(kt, backward, Mv, Pv, Hv, M, eu_v, T_v, rho_v, rho_token, geometry_v, slot_of, ptr, rho_slot,
                        unary, pairwise, slot_pos, scratch, bad, loc, cav1, q)
            _transpose_plane(Pv, written, Vh)
    return n


@njit(cache=True, nogil=True, error_model="numpy")
def _transpose_all(H, W, P, X):
    """``X``: the vertical family's powers in the horizontal family's layout
    (``[c, p, x, r]``, first half), the horizontal family's in the vertical
    one's (``[r, p, x, c]``, second half)."""
    K = P.shape[0] // (4 * H * W)
    Ph, Pv = _views(P, H, W, K)
    Vh, Hv = _views(X, H, W, K)
    for p in range(2):
        _transpose_plane(Ph, p, Hv)
        _transpose_plane(Pv, p, Vh)


@njit(cache=True, nogil=True, error_model="numpy")
def grid_reverse_sweep(kt, H, W, restore, M, P, X, snap, snap_pow, eu_h, eu_v, T_h, T_v, R_h, R_v, rho_h, rho_v,
                       rho_token,
                       Madj, GP_h, GP_v, g_u, geometry_h, geometry_v, slot_of, ptr, rho_slot, unary, pairwise,
                       slot_pos, scratch, adjoint_scratch, adjoint_held, bad, loc, cav1, q):
    """Step 8 for a whole iteration: the four phases of :func:`grid_sweep` in
    reverse, restoring the messages from the snapshot ``snap`` (flat planes)
    with ``restore``; ``X`` as in :func:`grid_sweep`; ``R_h``, ``R_v``:
    the families' row sums (:func:`build_row_sums`)."""
    K = eu_h.shape[1]
    Mh, Mv = _views(M, H, W, K)
    Ph, Pv = _views(P, H, W, K)
    Vh, Hv = _views(X, H, W, K)
    Ah, Av = _views(Madj, H, W, K)
    Sh, Sv = _views(snap, H, W, K)
    if snap_pow.shape[0] > 0:
        SPh, SPv = _views(snap_pow, H, W, K)
    else:
        SPh, SPv = Sh[:0], Sv[:0]
    for phase in range(4):  # grid_sweep's phases in reverse
        backward = phase < 2  # at run time, as in grid_sweep
        restored = _AFTER if backward else _BEFORE
        if phase == 0 or phase == 3:
            _reverse_phase(kt, backward, restore, Mh, Ph, Vh, Mv, M, Sh, SPh, eu_h, T_h, R_h, rho_h, rho_v, rho_token,
                           Ah, Av, GP_h, g_u, geometry_h, slot_of, ptr, rho_slot, unary, pairwise, slot_pos, scratch,
                           adjoint_scratch, adjoint_held, bad, loc, cav1, q)
            _transpose_plane(Ph, restored, Hv)
        else:
            _reverse_phase(kt, backward, restore, Mv, Pv, Hv, Mh, M, Sv, SPv, eu_v, T_v, R_v, rho_v, rho_h, rho_token,
                           Av, Ah, GP_v, g_u, geometry_v, slot_of, ptr, rho_slot, unary, pairwise, slot_pos, scratch,
                           adjoint_scratch, adjoint_held, bad, loc, cav1, q)
            _transpose_plane(Pv, restored, Vh)


@njit(cache=True, nogil=True, error_model="numpy")
def _run(kt, n_sweeps, push_slot, stack, stack_pow, H, W, M, P, X, eu_h, eu_v, T_h, T_v, rho_h, rho_v, rho_token,
         geometry_h, geometry_v, slot_of, ptr, rho_slot, unary, pairwise, slot_pos, scratch, bad, loc, cav1, q):
    """``n_sweeps`` iterations; before iteration ``it`` the messages (and
    powers) are kept in ``stack[push_slot[it]]`` when that is >= 0. ``X``:
    room for the transposed powers."""
    _transpose_all(H, W, P, X)
    n_fallback = 0
    for it in range(n_sweeps):
        if push_slot[it] >= 0:
            _push(stack, stack_pow, push_slot[it], M, P)
        n_fallback += grid_sweep(kt, H, W, M, P, X, eu_h, eu_v, T_h, T_v, rho_h, rho_v, rho_token, geometry_h,
                                 geometry_v, slot_of, ptr, rho_slot, unary, pairwise, slot_pos, scratch, bad, loc,
                                 cav1, q)
    return n_fallback


@njit(cache=True, nogil=True)
def _forward_tables(T_h, T_v, H, W, tabs):
    """``tabs[c, x_i, x_j]``, the forward-sweep tables of the slot kernels."""
    n_h = H * (W - 1)
    K = tabs.shape[1]
    for c in range(tabs.shape[0]):
        if c < n_h:
            T, a, l = T_h, c % (W - 1), c // (W - 1)
        else:
            T, a, l = T_v, (c - n_h) // W, (c - n_h) % W
        for xi in range(K):  # loops, not an array assignment (see trw._copy_into)
            for xj in range(K):
                tabs[c, xi, xj] = T[a, xi, xj, l]


_JOIN_TILE = 16


@njit(cache=True, nogil=True, error_model="numpy")
def _join_family(G, first, stride_l, stride_a, rho, g_p):
    """``g_p[c, k] = G[a, k, l] / rho_c`` for the edges ``c = first + l
    stride_l + a stride_a`` of one family: a transpose in tiles of
    ``_JOIN_TILE`` lines (reads along ``l``, writes along ``k``, both within
    the cache; numpy's strided copy and the division after it cost twice)."""
    A, KK, L = G.shape
    for l0 in range(0, L, _JOIN_TILE):
        l1 = min(l0 + _JOIN_TILE, L)
        for a in range(A):
            for l in range(l0, l1):
                c = first + l * stride_l + a * stride_a
                rho_c = rho[c]
                for k in range(KK):
                    g_p[c, k] = G[a, k, l] / rho_c


class GridKernels:
    """The grid tables of one forward pass and the calls of the line kernels."""

    def __init__(self, height, width, label_token, unary, pairwise, rho, eu, rho_slot, rho_mode, slot_edge, slot_side,
                 slot_of, ptr):
        H, W = height, width
        K = unary.shape[1]
        dtype = unary.dtype
        self.grid = Grid(H, W, slot_edge, slot_side, K)
        self.kt, self.K, self.dtype = label_token, K, dtype
        self.rho_mode = rho_mode
        # two labels, rho 1/2 or 1: one number per message
        # (sklearn_margcrf._trw_grid_binary, forward and backward); the
        # state's planes and snapshots are those numbers, and no line kernel
        # runs (no rho class of theirs)
        from . import _trw_grid_binary as binary

        self.binary_token = binary.rho_token_of(rho_mode) if K == 2 else None
        # the rho class as the length of a tuple, like the label token: a
        # compile-time constant, so each class gets branch-free loops. For
        # rho = 1/2 the kernels keep power planes of their own (``powers``,
        # sqrt of the caller's message planes, which are also its power
        # planes): the square roots once per message written rather than in
        # the four cavities that read it. Measured (200 x 300, 20 iterations,
        # float64, loss_and_grad, processes alternating): K = 8 1.30-1.32 s
        # against 1.36-1.40 s without.
        keeps_powers = rho_mode == _RHO_HALF and not self.binary
        self.rho_token = None if self.binary else (0,) * (_RHO_HALF_PLANES if keeps_powers else rho_mode)
        self.powers = scratch(self.grid.size, dtype) if keeps_powers else None
        self.unary, self.pairwise, self.rho_slot, self.slot_of, self.ptr = unary, pairwise, rho_slot, slot_of, ptr
        node_planes = eu.reshape(H, W, K)
        self.eu_h = scratch_copy(node_planes.transpose(1, 2, 0))  # [c, x, r]
        self.eu_v = scratch_copy(node_planes.transpose(0, 2, 1))  # [r, x, c]
        self.T_h = scratch((W - 1, K, K, H), dtype)
        self.T_v = scratch((H - 1, K, K, W), dtype)
        build_grid_tables(label_token, pairwise, rho, H, W, self.T_h, self.T_v, *table_blocks(K))
        lanes = max(H, W)
        self.transposed = scratch(self.plane_size, dtype)  # the powers transposed (_transpose_all)
        self._transposed_of = None  # the power planes that ``transposed`` holds, transposed
        if self.binary:
            self.q_slot_pos = Grid(H, W, slot_edge, slot_side, 1).slot_pos
            self.E_h, self.E_v = binary.unary_ratios(self.eu_h), binary.unary_ratios(self.eu_v)
            self.lines = np.empty((2, lanes), dtype)
            return
        # the rho of each message, [c, p, r] and [r, p, c] (absent neighbours: 1)
        n_h = H * (W - 1)
        self.rho_h = scratch_full((W, 2, H), 1, dtype)
        self.rho_h[1:, _BEFORE] = self.rho_h[:-1, _AFTER] = rho[:n_h].reshape(H, W - 1).T
        self.rho_v = scratch_full((H, 2, W), 1, dtype)
        self.rho_v[1:, _BEFORE] = self.rho_v[:-1, _AFTER] = rho[n_h:].reshape(H - 1, W)
        self.scratch = np.empty((2 * K + 2, lanes), dtype)
        self.adjoint_scratch = np.empty((2 * K + 1, lanes), dtype)
        self.held = scratch(K * H * W, dtype)
        self.bad = np.empty(lanes, np.int64)
        self.loc = np.empty((4, K), dtype)
        self.cav1 = np.empty(K, dtype)
        self.q = np.empty((K, K), dtype)
        self.row_sums = None  # (h, v) for the backward pass, built at its first reverse iteration

    @property
    def binary(self):
        return self.binary_token is not None

    @property
    def binary_half(self):
        """Whether the two-label kernels run with rho = 1/2 (their planes hold ``q = r ** (1/2)``)."""
        return self.binary and len(self.binary_token) == _RHO_HALF

    @property
    def plane_size(self):
        """The size of the flat planes the forward iterations keep (and of a snapshot)."""
        return self.grid.size // 2 if self.binary else self.grid.size

    def planes_of(self, M):
        """The flat planes of the (2E, K) slot-layout messages ``M`` (or powers)."""
        if not self.binary:
            return self.grid.to_grid(M)
        from ._trw_grid_binary import q_of_messages

        Q = scratch(self.plane_size, M.dtype)
        q_of_messages(M, self.q_slot_pos, self.binary_half, Q)
        return Q

    def slot_messages(self, planes, out=None):
        """The (2E, K) slot-layout messages of the planes ``planes`` (into ``out`` when given)."""
        if not self.binary:
            return self.grid.to_slots(planes, out)
        from ._trw_grid_binary import message_pairs

        if out is None:
            out = scratch((self.q_slot_pos.shape[0], 2), planes.dtype)
        message_pairs(planes, self.q_slot_pos, self.binary_half, out)
        return out

    def run(self, M, P, n_sweeps, push_slot=None, stack=None, stack_pow=None):
        """``n_sweeps`` iterations on the flat planes; returns the fallback count."""
        g = self.grid
        if push_slot is None:
            push_slot = np.full(n_sweeps, -1, np.int64)
        empty = np.empty((0, 0), self.dtype)
        self._transposed_of = None  # _run transposes its own powers
        if self.binary:
            from ._trw_grid_binary import _run as binary_run

            return binary_run(
                n_sweeps, push_slot, empty if stack is None else stack, g.height, g.width, M,
                self.transposed, self.E_h, self.E_v, self.T_h, self.T_v, self.binary_token,
                g.geometry_h, g.geometry_v, self.unary, self.pairwise, self.lines,
            )
        if self.powers is not None:
            P = np.sqrt(M, out=self.powers)
        return _run(
            self.kt, n_sweeps, push_slot, empty if stack is None else stack, empty if stack_pow is None else stack_pow,
            g.height, g.width, M, P, self.transposed, self.eu_h, self.eu_v, self.T_h, self.T_v, self.rho_h, self.rho_v,
            self.rho_token, g.geometry_h, g.geometry_v, self.slot_of, self.ptr, self.rho_slot, self.unary,
            self.pairwise, g.slot_pos, self.scratch, self.bad, self.loc, self.cav1, self.q,
        )

    def reverse(self, restore, M, P, snapshot, snapshot_pow, Madj, GP_h, GP_v, g_u):
        """One reverse iteration (step 8 for every update), restoring the
        messages from ``snapshot`` with ``restore``."""
        g = self.grid
        powers = P if self.powers is None else self.powers  # the kernels keep their own in step with M
        if self._transposed_of is not P:
            if self.powers is not None:
                np.sqrt(M, out=self.powers)
            _transpose_all(g.height, g.width, powers, self.transposed)
            self._transposed_of = P
        if self.row_sums is None and self.K == 2:  # summed where read (see _add_row_terms)
            self.row_sums = (np.empty((0, 2, 2, 0), self.dtype),) * 2
        elif self.row_sums is None:
            self.row_sums = (scratch((g.width - 1, 2, self.K, g.height), self.dtype),
                             scratch((g.height - 1, 2, self.K, g.width), self.dtype))
            build_row_sums(self.T_h, self.row_sums[0])
            build_row_sums(self.T_v, self.row_sums[1])
        grid_reverse_sweep(
            self.kt, g.height, g.width, restore, M, powers, self.transposed, snapshot, snapshot_pow, self.eu_h, self.eu_v,
            self.T_h, self.T_v, *self.row_sums, self.rho_h, self.rho_v, self.rho_token, Madj, GP_h, GP_v, g_u,
            g.geometry_h, g.geometry_v, self.slot_of, self.ptr, self.rho_slot, self.unary, self.pairwise, g.slot_pos,
            self.scratch, self.adjoint_scratch, self.held, self.bad, self.loc, self.cav1, self.q,
        )

    def forward_tables(self):
        E = self.pairwise.shape[0]
        tabs = scratch((E, self.K, self.K), self.dtype)
        _forward_tables(self.T_h, self.T_v, self.grid.height, self.grid.width, tabs)
        return tabs

    def split_pairwise(self, g_p):
        """(E, K*K) edge layout -> the families' ``[a, x_i K + x_j, l]``
        planes; ``g_p=None``: planes of zeros (a loss without pairwise terms)."""
        H, W, KK = self.grid.height, self.grid.width, self.K * self.K
        if g_p is None:
            return scratch_full((W - 1, KK, H), 0, self.dtype), scratch_full((H - 1, KK, W), 0, self.dtype)
        n_h = H * (W - 1)
        GP_h = scratch_copy(g_p[:n_h].reshape(H, W - 1, KK).transpose(1, 2, 0))
        GP_v = scratch_copy(g_p[n_h:].reshape(H - 1, W, KK).transpose(0, 2, 1))
        return GP_h, GP_v

    def join_pairwise(self, GP_h, GP_v, rho, g_p):
        """``g_p[c] = GP[c] / rho_c`` in the (E, K*K) edge layout."""
        H, W = self.grid.height, self.grid.width
        _join_family(GP_h, 0, W - 1, 1, rho, g_p)  # edge l (W - 1) + a
        _join_family(GP_v, H * (W - 1), 1, W, rho, g_p)  # edge n_h + a W + l
