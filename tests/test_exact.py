"""Tests of exact inference (forest sum-product and junction tree) and its
complex-step Hessian-vector product."""

import numpy as np
import pytest

from reference import (brute_force, chain_edges, joint_scores, random_model,
                       random_tree_edges)
from sklearn_margcrf import exact as exact_module
from sklearn_margcrf._graph import grid_edges, grid_shape_of
from sklearn_margcrf.exact import (MAX_TABLE_SIZE, _forest, _grid_order,
                                   _junction_tree, exact_hessian_vector, exact_inference)

TOL = 1e-8


def assert_matches_brute_force(edges, unary, pairwise, result=None):
    mu, pm, log_z = exact_inference(edges, unary, pairwise) if result is None else result
    b_mu, b_pm, b_log_z = brute_force(edges, unary, pairwise)
    assert mu.dtype == np.float64 and pm.dtype == np.float64
    assert pm.shape == pairwise.shape
    np.testing.assert_allclose(mu, b_mu, rtol=0, atol=TOL)
    np.testing.assert_allclose(pm, b_pm, rtol=0, atol=TOL)
    assert abs(log_z - b_log_z) <= TOL * max(1.0, abs(b_log_z))


def two_components_with_isolated():
    # a 4-cycle with a chord (nodes 0-3), an isolated node 4, a tree on 5-7
    # (one edge reversed), and an isolated node 8
    return np.array([[0, 1], [1, 2], [2, 3], [3, 0], [0, 2], [6, 5], [6, 7]], dtype=np.int64), 9


@pytest.mark.parametrize("n_states", [2, 3])
@pytest.mark.parametrize("seed", range(3))
def test_grid_3x3(n_states, seed):
    rng = np.random.default_rng(seed)
    edges = grid_edges(3, 3)
    unary, pairwise = random_model(edges, 9, n_states, rng, scale=2.0)
    assert_matches_brute_force(edges, unary, pairwise)


@pytest.mark.parametrize("n_states", [2, 3])
def test_chain(n_states):
    rng = np.random.default_rng(10 + n_states)
    edges = chain_edges(8)
    unary, pairwise = random_model(edges, 8, n_states, rng, scale=2.0)
    assert_matches_brute_force(edges, unary, pairwise)


@pytest.mark.parametrize("n_states", [2, 3])
@pytest.mark.parametrize("seed", range(3))
def test_random_tree(n_states, seed):
    rng = np.random.default_rng(20 + seed)
    edges = random_tree_edges(8, rng)
    # random orientation of each edge
    flip = rng.random(len(edges)) < 0.5
    edges[flip] = edges[flip][:, ::-1]
    unary, pairwise = random_model(edges, 8, n_states, rng, scale=2.0)
    assert_matches_brute_force(edges, unary, pairwise)


@pytest.mark.parametrize("n_states", [2, 3])
def test_isolated_nodes_and_components(n_states):
    rng = np.random.default_rng(30 + n_states)
    edges, n = two_components_with_isolated()
    unary, pairwise = random_model(edges, n, n_states, rng, scale=2.0)
    assert_matches_brute_force(edges, unary, pairwise)


def test_no_edges():
    rng = np.random.default_rng(40)
    unary = rng.normal(size=(4, 3))
    edges = np.zeros((0, 2), dtype=np.int64)
    mu, pm, log_z = exact_inference(edges, unary, np.zeros((0, 3, 3)))
    assert pm.shape == (0, 3, 3)
    assert_matches_brute_force(edges, unary, np.zeros((0, 3, 3)), (mu, pm, log_z))


@pytest.mark.parametrize("n_states", [2, 3])
def test_duplicate_edges(n_states):
    rng = np.random.default_rng(50 + n_states)
    # duplicates in both orientations, on a tree and on a cycle
    edges = np.array([[0, 1], [1, 0], [1, 2], [1, 2], [3, 4], [4, 5], [5, 3], [3, 5]],
                     dtype=np.int64)
    unary, pairwise = random_model(edges, 6, n_states, rng, scale=2.0)
    assert_matches_brute_force(edges, unary, pairwise)


