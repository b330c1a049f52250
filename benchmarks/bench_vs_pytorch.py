"""Back TRW and back mean field (numba) against the same inference unrolled in
PyTorch and differentiated by autograd.

What is compared
----------------
``--inference trw`` (default):

- "ours": ``trw_forward(..., n_iter=N, keep_stack=True)`` followed by
  ``trw_backward(state, dL/dmu, None, mode="truncated")``, the exact gradient
  of the loss after exactly N iterations.
- "torch line-sweep": the *same* computation in PyTorch (float64): messages
  start uniform, each iteration runs the sequential schedule of
  ``sklearn_margcrf.trw`` (forward sweep over the edges of ``grid_edges``,
  then backward sweep), which on the grid vectorises by lines: rightward
  messages column by column (all rows at once), downward messages row by row
  (all columns at once), then upward row by row from the bottom and leftward
  column by column from the right. Probability domain, messages normalised
  after each update, like ours (without ours' 1e-300 floor and log-domain
  fallback, which do not trigger on these problems: section 1 prints the
  fallback count). Autograd differentiates the unrolled iterations.
  Section 1 checks that marginals and gradient agree with ours.
- "torch flooding": what one usually writes when unrolling BP/TRW in
  PyTorch: every message updated at once from the previous iteration's
  messages, in the log domain with logsumexp and whole-grid tensor ops
  (optional damping of the log messages, ``--damping``). Same fixed point as
  TRW, but information travels one pixel per iteration, so its marginals
  after N iterations differ from ours; it is compared at equal accuracy
  (section 3). Section 2 also times it in float32 ("flood32"); everything
  else is float64.

``--inference mean_field``:

- "ours": ``mean_field_forward(..., n_iter=N, keep_stack=True)`` followed by
  ``mean_field_backward(state, dL/dmu, None, mode="truncated")``: sequential
  (Gauss-Seidel) mean field from mu = softmax(theta_i), one iteration = one
  sweep over the nodes in increasing index, and the exact gradient after N.
- "torch wavefront": the same computation in PyTorch (float64). On the
  row-major grid, node (r, c) reads (r, c-1) and (r-1, c) from its own sweep
  and (r, c+1), (r+1, c) from the previous one, so the sequential order is
  equivalent to updating the anti-diagonals d = r + c in increasing d, each
  wavefront at once (one batched matrix-vector product per wavefront; every
  wavefront is its own tensor, nothing is written in place). Section 1
  checks that it agrees with ours (to rounding: a few 1e-16 in the marginals
  and 1e-15 relative in the gradient at 60 x 80, K = 2 and 3).
- "torch flooding": the usual parallel mean field, every node updated at
  once from the previous iteration's marginals (whole-grid einsum); optional
  damping in the probability domain, mu <- D mu + (1 - D) softmax(field)
  (``--damping D``). Parallel mean field need not converge, nor to the fixed
  point of the sequential one. Observed on 60 x 80 (K = 2): undamped, it
  ends in a 2-cycle on "random" (change per iteration 0.84, error 0.84
  against ours' fixed point; 0.2% of the pixels off by more than 0.1) and
  converges to a different fixed point on "potts" (error 0.98, 1% of the
  pixels off by more than 0.1); on 30 x 40 likewise a 2-cycle on "random",
  but slowly towards ours' fixed point on "potts"; damped (0.3, 0.5, 0.8) it converges towards ours'
  fixed point on "random" (slowly, 1e-9 to 2e-5 change per iteration after
  640 iterations) but still to a different one, or not at all (0.8), on
  "potts". With K = 3, undamped: slowly towards ours' fixed point on
  "random", a local 2-cycle (0.5% of the pixels) on "potts". Section 3
  reports what it did.

Loss: the univariate logistic loss L = -sum_i log mu_i(y_i) with random
labels y (ours: dL/dmu_i(x) = -[x = y_i] / mu_i(x) handed to trw_backward /
mean_field_backward; torch: L.backward()). Default rho = 0.5 on every edge
(TRW), K = 2 states, 200 x 300 4-connected grid.

Problems
--------
- "random": ``random_grid_model`` of _common.py (every unary and pairwise
  entry uniform in [-1, 1]: coupling of mixed sign).
- "potts": attractive Potts coupling theta_c(a, b) = beta [a = b] with
  beta = 1.2 (``--beta``), so theta_c / rho = 2.4; unary
  theta_i(x) = 2 f_x(i) + 0.5 noise, where every f_x is white Gaussian noise
  blurred with a Gaussian of 8 pixels (FFT, periodic), scaled to unit
  standard deviation, and noise is standard Gaussian (seed 0). Sequential TRW
  needs tens of iterations there (on 60 x 80: 24 until no unary marginal
  changes by 1e-6 in an iteration, 52 for 1e-10). Sequential mean field
  needs more on both problems (on 60 x 80, to 1e-10: 282 on "random", 175 on
  "potts", whose marginals are still ~0.9 away from the fixed point after 20
  iterations).

Sections
--------
1. Agreement of torch line-sweep / wavefront with ours at N = 10 (both
   problems): max absolute difference of the unary marginals, and of the
   gradients w.r.t. (unary, pairwise), absolute and relative to the largest
   gradient entry.
2. Time of forward + gradient for N = 10, 20, 40 (``--iters``) on "random":
   best of R runs after a warm-up run (wall and CPU time, as ``best_time`` of
   _common.py), with flooding also in float32 ("flood32"). Numba is
   single-threaded, and so is PyTorch unless ``--torch-threads`` says
   otherwise (on a busy machine more threads can make PyTorch far slower:
   its threads wait for each other when one is descheduled).
3. Accuracy at equal cost, both problems: max absolute error of the unary
   marginals against the converged fixed point of ours (n_iter=None,
   tol=1e-10, which itself is within a few 1e-10 of the fixed point), for
   ours at N = 5, 10, 20, 40 and for flooding at N = 10, 20, 40, 80, ...
   (doubling) below the first N whose error is at most that of ours at
   N = 20, and at that first N (or at ``--flood-cap``, default 640, if it is
   never reached), each with its forward + gradient time (best of the torch
   repeats). The error curve of flooding is computed once, without
   gradients. TRW flooding stops there. Mean-field flooding runs on until
   its own convergence (change below 1e-10 in an iteration) or the cap: the
   section then says whether it converged and to ours' fixed point or a
   different one (error at the end, share of pixels off by more than 0.1),
   or how it kept moving (2-cycle); it gives no cost ratio when flooding
   only passes below ours' N = 20 error on its way elsewhere (it then says
   so), and the last row is the N where it stopped.
4. Memory kept for the differentiation, N = 10, 20, 40. Ours, TRW: the stack
   (N * 2E * K * 8 bytes) and, in total, every array of the TRWState that
   trw_backward reads plus the arrays trw_backward allocates (message copies,
   adjoint messages, gradients). Ours, mean field: the stack (N * n * K * 8
   bytes) and, in total, the marginals, the stack and the reversed model
   mean_field_backward builds (and caches in the state), plus its adjoints
   and gradients. Torch: the bytes of the tensors that autograd saves for
   backward (``torch.autograd.graph.saved_tensors_hooks``, deduplicated by
   storage, the caller's input tensors excluded). Neither counts transient
   buffers of the backward pass itself.

The machine is shared (other processes compete for its 2 cores), so both the
minimum wall time and the minimum CPU time (time.process_time) are shown;
the CPU time is the steadier figure (with ``--torch-threads`` > 1 it adds up
the threads: compare wall times then). Defaults: ours best of 5 runs, every
PyTorch variant best of 2, each after a warm-up run; the default TRW run
took 95 s on an otherwise idle 2-core machine (docs/results/
bench_vs_pytorch.txt) and needs up to about 1.5 GB of memory (torch
line-sweep at N = 40). The default mean-field run took 135 s on the same
idle machine (docs/results/bench_vs_pytorch_mean_field.txt); its peak
resident memory is 5.7 GB (measured for section 3 alone, where parallel
mean field runs with gradient up to N = 640 when it neither reaches ours'
error nor converges; a smaller ``--flood-cap`` needs less).

Needs PyTorch (not a dependency of the package; a CPU build is enough)::

    pip install torch
    python benchmarks/bench_vs_pytorch.py [--inference {trw,mean_field}]
        [--height H --width W] [--states K] [--repeat R] [--torch-repeat R]
        [--iters 10 20 40] [--torch-threads T] [--flood-cap N] [--damping D]
        [--sections 1 2 3 4]
"""

