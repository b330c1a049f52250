"""Tests of sklearn_margcrf.trw: TRW / loopy BP forward and back TRW."""

import warnings
import zlib

import numpy as np
import pytest
from reference import brute_force, chain_edges, numeric_gradient, random_model, random_tree_edges

from sklearn_margcrf import infer, trw
from sklearn_margcrf._graph import grid_edges
from sklearn_margcrf.trw import trw_backward, trw_forward


def softmax(a, axis=-1):
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def isolated_node_graph():
    """5 nodes: a 4-cycle on 0, 1, 3, 4 and node 2 with no edges."""
    return 5, np.array([[0, 1], [1, 3], [3, 4], [0, 4]], dtype=np.int64)


GRAPHS = {
    "grid3x3": lambda: (9, grid_edges(3, 3)),
    "grid3x4": lambda: (12, grid_edges(3, 4)),
    "chain5": lambda: (5, chain_edges(5)),
    "isolated": isolated_node_graph,
}


def make_rho(kind, n_edges, rng):
    if kind == "random":
        return rng.uniform(0.3, 1.0, size=n_edges)
    return np.full(n_edges, float(kind))


def relative_error(a, b):
    return np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)


# ---------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("K", [2, 3])
@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_bp_exact_on_trees(kind, K):
    rng = np.random.default_rng(10 * K + len(kind))
    n = 7
    edges = chain_edges(n) if kind == "chain" else random_tree_edges(n, rng)
    unary, pairwise = random_model(edges, n, K, rng, scale=1.5)
    state = trw_forward(edges, unary, pairwise, np.ones(len(edges)), tol=1e-13)
    assert state.converged
    mu, mu2, _ = brute_force(edges, unary, pairwise)
    np.testing.assert_allclose(state.unary_marginals, mu, atol=1e-8, rtol=0)
    np.testing.assert_allclose(state.pairwise_marginals, mu2, atol=1e-8, rtol=0)


def test_one_iteration_is_exact_on_an_ordered_chain():
    # the documented schedule: forward sweep then backward sweep over the edge
    # order, which on a chain numbered in order is exact BP in one iteration
    rng = np.random.default_rng(3)
    n, K = 6, 3
    edges = chain_edges(n)
    unary, pairwise = random_model(edges, n, K, rng, scale=2.0)
    state = trw_forward(edges, unary, pairwise, np.ones(n - 1), n_iter=1)
    mu, mu2, _ = brute_force(edges, unary, pairwise)
    np.testing.assert_allclose(state.unary_marginals, mu, atol=1e-12, rtol=0)
    np.testing.assert_allclose(state.pairwise_marginals, mu2, atol=1e-12, rtol=0)
    assert state.n_iter == 1


def test_pairwise_layout_single_edge():
    # asymmetric pairwise table: pairwise[e, a, b] = theta(x_i=a, x_j=b)
    edges = np.array([[1, 0]], dtype=np.int64)
    unary = np.array([[0.3, -0.2, 0.1], [0.0, 0.5, -0.4]])
    pairwise = np.arange(9, dtype=float).reshape(1, 3, 3) / 4.0
    state = trw_forward(edges, unary, pairwise, np.ones(1), tol=1e-14)
    mu, mu2, _ = brute_force(edges, unary, pairwise)
    np.testing.assert_allclose(state.unary_marginals, mu, atol=1e-12)
    np.testing.assert_allclose(state.pairwise_marginals, mu2, atol=1e-12)
    # messages are normalised and indexed by the receiving endpoint
    msgs = state.messages
    assert msgs.shape == (1, 2, 3)
    np.testing.assert_allclose(msgs.sum(axis=2), 1.0)
    expected_into_1 = np.exp(pairwise[0] + unary[0][None, :]).sum(axis=1)  # sum over x_0 = x_j
    np.testing.assert_allclose(msgs[0, 0], expected_into_1 / expected_into_1.sum(), atol=1e-12)