@pytest.mark.parametrize("n_states", [2, 3])
def test_junction_tree_and_forest_paths_on_trees(n_states):
    rng = np.random.default_rng(60 + n_states)
    edges = random_tree_edges(9, rng)
    unary, pairwise = random_model(edges, 9, n_states, rng, scale=2.0)
    b_mu, b_pm, b_log_z = brute_force(edges, unary, pairwise)
    for mu, pm, log_z in (_forest(9, edges, unary, pairwise),
                          _junction_tree(9, edges, unary, pairwise, MAX_TABLE_SIZE)):
        np.testing.assert_allclose(mu, b_mu, atol=TOL)
        np.testing.assert_allclose(pm, b_pm, atol=TOL)
        assert abs(log_z - b_log_z) <= TOL


def test_denser_loopy_graph():
    rng = np.random.default_rng(70)
    n = 8
    pairs = np.array([(i, j) for i in range(n) for j in range(i + 1, n)], dtype=np.int64)
    edges = pairs[rng.random(len(pairs)) < 0.5]
    unary, pairwise = random_model(edges, n, 3, rng, scale=1.0)
    assert_matches_brute_force(edges, unary, pairwise)


def test_large_parameters():
    rng = np.random.default_rng(80)
    edges = grid_edges(3, 3)
    unary, pairwise = random_model(edges, 9, 2, rng, scale=1e3)
    mu, pm, log_z = exact_inference(edges, unary, pairwise)
    assert np.all(np.isfinite(mu)) and np.all(np.isfinite(pm)) and np.isfinite(log_z)
    assert_matches_brute_force(edges, unary, pairwise, (mu, pm, log_z))
    tree = chain_edges(9)
    unary, pairwise = random_model(tree, 9, 3, rng, scale=1e3)
    assert_matches_brute_force(tree, unary, pairwise)


def forward_backward(unary, pairwise):
    """Independent scaled forward-backward on the chain 0-1-...-(n-1)."""
    n, k = unary.shape
    phi = np.exp(unary - unary.max(axis=1, keepdims=True))
    psi = np.exp(pairwise - pairwise.max(axis=(1, 2), keepdims=True))
    alpha = np.zeros((n, k))
    beta = np.ones((n, k))
    alpha[0] = phi[0] / phi[0].sum()
    log_z = np.log(phi[0].sum()) + unary[0].max()
    for t in range(1, n):
        a = (alpha[t - 1] @ psi[t - 1]) * phi[t]
        s = a.sum()
        alpha[t] = a / s
        log_z += np.log(s) + unary[t].max() + pairwise[t - 1].max()
    for t in range(n - 2, -1, -1):
        b = psi[t] @ (phi[t + 1] * beta[t + 1])
        beta[t] = b / b.sum()
    mu = alpha * beta
    mu /= mu.sum(axis=1, keepdims=True)
    pm = (alpha[:-1, :, None] * psi * (phi[1:] * beta[1:])[:, None, :])
    pm /= pm.sum(axis=(1, 2), keepdims=True)
    return mu, pm, log_z


def test_long_chain_against_forward_backward():
    rng = np.random.default_rng(90)
    n = 2000
    edges = chain_edges(n)
    unary, pairwise = random_model(edges, n, 3, rng, scale=2.0)
    mu, pm, log_z = exact_inference(edges, unary, pairwise)
    f_mu, f_pm, f_log_z = forward_backward(unary, pairwise)
    np.testing.assert_allclose(mu, f_mu, rtol=0, atol=TOL)
    np.testing.assert_allclose(pm, f_pm, rtol=0, atol=TOL)
    assert abs(log_z - f_log_z) <= TOL * abs(f_log_z)


def test_very_long_chain_takes_the_linear_tree_path(monkeypatch):
    # a 100000-node chain is a tree: message passing in O(n), never the
    # junction tree; against forward-backward
    monkeypatch.setattr(exact_module, "_junction_tree", lambda *a: pytest.fail("a tree went to the junction tree"))
    rng = np.random.default_rng(91)
    n = 100_000
    edges = chain_edges(n)
    unary, pairwise = random_model(edges, n, 2, rng)
    mu, pm, log_z = exact_inference(edges, unary, pairwise)
    f_mu, f_pm, f_log_z = forward_backward(unary, pairwise)
    assert log_z == pytest.approx(f_log_z, rel=1e-10)
    np.testing.assert_allclose(mu, f_mu, rtol=0, atol=TOL)
    np.testing.assert_allclose(pm, f_pm, rtol=0, atol=TOL)
    np.testing.assert_allclose(mu.sum(axis=1), 1.0, atol=1e-12)