import argparse
import math
import sys

from _common import best_time, logistic_loss, random_grid_model, truncated_logistic_gradient  # noqa: E402 (sets up sys.path)

import numpy as np  # noqa: E402

from sklearn_margcrf._graph import grid_edges  # noqa: E402
from sklearn_margcrf.mean_field import mean_field_backward, mean_field_forward  # noqa: E402
from sklearn_margcrf.trw import trw_forward  # noqa: E402

try:
    import torch
except ImportError:  # pragma: no cover
    sys.exit("bench_vs_pytorch.py needs PyTorch, which is not a dependency of sklearn_margcrf: "
             "pip install torch (a CPU build is enough)")


# ---------------------------------------------------------------------------
# problems
# ---------------------------------------------------------------------------


def potts_grid_model(height, width, n_states, beta=1.2, smooth=8.0, signal=2.0, noise=0.5, seed=0):
    """Attractive Potts grid: theta_c(a, b) = beta [a = b]; unary from a smooth
    random image plus noise (see the module docstring)."""
    edges = grid_edges(height, width)
    rng = np.random.default_rng(seed)
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.fftfreq(width)[None, :]
    kernel = np.exp(-2 * math.pi ** 2 * smooth ** 2 * (fx ** 2 + fy ** 2))  # Gaussian blur, sigma = smooth
    unary = np.empty((height * width, n_states))
    for x in range(n_states):
        f = np.real(np.fft.ifft2(np.fft.fft2(rng.standard_normal((height, width))) * kernel))
        f = (f - f.mean()) / f.std()
        unary[:, x] = signal * f.ravel() + noise * rng.standard_normal(height * width)
    pairwise = np.broadcast_to(beta * np.eye(n_states), (edges.shape[0], n_states, n_states)).copy()
    return edges, unary, pairwise, rng