@pytest.mark.parametrize("rho_kind", ["0.5", "random"])
@pytest.mark.parametrize("K", [2, 3])
def test_local_consistency_on_grid(K, rho_kind):
    rng = np.random.default_rng(K)
    edges = grid_edges(3, 3)
    unary, pairwise = random_model(edges, 9, K, rng)
    rho = np.full(len(edges), 0.5) if rho_kind == "0.5" else rng.uniform(0.4, 0.6, size=len(edges))
    state = trw_forward(edges, unary, pairwise, rho, tol=1e-13)
    assert state.converged
    mu, mu2 = state.unary_marginals, state.pairwise_marginals
    np.testing.assert_allclose(mu2.sum(axis=2), mu[edges[:, 0]], atol=1e-8, rtol=0)
    np.testing.assert_allclose(mu2.sum(axis=1), mu[edges[:, 1]], atol=1e-8, rtol=0)
    np.testing.assert_allclose(mu.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(mu2.sum(axis=(1, 2)), 1.0, atol=1e-12)


@pytest.mark.parametrize("K", [2, 3])
def test_zero_iterations(K):
    rng = np.random.default_rng(5)
    edges = grid_edges(2, 3)
    rho = rng.uniform(0.3, 1.0, size=len(edges))
    unary, pairwise = random_model(edges, 6, K, rng)
    state = trw_forward(edges, unary, pairwise, rho, n_iter=0)
    assert state.n_iter == 0 and not state.converged
    np.testing.assert_allclose(state.unary_marginals, softmax(unary), atol=1e-14)
    np.testing.assert_allclose(state.messages, 1.0 / K)
    scores = pairwise / rho[:, None, None] + unary[edges[:, 0]][:, :, None] + unary[edges[:, 1]][:, None, :]
    expected = softmax(scores.reshape(len(edges), -1)).reshape(scores.shape)
    np.testing.assert_allclose(state.pairwise_marginals, expected, atol=1e-14)


def test_no_edges():
    rng = np.random.default_rng(6)
    unary = rng.normal(size=(4, 3))
    for n_iter in (None, 0, 3):
        state = trw_forward(np.zeros((0, 2), dtype=np.int64), unary, np.zeros((0, 3, 3)), np.zeros(0), n_iter=n_iter)
        np.testing.assert_allclose(state.unary_marginals, softmax(unary), atol=1e-14)
        assert state.pairwise_marginals.shape == (0, 3, 3)
    state = trw_forward(np.zeros((0, 2), dtype=np.int64), unary, np.zeros((0, 3, 3)), np.zeros(0), n_iter=2,
                        keep_stack=True)
    w = rng.normal(size=unary.shape)
    g_u, g_p = trw_backward(state, w, np.zeros((0, 3, 3)))
    mu = softmax(unary)
    np.testing.assert_allclose(g_u, mu * (w - (w * mu).sum(axis=1, keepdims=True)), atol=1e-14)
    assert g_p.shape == (0, 3, 3)


def test_iteration_count_and_convergence_flag():
    rng = np.random.default_rng(8)
    edges = grid_edges(3, 3)
    unary, pairwise = random_model(edges, 9, 2, rng)
    rho = np.full(len(edges), 0.5)
    for k in (1, 2, 7):
        assert trw_forward(edges, unary, pairwise, rho, n_iter=k).n_iter == k
    state = trw_forward(edges, unary, pairwise, rho, tol=1e-10)
    assert state.converged and 1 <= state.n_iter < 1000
    # the fixed-iteration run with the same count gives the same marginals
    again = trw_forward(edges, unary, pairwise, rho, n_iter=state.n_iter, tol=1e-10)
    # (a fixed count on a grid runs the grid kernels: the same up to rounding)
    np.testing.assert_allclose(again.unary_marginals, state.unary_marginals, rtol=0, atol=1e-15)
    assert again.converged
    capped = trw_forward(edges, unary, pairwise, rho, tol=0.0, max_iter=4)
    assert capped.n_iter == 4 and not capped.converged


def test_read_only_inputs():
    rng = np.random.default_rng(9)
    edges = grid_edges(2, 2)
    unary, pairwise = random_model(edges, 4, 2, rng)
    rho = np.full(len(edges), 0.5)
    arrays = [edges.copy(), unary.copy(), pairwise.copy(), rho.copy()]
    for a in arrays:
        a.setflags(write=False)
    state = trw_forward(*arrays, n_iter=3, keep_stack=True)
    reference = trw_forward(edges, unary, pairwise, rho, n_iter=3)
    np.testing.assert_array_equal(state.unary_marginals, reference.unary_marginals)
    g = np.ones((4, 2))
    g.setflags(write=False)
    trw_backward(state, g, None)


@pytest.mark.parametrize("K", [2, 3, 8])
@pytest.mark.parametrize("rho_value", [0.5, 1.0, "random"])
def test_specialised_kernels_match_generic_kernels(rho_value, K):
    """The kernels compiled for a constant K compute what the generic build does."""
    rng = np.random.default_rng(11)
    edges = grid_edges(3, 4)
    unary, pairwise = random_model(edges, 12, K, rng)
    rho = make_rho(rho_value, len(edges), rng) if rho_value == "random" else np.full(len(edges), rho_value)
    g_mu, g_mu2 = rng.normal(size=(12, K)), rng.normal(size=(len(edges), K, K))

    def run(specialise):
        state = trw._forward(edges, unary, pairwise, rho, n_iter=4, keep_stack=True, specialise=specialise)
        return state, trw_backward(state, g_mu, g_mu2)

    special, (gu_s, gp_s) = run(True)
    generic, (gu_g, gp_g) = run(False)
    assert special.label_token != generic.label_token  # two different compilations ran
    np.testing.assert_allclose(special.unary_marginals, generic.unary_marginals, rtol=0, atol=1e-14)
    np.testing.assert_allclose(special.messages, generic.messages, rtol=0, atol=1e-14)
    np.testing.assert_allclose(gu_s, gu_g, rtol=0, atol=1e-12)
    np.testing.assert_allclose(gp_s, gp_g, rtol=0, atol=1e-12)


# The grid kernels run by default for K = 2 and K >= 8 (see
# trw._use_grid_kernels). K = 2: the general rho class (rho 1/2 and 1 run the
# one-number messages of _trw_grid_binary, tested below). K = 8 (the
# backgrounds experiment): rho = 1/2 in float64, with and without the
# log-domain fallbacks; K = 9: the generic (not specialised) build. Each (K,
# rho class, dtype) takes about half a minute to compile.
@pytest.mark.parametrize(("K", "dtype", "specialise", "cases"), [
    (2, np.float32, True, (("random", 1.0),)),
    (2, np.float64, True, (("random", 1.0), ("random", 800.0))),
    (8, np.float64, True, ((0.5, 1.0), (0.5, 800.0))),
    (9, np.float64, False, ((0.5, 1.0),)),
])
@pytest.mark.parametrize("shape", [(1, 6), (4, 5), (5, 3)])
def test_grid_kernels_match_slot_kernels(shape, K, dtype, specialise, cases):
    """The line kernels of image grids compute bitwise what the slot kernels
    compute: marginals, messages, fallback counts, truncated gradients with
    the full stack and with checkpoints (twice: the second backward pass
    recomputes the checkpoints), fixed-point gradients from their state; rho
    classes, and parameters large enough for the log-domain fallbacks."""
    rng = np.random.default_rng(5)
    edges = grid_edges(*shape)
    n = shape[0] * shape[1]
    for rho_value, scale in cases:
        unary, pairwise = random_model(edges, n, K, rng)
        unary, pairwise = (unary * scale).astype(dtype), (pairwise * scale).astype(dtype)
        rho = make_rho(rho_value, len(edges), rng) if rho_value == "random" else np.full(len(edges), rho_value)
        g_mu, g_mu2 = rng.normal(size=(n, K)), rng.normal(size=(len(edges), K, K))
        for checkpoints in (None, 2):
            states = [trw._forward(edges, unary, pairwise, rho, n_iter=5, keep_stack=True, checkpoints=checkpoints,
                                   specialise=specialise, grid=grid) for grid in (True, False)]
            assert states[0].grid_kernels is not None and states[1].grid_kernels is None
            for name in ("unary_marginals", "pairwise_marginals", "messages", "n_fallback", "converged"):
                assert np.array_equal(getattr(states[0], name), getattr(states[1], name)), name
            if scale > 1:
                assert states[0].n_fallback > 0
            for _ in range(2):
                grads = [trw_backward(state, g_mu, g_mu2) for state in states]
                for got, want in zip(*grads):
                    assert np.array_equal(got, want)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # not converged: not a fixed point
            grads = [trw_backward(state, g_mu, None, mode="fixed_point", max_iter=3) for state in states]
        for got, want in zip(*grads):
            assert np.array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("rho_value", [0.5, 1.0])
@pytest.mark.parametrize("shape", [(1, 6), (4, 5), (5, 3)])
def test_binary_grid_kernels_agree_with_slot_kernels(shape, rho_value, dtype):
    """Two labels, rho 1/2 or 1 on a grid: one number per message
    (``_trw_grid_binary``), the same iterations as the slot kernels up to
    rounding: marginals, messages, truncated gradients (with the full stack,
    and checkpointed twice: bitwise the full stack's), fixed-point
    gradients from the state."""
    rng = np.random.default_rng(21)
    edges = grid_edges(*shape)
    n = shape[0] * shape[1]
    atol, rtol = (1e-13, 1e-10) if dtype == np.float64 else (2e-6, 2e-4)
    for scale in (1.0, 8.0):
        unary, pairwise = random_model(edges, n, 2, rng)
        unary, pairwise = (unary * scale).astype(dtype), (pairwise * scale).astype(dtype)
        rho = np.full(len(edges), rho_value)
        g_mu, g_mu2 = rng.normal(size=(n, 2)), rng.normal(size=(len(edges), 2, 2))
        full = None
        for checkpoints in (None, 2):
            states = [trw._forward(edges, unary, pairwise, rho, n_iter=5, keep_stack=True, checkpoints=checkpoints,
                                   grid=grid) for grid in (True, False)]
            assert states[0].grid_kernels.binary and states[1].grid_kernels is None
            for name in ("unary_marginals", "pairwise_marginals", "messages"):
                got, want = getattr(states[0], name), getattr(states[1], name)
                assert got.dtype == dtype
                np.testing.assert_allclose(got, want, rtol=0, atol=atol, err_msg=name)
            want = trw_backward(states[1], g_mu, g_mu2)
            for _ in range(2):
                got = trw_backward(states[0], g_mu, g_mu2)
                for g, w in zip(got, want):
                    assert g.dtype == dtype
                    np.testing.assert_allclose(g, w, rtol=0, atol=rtol * np.abs(w).max())
                if full is None:
                    full = got
                for g, f in zip(got, full):
                    assert np.array_equal(g, f)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # not converged: not a fixed point
            grads = [trw_backward(state, g_mu, None, mode="fixed_point", max_iter=3) for state in states]
        for got, want in zip(*grads):
            np.testing.assert_allclose(got, want, rtol=0, atol=rtol * np.abs(want).max())


@pytest.mark.parametrize("rho_value", [0.5, 1.0])
def test_binary_grid_kernels_log_domain_lanes(rho_value):
    """Parameters of hundreds: the one-number messages leave the range of
    plain arithmetic and those lanes run in the log domain (forward and
    reverse), exactly: on a chain (a 1 x 3 grid) BP's marginals are the
    brute-force ones, and the truncated gradient of TRW and BP is the
    finite-difference one."""
    edges = chain_edges(3)
    unary = np.array([[0.0, 300.0], [500.0, 0.0], [0.0, 250.0]])
    pairwise = np.array([[[0.0, -900.0], [-900.0, 0.0]], [[0.0, -700.0], [-650.0, 0.0]]])
    rho = np.full(2, rho_value)
    state = trw_forward(edges, unary, pairwise, rho, n_iter=4, keep_stack=True)
    assert state.grid_kernels.binary and state.n_fallback > 0
    if rho_value == 1.0:
        mu, mu2, _ = brute_force(edges, unary, pairwise)
        np.testing.assert_allclose(state.unary_marginals, mu, atol=1e-12)
        np.testing.assert_allclose(state.pairwise_marginals, mu2, atol=1e-12)
    # a loss that the saturated marginals still feel: log mu of the unlikely labels
    weights = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])

    def loss(u, p):
        s = trw_forward(edges, u.reshape(3, 2), p.reshape(2, 2, 2), rho, n_iter=4)
        return float(np.sum(weights * np.log(s.unary_marginals)))

    g_u, g_p = trw_backward(state, weights / state.unary_marginals, None)
    assert np.all(np.isfinite(g_u)) and np.all(np.isfinite(g_p))
    np.testing.assert_allclose(g_u.ravel(), numeric_gradient(lambda u: loss(u, pairwise), unary.ravel(), 1e-4),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(g_p.ravel(), numeric_gradient(lambda p: loss(unary, p), pairwise.ravel(), 1e-4),
                               rtol=1e-6, atol=1e-6)


def test_binary_grid_kernels_float32_log_domain_lanes():
    """float32's narrower range sends some updates of moderate messages to
    the log domain (partial products below ``tiny``), where float64 computes
    them in plain arithmetic: both precisions agree to float32's rounding,
    forward and reverse (a wrong log-domain share or value fails this)."""
    rng = np.random.default_rng(3)
    edges = grid_edges(5, 4)
    unary, pairwise = random_model(edges, 20, 2, rng, scale=25.0)
    rho = np.full(len(edges), 0.5)
    g_mu = rng.normal(size=(20, 2))
    results = []
    for dtype in (np.float64, np.float32):
        state = trw_forward(edges, unary.astype(dtype), pairwise.astype(dtype), rho, n_iter=5, keep_stack=True)
        results.append((state.n_fallback, state.unary_marginals, *trw_backward(state, g_mu, None)))
    (fallbacks64, *want), (fallbacks32, *got) = results
    assert fallbacks64 == 0 and fallbacks32 > 10
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=5e-7)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, w, rtol=0, atol=5e-5 * np.abs(w).max())


