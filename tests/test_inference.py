"""The public ``infer`` API: rho rules, bounds, consistency, stability, bad input."""

import itertools
import warnings

import numpy as np
import pytest
from reference import brute_force, chain_edges, numeric_gradient, random_model, random_tree_edges

from sklearn_margcrf import edge_appearance_probabilities, grid_edges, infer
from sklearn_margcrf.entropy import mean_field_entropy, trw_entropy

RNG = np.random.default_rng(0)


def spanning_tree_edge_probabilities(n_nodes, edges):
    """Brute force: fraction of spanning trees that contain each edge."""
    counts = np.zeros(len(edges))
    n_trees = 0
    for subset in itertools.combinations(range(len(edges)), n_nodes - 1):
        parent = list(range(n_nodes))

        def find(v):
            while parent[v] != v:
                v = parent[v]
            return v

        acyclic = True
        for e in subset:
            a, b = find(edges[e][0]), find(edges[e][1])
            if a == b:
                acyclic = False
                break
            parent[a] = b
        if acyclic:
            n_trees += 1
            counts[list(subset)] += 1
    return counts / n_trees


def is_dominated_by_spanning_tree_polytope(n_nodes, edges, rho):
    """rho is in the forest polytope: sum over edges inside S <= |S| - 1 for all S."""
    edges = np.asarray(edges)
    for size in range(2, n_nodes + 1):
        for subset in itertools.combinations(range(n_nodes), size):
            inside = np.isin(edges[:, 0], subset) & np.isin(edges[:, 1], subset)
            if rho[inside].sum() > size - 1 + 1e-9:
                return False
    return True


@pytest.mark.parametrize("edges,n_nodes", [(grid_edges(3, 3), 9), (np.array([[0, 1], [1, 2], [2, 0], [2, 3], [3, 4], [4, 2], [0, 3]]), 5)])
def test_uniform_spanning_tree_rule_matches_enumeration(edges, n_nodes):
    rho = edge_appearance_probabilities(n_nodes, edges, "uniform_spanning_tree")
    np.testing.assert_allclose(rho, spanning_tree_edge_probabilities(n_nodes, edges), atol=1e-10)
    assert rho.sum() == pytest.approx(n_nodes - 1)


def test_edge_appearance_probabilities_of_graphs_of_one_size_are_each_their_own():
    """The rules' results are kept per graph: graphs with as many nodes and
    edges, and the same edges in another order, each get theirs, call after
    call (the enumeration gives each)."""
    grid = grid_edges(3, 3)
    rewired = grid.copy()
    rewired[5] = [0, 8]  # another graph of 9 nodes and 12 edges
    swapped = grid[[2, 1, 0, *range(3, len(grid))]]  # the grid, two edges in the other order
    doubled = grid.copy()
    doubled[11] = [7, 8]  # edge (5, 8) replaced by a second (7, 8): a multigraph of the same size
    graphs = [grid, rewired, swapped, doubled]
    expected = [spanning_tree_edge_probabilities(9, g) for g in graphs]
    assert not np.allclose(expected[0], expected[1]) and not np.allclose(expected[0], expected[2])
    for _ in range(2):
        for g, want in zip(graphs, expected):
            np.testing.assert_allclose(edge_appearance_probabilities(9, g, "uniform_spanning_tree"), want, atol=1e-10)
            got = edge_appearance_probabilities(9, g)
            np.testing.assert_allclose(got, want, atol=1e-10)
            got[:] = 7.0  # the caller's own array: the next call does not see it


def _kirchhoff(n_nodes, edges):
    """Effective resistances from the pseudo-inverse of the whole Laplacian."""
    laplacian = np.zeros((n_nodes, n_nodes))
    for i, j in edges:
        laplacian[[i, j], [i, j]] += 1.0
        laplacian[i, j] -= 1.0
        laplacian[j, i] -= 1.0
    pinv = np.linalg.pinv(laplacian)
    i, j = np.asarray(edges).T
    return pinv[i, i] + pinv[j, j] - 2 * pinv[i, j]