def grid_views(unary, pairwise, height, width):
    """(n, K) / (E, K, K) in grid_edges order -> (H, W, K), horizontal
    (H, W-1, K, K) [left, right], vertical (H-1, W, K, K) [upper, lower]."""
    K = unary.shape[-1]
    n_h = height * (width - 1)
    th = unary.reshape(height, width, K)
    ph = pairwise[:n_h].reshape(height, width - 1, K, K)
    pv = pairwise[n_h:].reshape(height - 1, width, K, K)
    return th, ph, pv


# ---------------------------------------------------------------------------
# ours
# ---------------------------------------------------------------------------


def ours_forward_backward(edges, unary, pairwise, rho, labels, n_iter):
    """Loss, marginals and gradient (unary, pairwise) of truncated TRW + back TRW."""
    loss, g_unary, g_pairwise, state = truncated_logistic_gradient(edges, unary, pairwise, rho, labels, n_iter)
    return loss, state.unary_marginals, g_unary, g_pairwise, state


def ours_mean_field(edges, unary, pairwise, labels, n_iter):
    """Loss, marginals and gradient (unary, pairwise) of truncated sequential
    mean field + back mean field (the same loss as for TRW)."""
    state = mean_field_forward(edges, unary, pairwise, n_iter=n_iter, keep_stack=True)
    loss, g_mu = logistic_loss(state.unary_marginals, labels)
    g_unary, g_pairwise = mean_field_backward(state, g_mu, None, mode="truncated")
    return loss, state.unary_marginals, g_unary, g_pairwise, state


def _array_bytes(arrays):
    """Bytes of the distinct buffers behind ``arrays`` (views counted once)."""
    seen, total = set(), 0
    for value in arrays:
        base = value if value.base is None else value.base
        if id(base) not in seen:
            seen.add(id(base))
            total += base.nbytes
    return total


def ours_memory(state):
    """Bytes of the TRWState arrays trw_backward reads, plus what it allocates."""
    n, K = state.unary.shape
    E = state.edges.shape[0]
    total = _array_bytes(value for name, value in vars(state).items()
                         if isinstance(value, np.ndarray) and name not in ("unary", "pairwise", "edges"))
    copies = 3 * 2 * E * K * 8  # trw_backward copies messages, powers, inverses (powers alias messages for rho=1)
    adjoints = 2 * E * K * 8 + n * K * 8 + E * K * K * 8  # adjoint messages, g_unary, g_pairwise
    return total + copies + adjoints


def ours_memory_mean_field(state):
    """Bytes of the MeanFieldState arrays mean_field_backward reads (marginals,
    stack, the cached reversed model it builds), plus what it allocates."""
    n, K = state.unary.shape
    E = state.edges.shape[0]
    edges_r, pairwise_r, inc_r = state._reversed()
    total = _array_bytes([state.unary_marginals, state._stack_rev, edges_r, pairwise_r,
                          inc_r.ptr, inc_r.edge, inc_r.side])
    # dL/dmu copy, zero dL/dmu_c (None), reversed marginals and adjoints, g_unary, g_pairwise
    return total + 4 * n * K * 8 + 2 * E * K * K * 8


# ---------------------------------------------------------------------------
# PyTorch, line-sweep: the schedule of sklearn_margcrf.trw, vectorised by lines
# ---------------------------------------------------------------------------


def _power(rho):
    if rho == 1.0:
        return (lambda m: m), (lambda m: torch.ones_like(m))
    if rho == 0.5:
        return torch.sqrt, torch.rsqrt
    return (lambda m: m.pow(rho)), (lambda m: m.pow(rho - 1.0))


def _update(A, T):
    """Normalised m(x_v) = sum_{x_u} A(x_u) T[x_u, x_v], batched over a line."""
    o = torch.bmm(A.unsqueeze(1), T).squeeze(1)
    return o / o.sum(-1, keepdim=True)


def _line_pass(bases, tables, pw, reverse=False):
    """One phase of a sweep: the messages of every line, in order (or in
    reverse), each from its line's cavity ``bases[k]`` times the power of the
    message just computed on the previous line. Returns (messages, powers),
    indexed like ``bases``."""
    n = len(bases)
    messages, powers, prev = [None] * n, [None] * n, None
    for k in (range(n - 1, -1, -1) if reverse else range(n)):
        a = bases[k] if prev is None else bases[k] * prev
        messages[k] = _update(a, tables[k])
        powers[k] = prev = pw(messages[k])
    return messages, powers


def _pad(p, dim, front):
    """Pad incoming-message powers with ones along ``dim`` (1 where there is no edge)."""
    shape = list(p.shape)
    shape[dim] = 1
    one = p.new_ones(shape)
    return torch.cat([one, p] if front else [p, one], dim)