@pytest.mark.parametrize("shape", [(1, 6), (6, 1), (4, 5), (3, 7)])
def test_grid_kernels_run_on_exactly_the_grid_edges(shape):
    """The line kernels take the edges of ``grid_edges(H, W)`` and nothing
    else: the same graph with its edges reordered, an edge reversed, an edge
    missing or an isolated node more goes to the slot kernels, with the same
    marginals (a column is the chain of one row)."""
    rng = np.random.default_rng(11)
    edges = grid_edges(*shape)
    n = shape[0] * shape[1]
    unary, pairwise = random_model(edges, n, 2, rng)
    rho = np.full(len(edges), 0.5)
    grid = trw_forward(edges, unary, pairwise, rho, n_iter=300)  # converged, whatever the schedule
    assert grid.grid_kernels is not None
    swapped = np.r_[1, 0, 2:len(edges)]
    reversed_edge = edges.copy()
    reversed_edge[-1] = reversed_edge[-1, ::-1]
    variants = [
        (edges[swapped], pairwise[swapped], rho, n),
        (reversed_edge, np.r_[pairwise[:-1], pairwise[-1:].transpose(0, 2, 1)], rho, n),
        (edges[:-1], pairwise[:-1], rho[:-1], n),
        (edges, pairwise, rho, n + 1),
    ]
    for k, (var_edges, var_pairwise, var_rho, var_n) in enumerate(variants):
        var_unary = np.r_[unary, np.zeros((var_n - n, 2))]
        state = trw_forward(var_edges, var_unary, var_pairwise, var_rho, n_iter=300)
        assert state.grid_kernels is None, k
        if k != 2:  # the same model in another form
            np.testing.assert_allclose(state.unary_marginals[:n], grid.unary_marginals, rtol=0, atol=1e-9)