def test_too_wide_graph_is_refused():
    edges = grid_edges(30, 30)
    unary = np.zeros((900, 2))
    pairwise = np.zeros((len(edges), 2, 2))
    with pytest.raises(ValueError, match="max_table_size"):
        exact_inference(edges, unary, pairwise)
    complete = np.array([(i, j) for i in range(12) for j in range(i + 1, 12)], dtype=np.int64)
    with pytest.raises(ValueError, match=r"K\^12"):
        exact_inference(complete, np.zeros((12, 4)), np.zeros((len(complete), 4, 4)))
    # ... but a wide graph with a tiny limit too, and a small one passes with a big one
    with pytest.raises(ValueError):
        exact_inference(grid_edges(3, 3), np.zeros((9, 2)), np.zeros((12, 2, 2)),
                        max_table_size=4)


def test_large_grid_is_refused_at_once(monkeypatch):
    # from the grid's shape alone, before searching an elimination order
    # (which on 60000 nodes would take minutes before failing)
    monkeypatch.setattr(exact_module, "_elimination_order", lambda *a: pytest.fail("an elimination order was searched"))
    edges = grid_edges(200, 300)
    with pytest.raises(ValueError, match="200 x 300 grid of treewidth 200"):
        exact_inference(edges, np.zeros((60000, 2)), np.zeros((len(edges), 2, 2)))


def test_grid_detection():
    rng = np.random.default_rng(95)
    edges = grid_edges(4, 7)
    canonical = np.sort(edges, axis=1)
    assert grid_shape_of(28, canonical[rng.permutation(len(edges))]) == (4, 7)
    assert grid_shape_of(28, np.sort(grid_edges(7, 4), axis=1)) == (7, 4)
    assert grid_shape_of(28, canonical[1:]) is None
    two_triangles = np.array([[0, 1], [1, 2], [0, 2], [3, 4], [4, 5], [3, 5], [2, 3]])
    assert grid_shape_of(6, two_triangles) is None
    for height, width in ((3, 5), (6, 4)):
        order = _grid_order(height, width)
        assert sorted(order) == list(range(height * width))


def test_grid_order_fallback_when_min_fill_is_too_wide():
    # greedy min-fill needs a clique of 8 variables on a 6 x 7 grid, whose
    # treewidth is 6: with a limit of 2^7 entries only the grid order fits
    rng = np.random.default_rng(96)
    edges = grid_edges(6, 7)
    unary, pairwise = random_model(edges, 42, 2, rng, scale=1.0)
    tight = exact_inference(edges, unary, pairwise, max_table_size=2 ** 7)
    loose = exact_inference(edges, unary, pairwise)
    for a, b in zip(tight, loose):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="treewidth 6"):
        exact_inference(edges, unary, pairwise, max_table_size=2 ** 6)


def test_read_only_inputs():
    rng = np.random.default_rng(97)
    for edges, n in ((chain_edges(5), 5), (grid_edges(2, 3), 6)):
        unary, pairwise = random_model(edges, n, 2, rng)
        for array in (edges, unary, pairwise):
            array.setflags(write=False)
        assert_matches_brute_force(edges, unary, pairwise)


# --------------------------------------------------------------------------- complex step

def graphs_for_hvp():
    edges, n = two_components_with_isolated()
    return [(grid_edges(3, 3), 9), (chain_edges(6), 6), (edges, n)]