def test_uniform_spanning_tree_rule_on_grids_of_any_size():
    """Past the dense path's size, a 4-connected grid's edge probabilities
    are exact, in the order and direction the edges are given, sum to n - 1
    (Foster) and are about 1/2 inside a large grid; another graph that big is
    refused, naming the rule that works."""
    height, width = 25, 31  # 775 nodes: past MAX_DENSE_NODES
    edges = grid_edges(height, width)
    order = np.random.default_rng(2).permutation(len(edges))
    shuffled = edges[order]
    shuffled[::3] = shuffled[::3, ::-1]  # some edges from their other end
    rho = edge_appearance_probabilities(height * width, shuffled, "uniform_spanning_tree")
    np.testing.assert_allclose(rho, _kirchhoff(height * width, shuffled), atol=1e-10)
    assert rho.sum() == pytest.approx(height * width - 1, abs=1e-8)
    big = edge_appearance_probabilities(200 * 300, grid_edges(200, 300), "uniform_spanning_tree")
    assert big.sum() == pytest.approx(200 * 300 - 1, abs=1e-6)
    middle = grid_edges(200, 300)[:, 0] // 300
    inside = (middle > 50) & (middle < 150) & (grid_edges(200, 300)[:, 0] % 300 > 50) & (grid_edges(200, 300)[:, 0] % 300 < 250)
    np.testing.assert_allclose(big[inside], 0.5, atol=2e-4)
    assert big.max() > 0.6  # the border's edges are in more trees
    not_a_grid = np.concatenate([grid_edges(100, 101), [[0, 102]]])
    with pytest.raises(ValueError, match="forest_cover"):
        edge_appearance_probabilities(100 * 101, not_a_grid, "uniform_spanning_tree")


def test_forest_cover_rule_is_valid_and_half_on_grids():
    rho = edge_appearance_probabilities(200 * 300, grid_edges(200, 300), "forest_cover")
    assert np.all(rho == 0.5)
    for edges, n in [(grid_edges(3, 3), 9), (grid_edges(2, 4), 8), (np.array([[0, 1], [1, 2], [2, 0], [0, 3], [1, 3], [2, 3]]), 4)]:
        rho = edge_appearance_probabilities(n, edges, "forest_cover")
        assert is_dominated_by_spanning_tree_polytope(n, edges, rho)


def first_fit_forest_count(edges):
    """The forest-cover rule's count, by sets: each edge into the first
    forest where it joins two trees, a new forest when none."""
    forests = []  # per forest: node -> its tree (a shared set)
    for a, b in edges:
        for trees in forests:
            ta, tb = trees.setdefault(a, {a}), trees.setdefault(b, {b})
            if ta is not tb:
                ta |= tb
                for v in tb:
                    trees[v] = ta
                break
        else:
            joined = {a, b}
            forests.append({a: joined, b: joined})
    return len(forests)


@pytest.mark.parametrize("n_nodes", [5, 12])
def test_forest_cover_rule_counts_first_fit_forests(n_nodes):
    """rho = 1 / the number of forests of a first-fit split, on complete
    graphs: 12 nodes need 11 forests in this order (the rule's union-find
    starts with room for 4 and grows), and rho stays in the polytope."""
    edges = np.array(list(itertools.combinations(range(n_nodes), 2)))
    for order in (edges, edges[::-1], edges[RNG.permutation(len(edges))]):
        rho = edge_appearance_probabilities(n_nodes, order, "forest_cover")
        np.testing.assert_array_equal(rho, 1 / first_fit_forest_count(order.tolist()))
        assert is_dominated_by_spanning_tree_polytope(n_nodes, order, rho)


def test_edge_appearance_probabilities_computed_in_threads_at_once_are_bitwise_those_of_one_thread():
    # Each graph's rho is computed once per process and kept; computed in 4
    # threads at once (the threads of a fit, or of a threaded grid search),
    # it must be the value that one thread computes, to the last bit, whatever
    # the order of the edges (which makes each graph new to the process; the
    # effective resistances do not depend on it, unlike forest_cover's first fit).
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(11)
    graphs = [(h * w, grid_edges(h, w)) for h in range(3, 13) for w in range(3, 15)]  # 120 grids, the dense path
    want = {rule: [edge_appearance_probabilities(n, e, rule) for n, e in graphs] for rule in ("auto", "uniform_spanning_tree")}
    for attempt in range(3):
        orders = [rng.permutation(len(e)) for _, e in graphs]

        def one(k):
            n, edges = graphs[k]
            return k, {rule: edge_appearance_probabilities(n, edges[orders[k]], rule) for rule in want}

        with ThreadPoolExecutor(4) as pool:
            for k, got in pool.map(one, range(len(graphs))):
                for rule, values in got.items():
                    np.testing.assert_array_equal(values, want[rule][k][orders[k]], err_msg=f"{rule}, graph {k}")