@pytest.mark.parametrize("rho_value", [0.5, "random"])
def test_grid_pairwise_marginals_on_first_access(rho_value):
    """A state of the grid kernels computes its pairwise marginals when they
    are first read (a loss of the unary marginals never reads them): read
    after backward passes (checkpointed, twice) they are those read straight
    after the forward pass and those of ``infer``, and the log-domain
    fallbacks they needed are counted then."""
    rng = np.random.default_rng(11)
    edges = grid_edges(4, 5)
    unary, pairwise = random_model(edges, 20, 2, rng)
    unary, pairwise = unary * 800, pairwise * 800  # log-domain fallbacks
    rho = make_rho(rho_value, len(edges), rng) if rho_value == "random" else np.full(len(edges), rho_value)
    first = trw_forward(edges, unary, pairwise, rho, n_iter=5, keep_stack=True)
    assert first.grid_kernels is not None
    want, fallbacks = first.pairwise_marginals, first.n_fallback
    later = trw_forward(edges, unary, pairwise, rho, n_iter=5, keep_stack=True, checkpoints=2)
    g_mu = rng.normal(size=(20, 2))
    for _ in range(2):
        trw_backward(later, g_mu, None)
    assert later.n_fallback < fallbacks  # not counted before the first read
    assert np.array_equal(later.pairwise_marginals, want)
    assert later.n_fallback == fallbacks
    with pytest.warns(RuntimeWarning, match="at the floor"):  # parameters this large floor some messages
        assert np.array_equal(infer(edges, unary, pairwise, n_iter=5, rho=rho).pairwise, want)