def torch_line_sweep(unary, ph, pv, rho, n_iter):
    """Unary marginals (H, W, K) after ``n_iter`` iterations of the sequential
    TRW schedule of sklearn_margcrf.trw (scalar ``rho``).

    unary (H, W, K); ph (H, W-1, K, K) [left, right]; pv (H-1, W, K, K) [upper, lower].
    Messages: R[r, c] from horizontal edge (r,c)-(r,c+1) into its right end,
    L[r, c] into its left end, D[r, c] from vertical edge (r,c)-(r+1,c) into
    its lower end, U[r, c] into its upper end.
    """
    H, W, K = unary.shape
    pw, pw_cav = _power(rho)  # m ** rho, m ** (rho - 1) (cavity: m^rho / m)
    # tables exp((theta_c - max) / rho), max-shifted like ours (the shift cancels)
    eu = torch.exp(unary - unary.detach().amax(-1, keepdim=True))
    th = torch.exp((ph - ph.detach().amax((-2, -1), keepdim=True)) / rho)
    tv = torch.exp((pv - pv.detach().amax((-2, -1), keepdim=True)) / rho)
    # one (batch, K_sender, K_receiver) table per line, contiguous
    t_right = th.transpose(0, 1).contiguous().unbind(0)  # column c: sender left
    t_left = th.transpose(0, 1).transpose(-1, -2).contiguous().unbind(0)  # sender right
    t_down = tv.contiguous().unbind(0)  # row r: sender upper
    t_up = tv.transpose(-1, -2).contiguous().unbind(0)  # sender lower

    u = 1.0 / K
    R = L = unary.new_full((H, W - 1, K), u)
    D = U = unary.new_full((H - 1, W, K), u)
    Rp = Lp = pw(R)
    Dp = Up = pw(D)
    for _ in range(n_iter):
        # forward sweep, horizontal phase: R column by column, left to right
        inD, inU = _pad(Dp, 0, True), _pad(Up, 0, False)  # powers of the messages into every pixel
        base = (eu * inD * inU)[:, :-1] * pw_cav(L)  # cavity of the sender without its left message
        ms, ps = _line_pass(base.transpose(0, 1).unbind(0), t_right, pw)
        R, Rp = torch.stack(ms, 1), torch.stack(ps, 1)
        # forward sweep, vertical phase: D row by row, top to bottom
        inR, inL = _pad(Rp, 1, True), _pad(Lp, 1, False)
        horiz = eu * inR * inL
        ms, ps = _line_pass((horiz[:-1] * pw_cav(U)).unbind(0), t_down, pw)
        D, Dp = torch.stack(ms, 0), torch.stack(ps, 0)
        # backward sweep, vertical phase: U row by row, bottom to top
        ms, ps = _line_pass((horiz[1:] * pw_cav(D)).unbind(0), t_up, pw, reverse=True)
        U, Up = torch.stack(ms, 0), torch.stack(ps, 0)
        # backward sweep, horizontal phase: L column by column, right to left
        inD, inU = _pad(Dp, 0, True), _pad(Up, 0, False)
        base = (eu * inD * inU)[:, 1:] * pw_cav(R)
        ms, ps = _line_pass(base.transpose(0, 1).unbind(0), t_left, pw, reverse=True)
        L, Lp = torch.stack(ms, 1), torch.stack(ps, 1)
    b = eu * _pad(Rp, 1, True) * _pad(Lp, 1, False) * _pad(Dp, 0, True) * _pad(Up, 0, False)
    return b / b.sum(-1, keepdim=True)


# ---------------------------------------------------------------------------
# PyTorch, flooding (log domain)
# ---------------------------------------------------------------------------


def _zpad(x, dim, front):
    shape = list(x.shape)
    shape[dim] = 1
    z = x.new_zeros(shape)
    return torch.cat([z, x] if front else [x, z], dim)


def torch_flooding(unary, ph, pv, rho, n_iter, damping=0.0, callback=None):
    """Unary marginals (H, W, K) after ``n_iter`` flooding iterations: all
    messages updated at once from the previous ones (log domain). ``callback(mu)``
    is called after every iteration, if given; when it returns True the
    iterations stop."""
    H, W, K = unary.shape
    lh, lv = ph / rho, pv / rho
    lR = lL = unary.new_full((H, W - 1, K), -math.log(K))
    lD = lU = unary.new_full((H - 1, W, K), -math.log(K))

    def belief():  # log of exp(theta_i) prod_d m_d^rho, unnormalised
        return unary + rho * (_zpad(lR, 1, True) + _zpad(lL, 1, False) + _zpad(lD, 0, True) + _zpad(lU, 0, False))

    def norm(o):
        return o - torch.logsumexp(o, -1, keepdim=True)

    for _ in range(n_iter):
        S = belief()
        nR = norm(torch.logsumexp((S[:, :-1] - lL).unsqueeze(-1) + lh, -2))  # sender (r,c), into (r,c+1)
        nL = norm(torch.logsumexp((S[:, 1:] - lR).unsqueeze(-2) + lh, -1))  # sender (r,c+1), into (r,c)
        nD = norm(torch.logsumexp((S[:-1] - lU).unsqueeze(-1) + lv, -2))  # sender (r,c), into (r+1,c)
        nU = norm(torch.logsumexp((S[1:] - lD).unsqueeze(-2) + lv, -1))  # sender (r+1,c), into (r,c)
        if damping:
            nR, nL = damping * lR + (1 - damping) * nR, damping * lL + (1 - damping) * nL
            nD, nU = damping * lD + (1 - damping) * nD, damping * lU + (1 - damping) * nU
        lR, lL, lD, lU = nR, nL, nD, nU
        if callback is not None and callback(torch.softmax(belief(), -1)):
            break
    return torch.softmax(belief(), -1)