def test_default_rho_is_one_on_trees_and_forests():
    edges = random_tree_edges(30, RNG)
    for rule in ("auto", "uniform_spanning_tree", "forest_cover"):
        assert np.all(edge_appearance_probabilities(30, edges, rule) == 1.0)
    two_chains = np.concatenate([chain_edges(5), chain_edges(4) + 5])
    assert np.all(edge_appearance_probabilities(9, two_chains, "auto") == 1.0)


@pytest.mark.parametrize("n_states", [2, 3])
@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_lbp_and_default_trw_are_exact_on_trees(kind, n_states):
    n = 8
    edges = chain_edges(n) if kind == "chain" else random_tree_edges(n, RNG)
    unary, pairwise = random_model(edges, n, n_states, RNG, scale=1.5)
    mu, mu2, log_z = brute_force(edges, unary, pairwise)
    for method, rho in [("lbp", None), ("trw", None), ("trw", 1.0)]:
        res = infer(edges, unary, pairwise, method=method, rho=rho, tol=1e-12)
        assert res.converged
        np.testing.assert_allclose(res.unary, mu, atol=1e-8)
        np.testing.assert_allclose(res.pairwise, mu2, atol=1e-8)
        assert res.log_partition == pytest.approx(log_z, abs=1e-8)


@pytest.mark.parametrize("seed", range(4))
def test_bounds_and_local_consistency_on_loopy_grid(seed):
    rng = np.random.default_rng(seed)
    edges = grid_edges(3, 3)
    unary, pairwise = random_model(edges, 9, 2 + seed % 2, rng, scale=1.0)
    log_z = brute_force(edges, unary, pairwise)[2]
    for rho in (None, "forest_cover", 0.5):
        trw = infer(edges, unary, pairwise, method="trw", rho=rho, tol=1e-12, max_iter=5000)
        assert trw.converged
        assert trw.log_partition >= log_z - 1e-9
        np.testing.assert_allclose(trw.pairwise.sum(axis=2), trw.unary[edges[:, 0]], atol=1e-8)
        np.testing.assert_allclose(trw.pairwise.sum(axis=1), trw.unary[edges[:, 1]], atol=1e-8)
    mf = infer(edges, unary, pairwise, method="mean_field", tol=1e-12)
    assert mf.log_partition <= log_z + 1e-9
    exact = infer(edges, unary, pairwise, method="exact")
    assert exact.log_partition == pytest.approx(log_z, abs=1e-8)


# scale 1e3 is beyond what the TRW / LBP messages represent (a warning says
# so, tested below); here only finiteness and normalisation are checked
@pytest.mark.filterwarnings("ignore:.*message entries are at the floor:RuntimeWarning")
@pytest.mark.parametrize("method", ["trw", "lbp", "mean_field", "exact"])
def test_n_iter_zero_is_softmax_and_stability(method):
    edges = grid_edges(3, 4)
    unary, pairwise = random_model(edges, 12, 3, RNG)
    if method != "exact":
        res = infer(edges, unary, pairwise, method=method, n_iter=0)
        softmax = np.exp(unary - unary.max(axis=1, keepdims=True))
        np.testing.assert_allclose(res.unary, softmax / softmax.sum(axis=1, keepdims=True), atol=1e-12)
    for n_states in (2, 5):
        unary, pairwise = random_model(edges, 12, n_states, RNG, scale=1e3)
        for n_iter in ([None, 5] if method != "exact" else [None]):
            res = infer(edges, unary, pairwise, method=method, n_iter=n_iter)
            assert np.all(np.isfinite(res.unary)) and np.all(np.isfinite(res.pairwise))
            assert np.isfinite(res.log_partition)
            np.testing.assert_allclose(res.unary.sum(axis=1), 1.0, atol=1e-9)
            np.testing.assert_allclose(res.pairwise.sum(axis=(1, 2)), 1.0, atol=1e-9)


def test_isolated_nodes_and_no_edges():
    edges = np.array([[0, 1]])
    unary, pairwise = random_model(edges, 4, 2, RNG)
    mu, mu2, log_z = brute_force(edges, unary, pairwise)
    for method in ("trw", "lbp", "mean_field", "exact"):
        res = infer(edges, unary, pairwise, method=method, tol=1e-12)
        np.testing.assert_allclose(res.unary[2:], mu[2:], atol=1e-10)
        res = infer(np.zeros((0, 2), dtype=int), unary, np.zeros((0, 2, 2)), method=method)
        assert res.log_partition == pytest.approx(np.log(np.exp(unary).sum(axis=1)).sum())