@pytest.mark.parametrize("rho_value", [0.5, 1.0])
@pytest.mark.parametrize("K", [2, 5])
def test_stability_huge_parameters(K, rho_value):
    rng = np.random.default_rng(K)
    edges = grid_edges(3, 3)
    unary, pairwise = random_model(edges, 9, K, rng, scale=1e3)
    rho = np.full(len(edges), rho_value)
    for n_iter in (3, None):
        state = trw_forward(edges, unary, pairwise, rho, n_iter=n_iter, max_iter=50, keep_stack=n_iter is not None)
        for mu in (state.unary_marginals, state.pairwise_marginals):
            assert np.all(np.isfinite(mu)) and np.all(mu >= 0)
        np.testing.assert_allclose(state.unary_marginals.sum(axis=1), 1.0, atol=1e-12)
        np.testing.assert_allclose(state.pairwise_marginals.sum(axis=(1, 2)), 1.0, atol=1e-12)
        assert np.all(np.isfinite(state.messages))
        np.testing.assert_allclose(state.messages.sum(axis=2), 1.0, atol=1e-12)
        if n_iter is not None:
            g_u, g_p = trw_backward(state, rng.normal(size=(9, K)), None)
            assert np.all(np.isfinite(g_u)) and np.all(np.isfinite(g_p))


def test_stability_log_domain_fallback_is_used_and_exact():
    # strongly coupled nodes: message sums underflow (the log-domain path runs),
    # while every message stays representable, so BP on this chain stays exact
    edges = chain_edges(3)
    unary = np.array([[0.0, 300.0], [500.0, 0.0], [0.0, 250.0]])
    pairwise = np.array([[[0.0, -900.0], [-900.0, 0.0]], [[0.0, -700.0], [-650.0, 0.0]]])
    state = trw_forward(edges, unary, pairwise, np.ones(2), tol=1e-14)
    assert state.n_fallback > 0 and state.converged
    mu, mu2, _ = brute_force(edges, unary, pairwise)
    np.testing.assert_allclose(state.unary_marginals, mu, atol=1e-12)
    np.testing.assert_allclose(state.pairwise_marginals, mu2, atol=1e-12)
    # TRW (rho = 0.5): a locally consistent fixed point. (Fixed n_iter: the
    # saturated unary marginals do not move in the first iteration, so the
    # unary-marginal stopping rule would stop there.)
    state = trw_forward(edges, unary, pairwise, np.full(2, 0.5), n_iter=50)
    assert state.n_fallback > 0
    mu, mu2 = state.unary_marginals, state.pairwise_marginals
    np.testing.assert_allclose(mu2.sum(axis=2), mu[edges[:, 0]], atol=1e-12)
    np.testing.assert_allclose(mu2.sum(axis=1), mu[edges[:, 1]], atol=1e-12)