# ---------------------------------------------------------------------------
# PyTorch, mean field: the sequential schedule by wavefronts, and flooding
# ---------------------------------------------------------------------------


def _wavefronts(H, W):
    """Anti-diagonals d = r + c, d = 0..H+W-2: first row ``lo[d]`` of each
    (``lo`` also for the sentinels d = -1 and d = H+W-1, at ``lo[-1]`` and
    ``lo[H+W-1]``), their sizes, and the row-major index of every node in
    wavefront order (d, then r)."""
    D = H + W - 1
    lo = [max(0, d - W + 1) for d in range(D + 1)] + [0]  # lo[-1] = 0 for the sentinel d = -1
    sizes = [min(H - 1, d) - lo[d] + 1 for d in range(D)]
    r = np.concatenate([np.arange(lo[d], lo[d] + sizes[d]) for d in range(D)])
    d = np.repeat(np.arange(D), sizes)
    return lo, sizes, r * W + (d - r)


def torch_mean_field_wavefront(unary, ph, pv, n_iter):
    """Unary marginals (H, W, K) after ``n_iter`` iterations of the sequential
    mean field of sklearn_margcrf.mean_field (nodes in row-major order, from
    softmax(unary)), vectorised by anti-diagonal wavefronts d = r + c: node
    (r, c) reads (r, c-1) and (r-1, c) on wavefront d-1 of the same sweep and
    (r, c+1), (r+1, c) on wavefront d+1 of the previous one.

    Wavefront d is kept as its own tensor of rows lo[d]-1 .. hi[d]+1 (a zero
    row at either end stands for a missing neighbour), so nothing is written
    in place. Each node's four tables are stacked into one (4K, K) matrix
    (rows: left, upper, right, lower neighbour state; zero where there is no
    edge), the field is one batched matrix-vector product per wavefront.
    """
    H, W, K = unary.shape
    lo, sizes, order = _wavefronts(H, W)
    D = len(sizes)
    zh = ph.new_zeros(H, 1, K, K)
    zv = pv.new_zeros(1, W, K, K)
    tables = torch.cat([torch.cat([zh, ph], 1),  # left edge (r,c-1)-(r,c): [x_left, x_j]
                        torch.cat([zv, pv], 0),  # upper edge (r-1,c)-(r,c): [x_up, x_j]
                        torch.cat([ph, zh], 1).transpose(-1, -2),  # right edge (r,c)-(r,c+1): [x_right, x_j]
                        torch.cat([pv, zv], 0).transpose(-1, -2)], -2)  # lower edge: [x_down, x_j]
    index = torch.from_numpy(order)
    tables = tables.reshape(H * W, 4 * K, K)[index].split(sizes)
    theta = unary.reshape(H * W, K)[index].split(sizes)
    sentinel = unary.new_zeros(H + 2, K)

    def pad(m):
        return torch.nn.functional.pad(m, (0, 0, 1, 1))

    P = [pad(torch.softmax(t, -1)) for t in theta]
    for _ in range(n_iter):
        new = []
        for d in range(D):
            prev = new[d - 1] if d else sentinel  # this sweep
            nxt = P[d + 1] if d + 1 < D else sentinel  # previous sweep
            L, a, b = sizes[d], lo[d] - lo[d - 1] + 1, lo[d] - lo[d + 1] + 1
            nb = torch.cat([prev[a:a + L], prev[a - 1:a - 1 + L], nxt[b:b + L], nxt[b + 1:b + 1 + L]], -1)
            field = torch.baddbmm(theta[d].unsqueeze(1), nb.unsqueeze(1), tables[d]).squeeze(1)
            new.append(pad(torch.softmax(field, -1)))
        P = new
    mu = torch.cat([p[1:-1] for p in P])
    return mu[torch.from_numpy(np.argsort(order))].reshape(H, W, K)


def _mf_field(unary, ph, pv, mu):
    """theta_j + sum over the edges of j of sum_{x_i} theta_e(x_j, x_i) mu_i(x_i), whole grid."""
    return (unary
            + _zpad(torch.einsum("hwa,hwab->hwb", mu[:, :-1], ph), 1, True)  # from the left neighbour
            + _zpad(torch.einsum("hwb,hwab->hwa", mu[:, 1:], ph), 1, False)  # from the right neighbour
            + _zpad(torch.einsum("hwa,hwab->hwb", mu[:-1], pv), 0, True)  # from the upper neighbour
            + _zpad(torch.einsum("hwb,hwab->hwa", mu[1:], pv), 0, False))  # from the lower neighbour


