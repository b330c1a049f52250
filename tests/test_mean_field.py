"""Tests of sequential mean field and back mean field (truncated and fixed point)."""

import warnings
import zlib

import numpy as np
import pytest

from reference import chain_edges, numeric_gradient, random_model
from sklearn_margcrf._graph import grid_edges
from sklearn_margcrf.mean_field import mean_field_backward, mean_field_forward


def softmax(theta):
    z = np.exp(theta - theta.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def simultaneous_update(edges, unary, pairwise, mu):
    """One parallel application of the mean-field update, straight from the paper."""
    field = unary.copy()
    for e, (i, j) in enumerate(edges):
        field[i] += pairwise[e] @ mu[j]
        field[j] += pairwise[e].T @ mu[i]
    return softmax(field)


def sequential_reference(edges, unary, pairwise, n_iter):
    """Plain-numpy sequential mean field from softmax(unary), nodes 0..n-1."""
    mu = softmax(unary)
    for _ in range(n_iter):
        for v in range(unary.shape[0]):
            field = unary[v].copy()
            for e, (i, j) in enumerate(edges):
                if i == v:
                    field += pairwise[e] @ mu[j]
                elif j == v:
                    field += pairwise[e].T @ mu[i]
            mu[v] = softmax(field[None])[0]
    return mu


GRAPHS = {
    "grid3x3": (grid_edges(3, 3), 9),
    "grid3x4": (grid_edges(3, 4), 12),
    "chain5": (chain_edges(5), 5),
    # a chain plus an isolated node (node 5) and a reversed edge
    "chain_isolated": (np.array([[0, 1], [2, 1], [2, 3], [3, 4]], dtype=np.int64), 6),
}


def relative_error(a, b):
    return np.linalg.norm(np.ravel(a) - np.ravel(b)) / max(np.linalg.norm(np.ravel(b)), 1e-300)


def make_problem(name, n_states, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    edges, n = GRAPHS[name]
    unary, pairwise = random_model(edges, n, n_states, rng, scale=scale)
    return rng, edges, unary, pairwise


# --------------------------------------------------------------------------- forward

def test_zero_iterations_is_independent_model():
    rng, edges, unary, pairwise = make_problem("grid3x3", 3, 0)
    state = mean_field_forward(edges, unary, pairwise, n_iter=0, keep_stack=True)
    assert state.n_iter == 0 and not state.converged
    np.testing.assert_allclose(state.unary_marginals, softmax(unary), rtol=0, atol=1e-15)
    mu = state.unary_marginals
    np.testing.assert_allclose(state.pairwise_marginals,
                               mu[edges[:, 0], :, None] * mu[edges[:, 1], None, :], atol=1e-15)
    assert state.stack.shape == (0, 9, 3)


def test_no_edges_converges_to_softmax():
    rng = np.random.default_rng(1)
    unary = rng.normal(size=(4, 3))
    edges = np.zeros((0, 2), dtype=np.int64)
    state = mean_field_forward(edges, unary, np.zeros((0, 3, 3)))
    assert state.converged and state.n_iter == 1
    np.testing.assert_allclose(state.unary_marginals, softmax(unary), atol=1e-15)
    assert state.pairwise_marginals.shape == (0, 3, 3)


@pytest.mark.parametrize("n_states", [2, 3])
def test_matches_plain_sequential_reference(n_states):
    rng, edges, unary, pairwise = make_problem("grid3x4", n_states, 2)
    for n_iter in (1, 3):
        state = mean_field_forward(edges, unary, pairwise, n_iter=n_iter)
        np.testing.assert_allclose(state.unary_marginals,
                                   sequential_reference(edges, unary, pairwise, n_iter),
                                   rtol=0, atol=1e-13)


@pytest.mark.parametrize("n_states", [2, 3])
def test_fixed_point_satisfies_update(n_states):
    rng, edges, unary, pairwise = make_problem("grid3x4", n_states, 3)
    state = mean_field_forward(edges, unary, pairwise, tol=1e-13, max_iter=10000)
    assert state.converged
    mu = state.unary_marginals
    np.testing.assert_allclose(mu.sum(axis=1), 1.0, atol=1e-14)
    assert np.abs(simultaneous_update(edges, unary, pairwise, mu) - mu).max() < 1e-10


def test_stack_holds_marginals_before_each_iteration():
    rng, edges, unary, pairwise = make_problem("grid3x3", 3, 4)
    state = mean_field_forward(edges, unary, pairwise, n_iter=4, keep_stack=True)
    assert state.stack.shape == (4, 9, 3)
    for t in range(4):
        before = mean_field_forward(edges, unary, pairwise, n_iter=t).unary_marginals
        np.testing.assert_array_equal(state.stack[t], before)


def test_run_to_convergence_with_stack():
    rng, edges, unary, pairwise = make_problem("grid3x3", 2, 5)
    # scale chosen so that convergence needs more than the first chunk of 16
    state = mean_field_forward(edges, unary, 1.5 * pairwise, tol=1e-12, keep_stack=True)
    plain = mean_field_forward(edges, unary, 1.5 * pairwise, tol=1e-12)
    assert state.converged and state.n_iter == plain.n_iter
    assert state.stack.shape[0] == state.n_iter
    np.testing.assert_array_equal(state.unary_marginals, plain.unary_marginals)
    fixed = mean_field_forward(edges, unary, 1.5 * pairwise, n_iter=state.n_iter, keep_stack=True)
    np.testing.assert_array_equal(state.stack, fixed.stack)


def test_max_iter_stops_unconverged():
    rng, edges, unary, pairwise = make_problem("grid3x3", 2, 6, scale=3.0)
    state = mean_field_forward(edges, unary, pairwise, tol=1e-300, max_iter=3)
    assert state.n_iter == 3 and not state.converged


def test_duplicate_edges_add_up():
    rng = np.random.default_rng(7)
    unary = rng.normal(size=(3, 3))
    pairwise = rng.normal(size=(3, 3, 3))
    edges = np.array([[0, 1], [1, 0], [1, 2]], dtype=np.int64)
    merged = np.stack([pairwise[0] + pairwise[1].T, pairwise[2]])
    a = mean_field_forward(edges, unary, pairwise, n_iter=4).unary_marginals
    b = mean_field_forward(edges[[0, 2]], unary, merged, n_iter=4).unary_marginals
    np.testing.assert_allclose(a, b, atol=1e-14)


@pytest.mark.parametrize("shape", [(1, 6), (5, 1), (2, 2), (7, 5), (13, 29)])
@pytest.mark.parametrize("n_states,dtype", [(2, np.float64), (3, np.float64), (5, np.float64),
                                            (2, np.float32), (7, np.float32)])
def test_grid_sweep_equals_node_by_node(shape, n_states, dtype):
    """On a grid, mean field runs its updates diagonal by diagonal: the same
    updates in the same order as node by node, which the same model runs once
    one more edge, of zero parameters, makes the graph no grid. Marginals,
    stack, iteration count and gradients agree up to exp's last bit."""
    H, W = shape
    rng = np.random.default_rng(H * 31 + W * 7 + n_states)
    edges = grid_edges(H, W)
    n = H * W
    other = np.concatenate([edges, [[0, n - 1]]])
    atol = 1e-13 if dtype == np.float64 else 2e-6
    for scale in (1.0, 8.0):
        unary, pairwise = (a.astype(dtype) for a in random_model(edges, n, n_states, rng, scale=scale))
        with_zero_edge = np.concatenate([pairwise, np.zeros((1, n_states, n_states), dtype)])
        labels = rng.integers(0, n_states, n)
        for n_iter in (1, 4, None):
            grid = mean_field_forward(edges, unary, pairwise, n_iter=n_iter, tol=1e-4, keep_stack=True)
            nodes = mean_field_forward(other, unary, with_zero_edge, n_iter=n_iter, tol=1e-4, keep_stack=True)
            assert grid.n_iter == nodes.n_iter and grid.unary_marginals.dtype == dtype
            np.testing.assert_allclose(grid.unary_marginals, nodes.unary_marginals, rtol=0, atol=atol)
            np.testing.assert_allclose(grid.stack, nodes.stack, rtol=0, atol=atol)
            g_mu = np.zeros((n, n_states), dtype)
            g_mu[np.arange(n), labels] = -1
            g_unary, g_pairwise = mean_field_backward(grid, g_mu, None)
            n_unary, n_pairwise = mean_field_backward(nodes, g_mu, None)
            bound = 10 * atol * (1 + np.abs(n_unary).max())
            np.testing.assert_allclose(g_unary, n_unary, rtol=0, atol=bound)
            np.testing.assert_allclose(g_pairwise, n_pairwise[:-1], rtol=0, atol=bound)


@pytest.mark.parametrize("checkpoints", [1, 3])
def test_grid_sweep_recomputes_checkpointed_stack(checkpoints):
    """A checkpointed backward recomputes the grid's snapshots with the same
    sweep: the gradient equals the full stack's, bit for bit."""
    rng = np.random.default_rng(11)
    edges = grid_edges(6, 8)
    unary, pairwise = random_model(edges, 48, 3, rng, scale=2.0)
    g_mu = rng.normal(size=(48, 3))
    full = mean_field_backward(mean_field_forward(edges, unary, pairwise, n_iter=9, keep_stack=True), g_mu, None)
    kept = mean_field_forward(edges, unary, pairwise, n_iter=9, keep_stack=True, checkpoints=checkpoints)
    for _ in range(2):  # the second backward re-keeps the snapshots that the first overwrote
        for a, b in zip(mean_field_backward(kept, g_mu, None), full):
            np.testing.assert_array_equal(a, b)


def test_read_only_inputs():
    rng, edges, unary, pairwise = make_problem("grid3x3", 2, 8)
    for array in (edges, unary, pairwise):
        array.setflags(write=False)
    state = mean_field_forward(edges, unary, pairwise, n_iter=3, keep_stack=True)
    grad = np.ones((9, 2))
    grad.setflags(write=False)
    g_unary, g_pairwise = mean_field_backward(state, grad, None)
    assert np.all(np.isfinite(g_unary)) and np.all(np.isfinite(g_pairwise))


# --------------------------------------------------------------------------- truncated backward

def linear_loss(weights_unary, weights_pairwise):
    def loss(state):
        return (np.sum(weights_unary * state.unary_marginals)
                + np.sum(weights_pairwise * state.pairwise_marginals))

    def grads(state):
        return weights_unary, weights_pairwise
    return loss, grads


def log_loss(labels):
    index = np.arange(labels.shape[0])

    def loss(state):
        return -np.sum(np.log(state.unary_marginals[index, labels]))

    def grads(state):
        g = np.zeros_like(state.unary_marginals)
        g[index, labels] = -1.0 / state.unary_marginals[index, labels]
        return g, None
    return loss, grads


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("n_states", [2, 3])
@pytest.mark.parametrize("n_iter", [1, 2, 5])
@pytest.mark.parametrize("kind", ["linear", "log"])
def test_truncated_gradient_matches_finite_differences(graph, n_states, n_iter, kind):
    seed = zlib.crc32(f"{graph}-{n_states}-{n_iter}-{kind}".encode())
    rng, edges, unary, pairwise = make_problem(graph, n_states, seed)
    if kind == "linear":
        loss, grads = linear_loss(rng.normal(size=unary.shape), rng.normal(size=pairwise.shape))
    else:
        loss, grads = log_loss(rng.integers(0, n_states, size=unary.shape[0]))

    def objective(u, p):
        return loss(mean_field_forward(edges, u, p, n_iter=n_iter))

    state = mean_field_forward(edges, unary, pairwise, n_iter=n_iter, keep_stack=True)
    g_unary, g_pairwise = mean_field_backward(state, *grads(state))
    fd_unary = numeric_gradient(lambda u: objective(u, pairwise), unary)
    fd_pairwise = numeric_gradient(lambda p: objective(unary, p), pairwise)
    assert relative_error(g_unary, fd_unary) <= 1e-6
    assert relative_error(g_pairwise, fd_pairwise) <= 1e-6


def test_truncated_gradient_zero_iterations():
    rng, edges, unary, pairwise = make_problem("grid3x3", 3, 9)
    loss, grads = linear_loss(rng.normal(size=unary.shape), rng.normal(size=pairwise.shape))
    state = mean_field_forward(edges, unary, pairwise, n_iter=0)  # no stack needed
    g_unary, g_pairwise = mean_field_backward(state, *grads(state))
    fd_unary = numeric_gradient(
        lambda u: loss(mean_field_forward(edges, u, pairwise, n_iter=0)), unary)
    fd_pairwise = numeric_gradient(
        lambda p: loss(mean_field_forward(edges, unary, p, n_iter=0)), pairwise)
    assert relative_error(g_unary, fd_unary) <= 1e-6
    assert relative_error(g_pairwise, fd_pairwise) <= 1e-6


def test_truncated_backward_is_repeatable_and_leaves_state_intact():
    rng, edges, unary, pairwise = make_problem("grid3x4", 3, 10)
    state = mean_field_forward(edges, unary, pairwise, n_iter=3, keep_stack=True)
    mu, stack = state.unary_marginals.copy(), state.stack.copy()
    g = rng.normal(size=unary.shape)
    first = mean_field_backward(state, g, None)
    second = mean_field_backward(state, g, None)
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
    np.testing.assert_array_equal(state.unary_marginals, mu)
    np.testing.assert_array_equal(state.stack, stack)


def test_truncated_needs_stack_and_valid_mode():
    rng, edges, unary, pairwise = make_problem("grid3x3", 2, 11)
    state = mean_field_forward(edges, unary, pairwise, n_iter=2)
    with pytest.raises(ValueError, match="keep_stack"):
        mean_field_backward(state, np.ones((9, 2)), None)
    with pytest.raises(ValueError, match="mode"):
        mean_field_backward(state, np.ones((9, 2)), None, mode="bogus")
    with pytest.raises(ValueError, match="shape"):
        mean_field_backward(state, np.ones((9, 3)), None)


# --------------------------------------------------------------------------- fixed-point backward

@pytest.mark.parametrize("graph", ["grid3x3", "chain_isolated"])
@pytest.mark.parametrize("n_states", [2, 3])
@pytest.mark.parametrize("kind", ["linear", "log"])
def test_fixed_point_gradient_matches_finite_differences(graph, n_states, kind):
    seed = zlib.crc32(f"fp-{graph}-{n_states}-{kind}".encode())
    rng, edges, unary, pairwise = make_problem(graph, n_states, seed)
    pairwise = 0.5 * pairwise
    if kind == "linear":
        loss, grads = linear_loss(rng.normal(size=unary.shape), rng.normal(size=pairwise.shape))
    else:
        loss, grads = log_loss(rng.integers(0, n_states, size=unary.shape[0]))

    def objective(u, p):
        return loss(mean_field_forward(edges, u, p, tol=1e-13, max_iter=100000))

    state = mean_field_forward(edges, unary, pairwise, tol=1e-13, max_iter=100000)
    assert state.converged
    g_unary, g_pairwise = mean_field_backward(state, *grads(state), mode="fixed_point")
    fd_unary = numeric_gradient(lambda u: objective(u, pairwise), unary, eps=1e-5)
    fd_pairwise = numeric_gradient(lambda p: objective(unary, p), pairwise, eps=1e-5)
    assert relative_error(g_unary, fd_unary) <= 1e-6
    assert relative_error(g_pairwise, fd_pairwise) <= 1e-6


def test_fixed_point_equals_long_truncation():
    rng, edges, unary, pairwise = make_problem("grid3x4", 3, 12, scale=0.7)
    state = mean_field_forward(edges, unary, pairwise, tol=1e-14, max_iter=100000)
    long = mean_field_forward(edges, unary, pairwise, n_iter=state.n_iter + 200, keep_stack=True)
    g = rng.normal(size=unary.shape)
    fixed = mean_field_backward(state, g, None, mode="fixed_point", tol=1e-14)
    truncated = mean_field_backward(long, g, None)
    np.testing.assert_allclose(fixed[0], truncated[0], atol=1e-10)
    np.testing.assert_allclose(fixed[1], truncated[1], atol=1e-10)


def test_fixed_point_warnings():
    rng, edges, unary, pairwise = make_problem("grid3x3", 2, 13)
    g = rng.normal(size=unary.shape)
    state = mean_field_forward(edges, unary, pairwise, tol=1e-12)
    with pytest.warns(RuntimeWarning, match="did not converge"):
        result = mean_field_backward(state, g, None, mode="fixed_point", tol=1e-30, max_iter=2)
    assert all(np.all(np.isfinite(r)) for r in result)
    unconverged = mean_field_forward(edges, unary, pairwise, n_iter=1)
    with pytest.warns(RuntimeWarning, match="not converged"):
        mean_field_backward(unconverged, g, None, mode="fixed_point")


# --------------------------------------------------------------------------- stability

@pytest.mark.parametrize("n_states", [2, 4])
def test_large_parameters_are_stable(n_states):
    rng, edges, unary, pairwise = make_problem("grid3x4", n_states, 14, scale=1e3)
    state = mean_field_forward(edges, unary, pairwise, n_iter=5, keep_stack=True)
    mu = state.unary_marginals
    assert np.all(np.isfinite(mu)) and np.all(mu >= 0)
    np.testing.assert_allclose(mu.sum(axis=1), 1.0, atol=1e-12)
    g_unary, g_pairwise = mean_field_backward(state, rng.normal(size=mu.shape),
                                              rng.normal(size=pairwise.shape))
    assert np.all(np.isfinite(g_unary)) and np.all(np.isfinite(g_pairwise))
    converged = mean_field_forward(edges, unary, pairwise)
    assert converged.converged and np.all(np.isfinite(converged.unary_marginals))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g_unary, g_pairwise = mean_field_backward(converged, rng.normal(size=mu.shape), None,
                                                  mode="fixed_point")
    assert np.all(np.isfinite(g_unary)) and np.all(np.isfinite(g_pairwise))