# ---------------------------------------------------------------------------
# truncated back TRW
# ---------------------------------------------------------------------------


def truncated_loss_and_grad(edges, unary, pairwise, rho, n_iter, loss):
    """loss(mu, mu2) -> (L, dL/dmu, dL/dmu2); returns L and back TRW gradients."""
    state = trw_forward(edges, unary, pairwise, rho, n_iter=n_iter, keep_stack=True)
    value, g_mu, g_mu2 = loss(state.unary_marginals, state.pairwise_marginals)
    return value, trw_backward(state, g_mu, g_mu2, mode="truncated")


def linear_loss(rng, n, E, K):
    w_u, w_p = rng.normal(size=(n, K)), rng.normal(size=(E, K, K))
    return lambda mu, mu2: ((w_u * mu).sum() + (w_p * mu2).sum(), w_u, w_p)


def log_loss(rng, n, E, K):
    labels = rng.integers(0, K, size=n)
    rows = np.arange(n)

    def loss(mu, mu2):
        g = np.zeros_like(mu)
        g[rows, labels] = -1.0 / mu[rows, labels]
        return -np.log(mu[rows, labels]).sum(), g, None

    return loss


def check_against_finite_differences(edges, unary, pairwise, rho, loss, forward, backward_grads, tol=1e-6):
    def objective_u(u):
        return loss(*forward(u, pairwise))[0]

    def objective_p(p):
        return loss(*forward(unary, p))[0]

    num_u = numeric_gradient(objective_u, unary)
    num_p = numeric_gradient(objective_p, pairwise) if len(edges) else np.zeros_like(pairwise)
    g_u, g_p = backward_grads
    assert relative_error(g_u, num_u) <= tol, (relative_error(g_u, num_u), g_u, num_u)
    if len(edges):
        assert relative_error(g_p, num_p) <= tol, (relative_error(g_p, num_p), g_p, num_p)


TRUNCATED_CASES = [
    # (graph, K, rho, n_iter, loss)
    ("grid3x3", 2, "0.5", 1, "linear"),
    ("grid3x3", 2, "1", 5, "log"),
    ("grid3x3", 3, "random", 2, "linear"),
    ("grid3x3", 3, "0.5", 5, "log"),
    ("grid3x4", 2, "random", 5, "linear"),
    ("grid3x4", 3, "1", 2, "log"),
    ("grid3x4", 2, "0.5", 2, "log"),
    ("chain5", 2, "1", 2, "linear"),
    ("chain5", 3, "random", 5, "log"),
    ("chain5", 3, "0.5", 1, "log"),
    ("isolated", 2, "random", 2, "log"),
    ("isolated", 3, "1", 5, "linear"),
    ("isolated", 3, "0.5", 1, "linear"),
    ("grid3x4", 8, "random", 3, "log"),  # the largest K compiled with constant label loops
]


@pytest.mark.parametrize("graph,K,rho_kind,n_iter,loss_kind", TRUNCATED_CASES)
def test_truncated_gradient_matches_finite_differences(graph, K, rho_kind, n_iter, loss_kind):
    rng = np.random.default_rng(zlib.crc32(repr((graph, K, rho_kind, n_iter, loss_kind)).encode()))
    n, edges = GRAPHS[graph]()
    E = len(edges)
    unary, pairwise = random_model(edges, n, K, rng)
    rho = make_rho(rho_kind, E, rng)
    loss = (linear_loss if loss_kind == "linear" else log_loss)(rng, n, E, K)

    def forward(u, p):
        state = trw_forward(edges, u, p, rho, n_iter=n_iter)
        return state.unary_marginals, state.pairwise_marginals

    _, grads = truncated_loss_and_grad(edges, unary, pairwise, rho, n_iter, loss)
    check_against_finite_differences(edges, unary, pairwise, rho, loss, forward, grads)


def test_truncated_gradient_zero_iterations():
    rng = np.random.default_rng(12)
    n, edges = GRAPHS["grid3x3"]()
    unary, pairwise = random_model(edges, n, 3, rng)
    rho = make_rho("random", len(edges), rng)
    loss = linear_loss(rng, n, len(edges), 3)

    def forward(u, p):
        state = trw_forward(edges, u, p, rho, n_iter=0)
        return state.unary_marginals, state.pairwise_marginals

    _, grads = truncated_loss_and_grad(edges, unary, pairwise, rho, 0, loss)
    check_against_finite_differences(edges, unary, pairwise, rho, loss, forward, grads)


def test_backward_leaves_state_reusable():
    rng = np.random.default_rng(13)
    edges = grid_edges(3, 3)
    unary, pairwise = random_model(edges, 9, 2, rng)
    rho = np.full(len(edges), 0.5)
    state = trw_forward(edges, unary, pairwise, rho, n_iter=3, keep_stack=True)
    messages = state.messages.copy()
    g = rng.normal(size=(9, 2))
    first = trw_backward(state, g, None)
    np.testing.assert_array_equal(state.messages, messages)
    second = trw_backward(state, g, None)
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])