def torch_mean_field_flooding(unary, ph, pv, n_iter, damping=0.0, callback=None):
    """Unary marginals (H, W, K) after ``n_iter`` parallel mean-field
    iterations from softmax(unary): every node updated at once from the
    previous iteration's marginals; damping in the probability domain,
    mu <- damping mu + (1 - damping) softmax(field). ``callback`` as for
    :func:`torch_flooding`."""
    mu = torch.softmax(unary, -1)
    for _ in range(n_iter):
        new = torch.softmax(_mf_field(unary, ph, pv, mu), -1)
        mu = damping * mu + (1 - damping) * new if damping else new
        if callback is not None and callback(mu):
            break
    return mu


def _torch_inputs(unary, pairwise, dtype):
    return (torch.tensor(unary, dtype=dtype, requires_grad=True),
            torch.tensor(pairwise, dtype=dtype, requires_grad=True))


def _torch_loss(fn, tu, tp, labels, H, W):
    """Marginals (n, K) of ``fn(unary (H, W, K), ph, pv)`` and the logistic loss."""
    mu = fn(*grid_views(tu, tp, H, W)).reshape(-1, tu.shape[1])
    return -torch.log(mu.gather(1, labels.unsqueeze(1))).sum(), mu


def torch_forward_backward(fn, unary, pairwise, labels, H, W, dtype=torch.float64):
    """Loss, marginals (n, K) and autograd gradient (unary, pairwise) of
    ``fn(unary (H, W, K), ph, pv) -> marginals (H, W, K)``."""
    tu, tp = _torch_inputs(unary, pairwise, dtype)
    loss, mu = _torch_loss(fn, tu, tp, labels, H, W)
    loss.backward()
    g_pairwise = tp.grad if tp.grad is not None else torch.zeros_like(tp)  # N = 0: pairwise unused
    return loss.detach(), mu.detach(), tu.grad, g_pairwise


def torch_saved_bytes(fn, unary, pairwise, labels, H, W, dtype=torch.float64):
    """Bytes of the tensors autograd saves for backward, deduplicated by
    storage, the input tensors excluded."""
    tu, tp = _torch_inputs(unary, pairwise, dtype)
    lab = torch.as_tensor(labels)
    storages = {}
    inputs = {tu.untyped_storage().data_ptr(), tp.untyped_storage().data_ptr(), lab.untyped_storage().data_ptr()}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in inputs:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, mu = _torch_loss(fn, tu, tp, lab, H, W)
    total = sum(storages.values())
    del loss, mu
    return total


# ---------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------


def arguments():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--height", type=int, default=200)
    parser.add_argument("--width", type=int, default=300)
    parser.add_argument("--states", type=int, default=2, help="K (default 2)")
    parser.add_argument("--rho", type=float, default=0.5, help="edge appearance probability, every edge")
    parser.add_argument("--beta", type=float, default=1.2, help="Potts coupling of the 'potts' problem")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of ours (best is shown)")
    parser.add_argument("--torch-repeat", type=int, default=2, help="timed runs of each PyTorch variant")
    parser.add_argument("--iters", type=int, nargs="+", default=[10, 20, 40])
    parser.add_argument("--torch-threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--flood-cap", type=int, default=640, help="largest flooding N in section 3")
    parser.add_argument("--damping", type=float, default=0.0,
                        help="flooding damping (default none; TRW: log-message domain, mean field: probabilities)")
    parser.add_argument("--max-iter", type=int, default=5000, help="cap of the converged reference run")
    parser.add_argument("--sections", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--inference", choices=("trw", "mean_field"), default="trw",
                        help="which inference method to compare (default trw)")
    return parser.parse_args()


def fmt_time(t):
    return f"{t[0]:8.4f} s wall / {t[1]:8.4f} s CPU"