@pytest.mark.parametrize("seed", [0, 6, 10])
def test_entropy_gradients_match_finite_differences(seed):
    # its own generator: the draws must not depend on which tests ran before
    # in the process (pytest-xdist splits the module between workers)
    rng = np.random.default_rng(seed)
    edges = grid_edges(2, 3)
    mu = rng.uniform(0.1, 1.0, size=(6, 3))
    mu2 = rng.uniform(0.1, 1.0, size=(len(edges), 3, 3))
    rho = rng.uniform(0.2, 1.0, size=len(edges))
    _, (g1, g2) = trw_entropy(edges, mu, mu2, rho, gradient=True)
    np.testing.assert_allclose(g1, numeric_gradient(lambda m: trw_entropy(edges, m, mu2, rho), mu), rtol=1e-7, atol=1e-9)
    # the central differences of the pairwise entries err by up to 4e-9 (rounding: 60 draws measured)
    np.testing.assert_allclose(g2, numeric_gradient(lambda m: trw_entropy(edges, mu, m, rho), mu2), rtol=1e-7, atol=1e-8)
    _, g = mean_field_entropy(mu, gradient=True)
    np.testing.assert_allclose(g, numeric_gradient(mean_field_entropy, mu), rtol=1e-7, atol=1e-9)


def test_trw_entropy_is_exact_entropy_on_trees():
    edges = random_tree_edges(6, RNG)
    unary, pairwise = random_model(edges, 6, 2, RNG)
    mu, mu2, log_z = brute_force(edges, unary, pairwise)
    entropy = log_z - np.sum(unary * mu) - np.sum(pairwise * mu2)
    assert trw_entropy(edges, mu, mu2, np.ones(len(edges))) == pytest.approx(entropy, abs=1e-10)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(edges=[[0, 9]]), "node indices"),
        (dict(edges=[[1, 1]]), "self-loop"),
        (dict(edges=[[0, 1, 2]]), r"shape \(E, 2\)"),
        (dict(unary=np.full((3, 2), np.nan)), "NaN"),
        (dict(pairwise=np.full((1, 2, 2), np.inf)), "NaN or infinite"),
        (dict(unary=np.zeros((3, 1)), pairwise=np.zeros((1, 1, 1))), "K = 2"),
        (dict(pairwise=np.zeros((2, 2, 2))), "pairwise must have shape"),
        (dict(unary=np.zeros(3)), "2-D"),
        (dict(unary=np.zeros((0, 2)), edges=np.zeros((0, 2), int), pairwise=np.zeros((0, 2, 2))), "empty"),
        (dict(method="bp"), "method must be one of"),
        (dict(rho=0.0), "rho must be positive"),
        (dict(rho=-1.0), "rho must be positive"),
        (dict(rho=[0.5, 0.5]), "one entry per edge"),
        (dict(rho="magic"), "rho must be"),
        (dict(rho=True), "rho must be a positive float.*got True"),
        (dict(edges=None), "edges are missing"),
        (dict(rho=0.5, method="mean_field"), "rho applies"),
        (dict(n_iter=-1), "non-negative"),
        (dict(n_iter=2.5), "n_iter"),
        (dict(tol=0), "tol"),
        (dict(method="exact", n_iter=3), "not iterative"),
        (dict(rho=5e-324), "rho must be at least"),  # subnormal: 1 / rho is inf
        (dict(rho=np.array([5e-324])), "rho must be at least"),
        # range checked before the cast to int64, which would wrap these around
        (dict(edges=np.array([[0, 2**63]], dtype=np.uint64)), r"\[0, 9223372036854775808\]"),
        (dict(edges=np.array([[0, 1e30]])), r"1e\+30"),
        (dict(edges=np.array([[0, np.inf]])), "inf"),
        (dict(edges=np.zeros((5, 0), dtype=np.int64)), r"shape \(E, 2\)"),
        (dict(edges=np.zeros((0, 3), dtype=np.int64)), r"shape \(E, 2\)"),
    ],
)
def test_bad_input(kwargs, match):
    args = dict(edges=[[0, 1]], unary=np.zeros((3, 2)), pairwise=np.zeros((1, 2, 2)))
    args.update(kwargs)
    edges, unary, pairwise = args.pop("edges"), args.pop("unary"), args.pop("pairwise")
    with pytest.raises(ValueError, match=match):
        infer(edges, unary, pairwise, **args)