# ---------------------------------------------------------------------------
# fixed-point back-propagation
# ---------------------------------------------------------------------------

FIXED_POINT_CASES = [
    ("grid3x3", 2, "0.5", "linear"),
    ("grid3x3", 3, "0.5", "log"),
    ("grid3x4", 2, "random", "log"),
    ("grid3x3", 2, "1", "linear"),  # loopy BP (weak couplings, converges)
    ("chain5", 3, "1", "log"),
    ("isolated", 3, "random", "linear"),
]


@pytest.mark.parametrize("graph,K,rho_kind,loss_kind", FIXED_POINT_CASES)
def test_fixed_point_gradient_matches_finite_differences(graph, K, rho_kind, loss_kind):
    rng = np.random.default_rng(zlib.crc32(repr((graph, K, rho_kind, loss_kind, "fp")).encode()))
    n, edges = GRAPHS[graph]()
    E = len(edges)
    unary, pairwise = random_model(edges, n, K, rng)
    rho = make_rho(rho_kind, E, rng)
    loss = (linear_loss if loss_kind == "linear" else log_loss)(rng, n, E, K)

    def forward(u, p):
        state = trw_forward(edges, u, p, rho, tol=1e-13, max_iter=5000)
        assert state.converged
        return state.unary_marginals, state.pairwise_marginals

    state = trw_forward(edges, unary, pairwise, rho, tol=1e-13, max_iter=5000)
    assert state.converged
    _, g_mu, g_mu2 = loss(state.unary_marginals, state.pairwise_marginals)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grads = trw_backward(state, g_mu, g_mu2, mode="fixed_point", tol=1e-13)
    check_against_finite_differences(edges, unary, pairwise, rho, loss, forward, grads)


def test_fixed_point_warns_when_not_converged():
    rng = np.random.default_rng(14)
    edges = grid_edges(3, 3)
    unary, pairwise = random_model(edges, 9, 2, rng)
    rho = np.full(len(edges), 0.5)
    state = trw_forward(edges, unary, pairwise, rho, tol=1e-12)
    g = rng.normal(size=(9, 2))
    with pytest.warns(RuntimeWarning, match="did not converge"):
        g_u, g_p = trw_backward(state, g, None, mode="fixed_point", tol=1e-14, max_iter=2)
    assert np.all(np.isfinite(g_u)) and np.all(np.isfinite(g_p))
    unconverged = trw_forward(edges, unary, pairwise, rho, n_iter=1)
    with pytest.warns(RuntimeWarning, match="not a fixed point"):
        trw_backward(unconverged, g, None, mode="fixed_point")


def test_argument_errors():
    rng = np.random.default_rng(15)
    edges = grid_edges(2, 2)
    unary, pairwise = random_model(edges, 4, 2, rng)
    rho = np.full(len(edges), 0.5)
    with pytest.raises(ValueError, match="keep_stack"):
        trw_forward(edges, unary, pairwise, rho, keep_stack=True)
    state = trw_forward(edges, unary, pairwise, rho, n_iter=2)
    with pytest.raises(ValueError, match="keep_stack"):
        trw_backward(state, np.zeros((4, 2)), None, mode="truncated")
    with pytest.raises(ValueError, match="mode"):
        trw_backward(state, np.zeros((4, 2)), None, mode="implicit")


# ---------------------------------------------------------------------------
# interleaved execution order of the K = 2 forward sweep
# ---------------------------------------------------------------------------


def random_graph(n, n_edges, rng):
    """``n_edges`` distinct random edges on ``n`` nodes, in random order."""
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    return n, np.array([pairs[k] for k in rng.choice(len(pairs), size=n_edges, replace=False)], dtype=np.int64)


def random_walk_graph(n, n_walks, length, rng):
    """Edges along random walks, in walking order: chains of the canonical
    order that share nodes with each other, which must not be merged."""
    edges, seen = [], set()
    for _ in range(n_walks):
        v = int(rng.integers(n))
        for _ in range(length):
            w = int(rng.integers(n))
            if w != v and (min(v, w), max(v, w)) not in seen:
                seen.add((min(v, w), max(v, w)))
                edges.append((v, w))
                v = w
    return n, np.array(edges, dtype=np.int64)


INTERLEAVE_GRAPHS = {
    "grid1x7": lambda rng: (7, grid_edges(1, 7)),
    "grid6x1": lambda rng: (6, grid_edges(6, 1)),
    "grid4x5": lambda rng: (20, grid_edges(4, 5)),
    "grid5x3": lambda rng: (15, grid_edges(5, 3)),
    "chain6": lambda rng: (6, chain_edges(6)),
    "random": lambda rng: random_graph(9, 16, rng),
    "walks3": lambda rng: random_walk_graph(10, 8, 3, rng),
    "walks4": lambda rng: random_walk_graph(10, 8, 4, rng),
    "isolated": lambda rng: isolated_node_graph(),
}