class Inference:
    """What the sections need of one inference method (built by :func:`inference_methods`)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def inference_methods(args, rho_e):
    """The TRW and the mean-field set-up: ours, the torch version with ours'
    schedule, torch flooding, the converged reference, memory accounting."""
    rho, damping = args.rho, args.damping
    trw = Inference(
        name="TRW", ours_name="trw_forward + trw_backward", same_label="torch line-sweep", same_short="line-sweep",
        ours=lambda edges, unary, pairwise, labels, N: ours_forward_backward(edges, unary, pairwise, rho_e,
                                                                             labels, N),
        marginals=lambda edges, unary, pairwise, N: trw_forward(edges, unary, pairwise, rho_e,
                                                                n_iter=N).unary_marginals,
        reference=lambda edges, unary, pairwise: trw_forward(edges, unary, pairwise, rho_e, n_iter=None, tol=1e-10,
                                                             max_iter=args.max_iter),
        same=lambda N: lambda th, ph, pv: torch_line_sweep(th, ph, pv, rho, N),
        flood=lambda N, callback=None: lambda th, ph, pv: torch_flooding(th, ph, pv, rho, N, damping=damping,
                                                                         callback=callback),
        memory=ours_memory, stack_bytes=lambda N, n, E, K: N * 2 * E * K * 8,
        note=lambda state: f";  log-domain fallbacks in ours: {state.n_fallback}",
        flood_to_convergence=False)
    mean_field = Inference(
        name="mean field", ours_name="mean_field_forward + mean_field_backward", same_label="torch wavefront",
        same_short="wavefront",
        ours=ours_mean_field,
        marginals=lambda edges, unary, pairwise, N: mean_field_forward(edges, unary, pairwise,
                                                                       n_iter=N).unary_marginals,
        reference=lambda edges, unary, pairwise: mean_field_forward(edges, unary, pairwise, n_iter=None, tol=1e-10,
                                                                    max_iter=args.max_iter),
        same=lambda N: lambda th, ph, pv: torch_mean_field_wavefront(th, ph, pv, N),
        flood=lambda N, callback=None: lambda th, ph, pv: torch_mean_field_flooding(th, ph, pv, N, damping=damping,
                                                                                    callback=callback),
        memory=ours_memory_mean_field, stack_bytes=lambda N, n, E, K: N * n * K * 8,
        note=lambda state: "",
        flood_to_convergence=True)
    return {"trw": trw, "mean_field": mean_field}


def main():
    args = arguments()
    torch.set_num_threads(args.torch_threads)
    torch.set_num_interop_threads(1)
    H, W, K, rho = args.height, args.width, args.states, args.rho
    if H < 2 or W < 2:
        sys.exit("--height and --width must be at least 2")
    n = H * W
    E = H * (W - 1) + (H - 1) * W
    rho_e = np.full(E, rho)
    inf = inference_methods(args, rho_e)[args.inference]
    problems = {
        "random": random_grid_model(H, W, K),
        "potts": potts_grid_model(H, W, K, beta=args.beta),
    }
    labels = {}
    for name, (_, _, _, rng) in problems.items():
        labels[name] = rng.integers(0, K, size=n)
    header = f"grid {H}x{W}: n={n}, E={E}, K={K}, " + (f"rho={rho}" if args.inference == "trw" else "mean field")
    print(f"{header}; numba single-threaded, torch {torch.__version__} with "
          f"{torch.get_num_threads()} thread(s); ours best of {args.repeat} runs, torch best of {args.torch_repeat} "
          f"(after a warm-up run; shared machine: minimum wall / CPU time)")

    def run_ours(name, N):
        edges, unary, pairwise, _ = problems[name]
        return inf.ours(edges, unary, pairwise, labels[name], N)

    def run_torch(name, fn, dtype=torch.float64):
        _, unary, pairwise, _ = problems[name]
        return torch_forward_backward(fn, unary, pairwise, torch.as_tensor(labels[name]), H, W, dtype=dtype)

    if 1 in args.sections:
        N = 10
        print(f"\n1. agreement of {inf.same_label} (float64, autograd) with ours ({inf.ours_name}), N={N}")
        for name in problems:
            _, mu_o, gu_o, gp_o, state = run_ours(name, N)
            _, mu_t, gu_t, gp_t = run_torch(name, inf.same(N))
            mu_t, gu_t, gp_t = mu_t.numpy(), gu_t.numpy(), gp_t.numpy()
            scale = max(np.abs(gu_o).max(), np.abs(gp_o).max())
            du, dp = np.abs(gu_t - gu_o).max(), np.abs(gp_t - gp_o).max()
            print(f"  {name:6s}: marginals max |diff| {np.abs(mu_t - mu_o).max():.2e};  gradient max |diff| "
                  f"unary {du:.2e}, pairwise {dp:.2e} (largest gradient entry {scale:.3g}: relative "
                  f"{max(du, dp) / scale:.2e}){inf.note(state)}")

    if 2 in args.sections:
        print("\n2. forward + gradient of L = -sum_i log mu_i(y_i), problem 'random'")
        for N in args.iters:
            t = best_time(lambda: run_ours("random", N), args.repeat)
            print(f"  N={N:3d}  ours              {fmt_time(t)}")
            base = t[1]
            for label, fn, dtype in ((inf.same_label, inf.same(N), torch.float64),
                                     ("torch flooding", inf.flood(N), torch.float64),
                                     ("torch flood32", inf.flood(N), torch.float32)):
                tt = best_time(lambda: run_torch("random", fn, dtype), args.torch_repeat)
                print(f"  N={N:3d}  {label:17s} {fmt_time(tt)}   ({tt[1] / base:6.1f} x ours, CPU)")

    if 3 in args.sections:
        print(f"\n3. accuracy at equal cost: max |mu - mu*| of the unary marginals against the converged "
              f"{inf.name} fixed point mu* (ours, tol=1e-10), with the forward + gradient time (float64)")
        for name in problems:
            edges, unary, pairwise, _ = problems[name]
            ref = inf.reference(edges, unary, pairwise)
            mu_star = ref.unary_marginals
            print(f"  problem '{name}': reference {ref.n_iter} sequential iterations, converged={ref.converged}")
            target = target_cpu = None
            for N in (5, 10, 20, 40):
                err = np.abs(inf.marginals(edges, unary, pairwise, N) - mu_star).max()
                t = best_time(lambda: run_ours(name, N), args.repeat)
                if N == 20:
                    target, target_cpu = err, t[1]
                print(f"    ours           N={N:4d}: error {err:.2e}   {fmt_time(t)}")
            errors, changes = [], []

            def record(m):
                m = m.reshape(-1, K).numpy()
                errors.append(np.abs(m - mu_star).max())
                changes.append(np.abs(m - record.last).max())
                record.last = m
                if inf.flood_to_convergence:  # on to its own fixed point (or the cap)
                    return changes[-1] < 1e-10
                return errors[-1] <= target

            record.last = softmax_rows(unary)  # mean field starts there (TRW flooding: unused)
            th, ph, pv = grid_views(torch.from_numpy(unary), torch.from_numpy(pairwise), H, W)
            with torch.no_grad():
                inf.flood(args.flood_cap, callback=record)(th, ph, pv)
            reached = next((N for N, e in enumerate(errors, 1) if e <= target), None)
            passed = None
            if reached is not None and errors[-1] > target:  # only on its way elsewhere: no equal cost
                passed, reached = reached, None
            last = reached or len(errors)
            Ns = [N for N in (10 * 2 ** k for k in range(30)) if N < last]
            Ns.append(last)  # the first N that reaches ours' N=20 error, or the last one run
            for N in Ns:
                t = best_time(lambda: run_torch(name, inf.flood(N)), args.torch_repeat)
                note = (f"   <- first N with error <= ours at N=20: {t[1] / target_cpu:.1f} x its CPU time"
                        if N == reached else "")
                print(f"    torch flooding N={N:4d}: error {errors[N - 1]:.2e}   {fmt_time(t)}{note}")
            if reached is None:
                within = (f"{len(errors)} iterations" if len(errors) < args.flood_cap
                          else f"--flood-cap={args.flood_cap} iterations")
                print(f"    torch flooding does not reach ours' N=20 error {target:.2e} within {within}" +
                      ("" if passed is None else f" (its error is below it at N={passed}, "
                       f"{errors[passed - 1]:.2e}, but ends at {errors[-1]:.2e}): no equal-cost figure"))
            if inf.flood_to_convergence:
                print("    torch flooding on its own: " + flood_verdict(errors, changes, record.last, mu_star))

    if 4 in args.sections:
        print("\n4. memory kept for the differentiation (MiB), problem 'random'")
        _, unary, pairwise, _ = problems["random"]
        lab = labels["random"]
        for N in args.iters:
            ours = inf.memory(run_ours("random", N)[4])
            stack = inf.stack_bytes(N, n, E, K)
            same = torch_saved_bytes(inf.same(N), unary, pairwise, lab, H, W)
            flood = torch_saved_bytes(inf.flood(N), unary, pairwise, lab, H, W)
            print(f"  N={N:3d}  ours: stack {stack / 2**20:8.1f}, total {ours / 2**20:8.1f};  torch saved tensors: "
                  f"{inf.same_short} {same / 2**20:8.1f} ({same / ours:4.1f} x ours), "
                  f"flooding {flood / 2**20:8.1f} ({flood / ours:4.1f} x ours)")


def softmax_rows(theta):
    e = np.exp(theta - theta.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def flood_verdict(errors, changes, mu, mu_star):
    """Whether flooding converged (change per iteration below 1e-10) and to
    which fixed point, or how it kept moving; ``mu``: its last marginals."""
    N = len(errors)
    far = f"{np.mean(np.abs(mu - mu_star).max(-1) > 0.1):.1%} of the pixels off by more than 0.1"
    if changes[-1] < 1e-10:
        same = "the same fixed point as ours" if errors[-1] <= 1e-6 else "a DIFFERENT fixed point"
        return (f"converged after {N} iterations (change {changes[-1]:.1e}), error {errors[-1]:.2e} "
                f"against mu*: {same} ({far})")
    tail = changes[-max(1, min(50, N // 4)):]
    cycle = ("; the marginals alternate (2-cycle: error of the last two iterates "
             f"{errors[-2]:.2e}, {errors[-1]:.2e})" if N >= 4 and changes[-1] > 1e-6 and
             np.abs(np.array(tail) - tail[-1]).max() < 1e-3 * tail[-1] else "")
    return (f"NOT converged after {N} iterations (last change per iteration {changes[-1]:.1e}, "
            f"min/max over the last {len(tail)}: {min(tail):.1e}/{max(tail):.1e}){cycle}; error at the end "
            f"{errors[-1]:.2e} ({far}), smallest {min(errors):.2e} (N={int(np.argmin(errors)) + 1})")


if __name__ == "__main__":
    main()