def test_complex_input_gives_complex_output_and_float_gives_float():
    rng = np.random.default_rng(100)
    edges = grid_edges(2, 3)
    unary, pairwise = random_model(edges, 6, 2, rng)
    mu, pm, log_z = exact_inference(edges, unary, pairwise)
    assert mu.dtype == pm.dtype == np.float64 and isinstance(log_z, (float, np.floating))
    c_mu, c_pm, c_log_z = exact_inference(edges, unary.astype(complex), pairwise)
    assert c_mu.dtype == c_pm.dtype == np.complex128 and np.iscomplexobj(c_log_z)
    np.testing.assert_allclose(c_mu.real, mu, atol=1e-15)
    # complex-step derivative of log Z is mu . v
    h = 1e-30
    v_unary, v_pairwise = rng.normal(size=unary.shape), rng.normal(size=pairwise.shape)
    for tree in (False, True):
        e = chain_edges(6) if tree else edges
        p = pairwise[: len(e)]
        v_p = v_pairwise[: len(e)]
        mu, pm, _ = exact_inference(e, unary, p)
        _, _, cz = exact_inference(e, unary + 1j * h * v_unary, p + 1j * h * v_p)
        expected = np.sum(mu * v_unary) + np.sum(pm * v_p)
        assert abs(cz.imag / h - expected) <= 1e-12 * max(1.0, abs(expected))


@pytest.mark.parametrize("n_states", [2, 3])
@pytest.mark.parametrize("which", range(3))
def test_hessian_vector_product(n_states, which):
    rng = np.random.default_rng(110 + 10 * n_states + which)
    edges, n = graphs_for_hvp()[which]
    unary, pairwise = random_model(edges, n, n_states, rng, scale=1.5)
    v_unary, v_pairwise = rng.normal(size=unary.shape), rng.normal(size=pairwise.shape)
    d_unary, d_pairwise = exact_hessian_vector(edges, unary, pairwise, v_unary, v_pairwise)
    assert d_unary.dtype == np.float64

    # central finite differences of the marginals
    eps = 1e-5
    up = exact_inference(edges, unary + eps * v_unary, pairwise + eps * v_pairwise)
    down = exact_inference(edges, unary - eps * v_unary, pairwise - eps * v_pairwise)
    fd = np.concatenate([((up[0] - down[0]) / (2 * eps)).ravel(),
                         ((up[1] - down[1]) / (2 * eps)).ravel()])
    cs = np.concatenate([d_unary.ravel(), d_pairwise.ravel()])
    assert np.linalg.norm(cs - fd) <= 1e-6 * np.linalg.norm(fd)

    # brute force: Cov(f) v with f the indicator features
    scores, states = joint_scores(edges, unary, pairwise)
    p = np.exp(scores - scores.max())
    p /= p.sum()
    s, _ = joint_scores(edges, v_unary, v_pairwise)   # f(x) . v for every state
    mean_s = p @ s
    cov_unary = np.zeros_like(unary)
    for i in range(n):
        np.add.at(cov_unary[i], states[:, i], p * (s - mean_s))
    cov_pairwise = np.zeros_like(pairwise)
    for e, (i, j) in enumerate(edges):
        np.add.at(cov_pairwise[e], (states[:, i], states[:, j]), p * (s - mean_s))
    np.testing.assert_allclose(d_unary, cov_unary, rtol=0, atol=1e-12)
    np.testing.assert_allclose(d_pairwise, cov_pairwise, rtol=0, atol=1e-12)


def test_hessian_vector_product_long_chain():
    rng = np.random.default_rng(120)
    n = 300
    edges = chain_edges(n)
    unary, pairwise = random_model(edges, n, 2, rng)
    v_unary, v_pairwise = rng.normal(size=unary.shape), rng.normal(size=pairwise.shape)
    d_unary, d_pairwise = exact_hessian_vector(edges, unary, pairwise, v_unary, v_pairwise)
    eps = 1e-5
    up = exact_inference(edges, unary + eps * v_unary, pairwise + eps * v_pairwise)
    down = exact_inference(edges, unary - eps * v_unary, pairwise - eps * v_pairwise)
    fd_unary = (up[0] - down[0]) / (2 * eps)
    fd_pairwise = (up[1] - down[1]) / (2 * eps)
    assert np.linalg.norm(d_unary - fd_unary) <= 1e-6 * np.linalg.norm(fd_unary)
    assert np.linalg.norm(d_pairwise - fd_pairwise) <= 1e-6 * np.linalg.norm(fd_pairwise)