def interleave_graph(graph):
    # (with this seed the walk graphs have chains that conflict in each of the
    # three ways of _interleave: the tests fail when any check is dropped)
    return INTERLEAVE_GRAPHS[graph](np.random.default_rng(zlib.crc32(b"walks")))


def conflict(sched, slot_edge, a, b):
    """Whether schedule steps ``a`` and ``b`` share a resource that one of them
    writes, by the definition: a step reads the sender's slots and writes its
    target slot, its sender and its edge (those the reverse sweeps accumulate
    into)."""

    def resources(st):
        t, _, lo, hi, u = (int(x) for x in sched[st])
        return {("slot", k) for k in range(lo, hi)}, {("slot", t), ("node", u), ("edge", int(slot_edge[t]))}

    (reads_a, writes_a), (reads_b, writes_b) = resources(a), resources(b)
    return bool(writes_a & (reads_b | writes_b) or writes_b & reads_a)


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("graph", sorted(INTERLEAVE_GRAPHS))
def test_interleaved_order_keeps_every_conflicting_pair_in_order(graph, width):
    n, edges = interleave_graph(graph)
    rho = np.full(len(edges), 0.5)
    ptr, slot_edge, slot_side, slot_of, _ = trw._slots(n, edges, rho)
    sched, canonical, _ = trw._schedule(n, edges, rho, ptr, slot_edge, slot_side, slot_of, False)
    np.testing.assert_array_equal(canonical, np.arange(len(sched)))
    order = np.empty_like(canonical)
    trw._interleave(sched, edges, slot_edge, slot_side, n, width, order)
    np.testing.assert_array_equal(np.sort(order), canonical)  # a permutation
    position = np.argsort(order)
    for a in range(len(sched)):
        for b in range(a + 1, len(sched)):
            if conflict(sched, slot_edge, a, b):
                assert position[a] < position[b], (a, b)
    if graph in ("grid4x5", "grid5x3", "walks3"):
        assert not np.array_equal(order, canonical)  # something was interleaved


def everything(edges, unary, pairwise, rho, n_iter, interleave):
    """Forward state and gradients (truncated for a fixed ``n_iter``, fixed
    point otherwise)."""
    rng = np.random.default_rng(0)
    g_mu, g_mu2 = rng.normal(size=unary.shape), rng.normal(size=pairwise.shape)
    state = trw._forward(edges, unary, pairwise, rho, n_iter=n_iter, max_iter=300, keep_stack=n_iter is not None,
                         interleave=interleave)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # non-convergence and floored messages are fine here
        grads = trw_backward(state, g_mu, g_mu2, mode="fixed_point" if n_iter is None else "truncated", max_iter=300)
    return {
        "unary": state.unary_marginals, "pairwise": state.pairwise_marginals, "messages": state.messages,
        "stack": state.stack, "n_fallback": state.n_fallback, "n_iter": state.n_iter, "converged": state.converged,
        "grad_unary": grads[0], "grad_pairwise": grads[1],
    }


def assert_interleaving_changes_nothing(*args):
    interleaved = everything(*args, interleave=True)
    canonical = everything(*args, interleave=False)
    for key, value in interleaved.items():
        if value is None:
            assert canonical[key] is None, key
        else:
            a, b = np.asarray(value), np.asarray(canonical[key])
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), key  # bitwise
    return interleaved


@pytest.mark.parametrize("n_iter", [4, None])
@pytest.mark.parametrize("rho_kind", ["0.5", "1", "random"])
@pytest.mark.parametrize("graph", sorted(INTERLEAVE_GRAPHS))
def test_interleaved_order_gives_bitwise_identical_results(graph, rho_kind, n_iter):
    # K = 2 only: the other kernels run in canonical order either way
    rng = np.random.default_rng(zlib.crc32(repr((graph, 2, rho_kind, n_iter)).encode()))
    n, edges = interleave_graph(graph)
    unary, pairwise = random_model(edges, n, 2, rng)
    assert_interleaving_changes_nothing(edges, unary, pairwise, make_rho(rho_kind, len(edges), rng), n_iter)


@pytest.mark.parametrize("n_iter", [5, None])
@pytest.mark.parametrize("rho_kind", ["0.5", "1", "random"])
def test_interleaved_order_gives_bitwise_identical_results_with_fallback(rho_kind, n_iter):
    rng = np.random.default_rng(zlib.crc32(repr((rho_kind, n_iter, "fallback")).encode()))
    edges = grid_edges(4, 5)
    unary, pairwise = random_model(edges, 20, 2, rng, scale=1e3)
    result = assert_interleaving_changes_nothing(
        edges, unary, pairwise, make_rho(rho_kind, len(edges), rng), n_iter
    )
    assert result["n_fallback"] > 0