@pytest.mark.parametrize("which", ["unary", "pairwise"])
def test_complex_potentials_are_refused_not_cast(which):
    model = dict(unary=np.zeros((2, 2)), pairwise=np.zeros((1, 2, 2)))
    model[which] = model[which] + 1j
    with pytest.raises(TypeError, match=f"{which} must be an array of real numbers"):
        infer([[0, 1]], model["unary"], model["pairwise"])


@pytest.mark.parametrize("rule", ["auto", "uniform_spanning_tree", "forest_cover"])
@pytest.mark.parametrize(
    "n_nodes,edges,match",
    [
        (3, [[0, -1]], "node indices"),
        (3, [[0, 10**9]], "node indices"),  # the forest-cover kernel crashed on it
        (3, [[0, 0], [0, 1]], "self-loop"),
        (3, [[0, 1, 2]], "shape"),
        (3, [[0, 1.5]], "integer"),
        (0, [[0, 1]], "n_nodes"),
        (2.0, [[0, 1]], "n_nodes"),
    ],
)
def test_edge_appearance_probabilities_validates_its_input(rule, n_nodes, edges, match):
    with pytest.raises(ValueError, match=match):
        edge_appearance_probabilities(n_nodes, np.array(edges), rule)


@pytest.mark.parametrize("shape", [(2.7, 3), (3, 2.0), (True, 3), ("2", 3), (0, 3)])
def test_grid_edges_rejects_a_shape_that_is_not_two_positive_integers(shape):
    with pytest.raises(ValueError, match="grid shape must be"):
        grid_edges(*shape)


def test_grid_edges_accepts_numpy_integers():
    np.testing.assert_array_equal(grid_edges(np.int64(2), np.int32(3)), grid_edges(2, 3))


@pytest.mark.parametrize("method", ["trw", "lbp", "mean_field"])
def test_inference_without_log_partition_gives_the_same_marginals(method):
    # the gradients skip the entropy; everything else must be unchanged
    from sklearn_margcrf.inference import resolve_rho, run_inference

    edges = grid_edges(3, 4)
    unary, pairwise = random_model(edges, 12, 3, np.random.default_rng(5))
    rho = resolve_rho(None, method, 12, edges)
    _, full = run_inference(edges, unary, pairwise, method, rho, 7, 1e-6, 1000)
    _, bare = run_inference(edges, unary, pairwise, method, rho, 7, 1e-6, 1000, log_partition=False)
    assert bare.log_partition is None and np.isfinite(full.log_partition)
    np.testing.assert_array_equal(bare.unary, full.unary)
    np.testing.assert_array_equal(bare.pairwise, full.pairwise)
    assert full.log_partition == infer(edges, unary, pairwise, method=method, n_iter=7).log_partition


def floored_model(scale):
    """A 2x2 grid whose parameters differ by ``scale``: beyond about 690 *
    rho, its messages need entries below 1e-300 and reach the floor."""
    unary = np.array([[1.0, 0], [0, 1], [1, 0], [0, 0]]) * scale
    return grid_edges(2, 2), unary, np.tile(np.eye(2), (4, 1, 1)) * scale


@pytest.mark.parametrize("method,scale", [("trw", 800), ("lbp", 1500)])
def test_messages_at_the_floor_are_reported(method, scale):
    # Parameters differing by more than about 690 * rho need message entries
    # below 1e-300; the floor then moves the marginals (here by 0.5 or more
    # from the exact ones, with converged True), which must not pass silently.
    edges, unary, pairwise = floored_model(scale)
    with pytest.warns(RuntimeWarning, match="message entries are at the floor"):
        result = infer(edges, unary, pairwise, method=method)
    exact = infer(edges, unary, pairwise, method="exact")
    assert np.abs(result.unary - exact.unary).max() > 0.1  # the warning is not a false alarm here
    # a tenth of the scale is represented exactly, without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = infer(edges, unary / 10, pairwise / 10, method=method)
    np.testing.assert_allclose(result.unary, infer(edges, unary / 10, pairwise / 10, method="exact").unary, atol=1e-12)
