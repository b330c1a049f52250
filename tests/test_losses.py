import numpy as np
import pytest
from reference import brute_force, chain_edges, joint_scores, numeric_gradient, random_model

from sklearn_margcrf.losses import (
    LOG_FLOOR,
    MARGINAL_LOSSES,
    marginal_loss,
    piecewise,
    pseudolikelihood,
)
from sklearn_margcrf.metrics import hamming_error_from_marginals

# a small loopy graph: a 4-cycle with a chord and a pendant node
EDGES = np.array([(0, 1), (1, 2), (2, 3), (3, 0), (0, 2), (4, 2)], dtype=np.int64)
N_NODES = 5


def rel_err(a, b):
    scale = max(np.linalg.norm(a), np.linalg.norm(b), 1e-300)
    return np.linalg.norm(a - b) / scale


def random_labels(rng, n, k, hidden):
    labels = rng.integers(0, k, size=n)
    labels[hidden] = -1
    return labels


HIDDEN_CASES = [[3], [1, 4]]


# ---------------------------------------------------------------------------
# marginal losses: gradients
# ---------------------------------------------------------------------------


LOSS_CASES = [(name, None) for name in MARGINAL_LOSSES if name != "smooth_classification"] + [
    ("smooth_classification", 5.0),
    ("smooth_classification", 15.0),
]


@pytest.mark.parametrize("name, alpha", LOSS_CASES)
@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("hidden", HIDDEN_CASES)
def test_marginal_loss_gradient(name, alpha, k, hidden):
    rng = np.random.default_rng(1000 * k + 10 * len(hidden) + int(alpha or 0))
    mu = rng.uniform(0.1, 1.0, size=(N_NODES, k))  # positive, not normalised
    mu2 = rng.uniform(0.1, 1.0, size=(len(EDGES), k, k))
    labels = random_labels(rng, N_NODES, k, hidden)

    value, gu, gp = marginal_loss(name, mu, mu2, EDGES, labels, alpha=alpha)
    assert np.isfinite(value)
    assert gu.shape == mu.shape and gp.shape == mu2.shape

    num_u = numeric_gradient(lambda m: marginal_loss(name, m, mu2, EDGES, labels, alpha=alpha)[0], mu)
    num_p = numeric_gradient(lambda m: marginal_loss(name, mu, m, EDGES, labels, alpha=alpha)[0], mu2)
    both_num = np.concatenate([num_u.ravel(), num_p.ravel()])
    both = np.concatenate([gu.ravel(), gp.ravel()])
    assert np.linalg.norm(both) > 0
    assert rel_err(both, both_num) <= 1e-7
    # hidden nodes get no gradient from univariate losses
    assert np.all(gu[hidden] == 0)


def test_smooth_classification_gradient_alpha_50():
    # margins kept away from 0 so the sharp sigmoid is smooth on the FD scale
    rng = np.random.default_rng(7)
    mu = rng.uniform(0.1, 1.0, size=(6, 3))
    labels = np.array([0, 1, 2, -1, 1, 0])
    f = lambda m: marginal_loss("smooth_classification", m, None, np.zeros((0, 2)), labels, alpha=50.0)[0]
    _, gu, _ = marginal_loss("smooth_classification", mu, None, np.zeros((0, 2)), labels, alpha=50.0)
    assert rel_err(gu, numeric_gradient(f, mu, eps=1e-7)) <= 1e-6


# ---------------------------------------------------------------------------
# marginal losses: values on hand-made inputs
# ---------------------------------------------------------------------------

HAND_MU = np.array([[0.2, 0.8], [0.6, 0.4], [0.5, 0.5]])
HAND_EDGES = np.array([(0, 1), (1, 2)])
HAND_MU2 = np.full((2, 2, 2), 0.5)
HAND_MU2[0, 1, 0] = 0.25  # x_0 = 1, x_1 = 0
HAND_LABELS = np.array([1, 0, -1])


def test_hand_univariate_logistic():
    value, gu, gp = marginal_loss("univariate_logistic", HAND_MU, HAND_MU2, HAND_EDGES, HAND_LABELS)
    # -log 0.8 - log 0.6
    assert value == pytest.approx(0.7339691750802004, rel=1e-14)
    np.testing.assert_allclose(gu, [[0, -1 / 0.8], [-1 / 0.6, 0], [0, 0]])
    assert np.all(gp == 0)


def test_hand_clique_logistic():
    value, gu, gp = marginal_loss("clique_logistic", HAND_MU, HAND_MU2, HAND_EDGES, HAND_LABELS)
    # only edge (0, 1) is fully observed: -log mu2[0, 1, 0] = -log 0.25
    assert value == pytest.approx(1.3862943611198906, rel=1e-14)
    expected = np.zeros((2, 2, 2))
    expected[0, 1, 0] = -4.0
    np.testing.assert_allclose(gp, expected)
    assert np.all(gu == 0)


def test_hand_clique_logistic_orientation():
    # mu2[e, a, b] is (x_i = a, x_j = b): asymmetric table picks the right cell
    mu2 = np.array([[[0.1, 0.2], [0.3, 0.4]]])
    value, _, _ = marginal_loss("clique_logistic", HAND_MU[:2], mu2, np.array([(0, 1)]), np.array([0, 1]))
    assert value == pytest.approx(-np.log(0.2))
    value, _, _ = marginal_loss("clique_logistic", HAND_MU[:2], mu2, np.array([(1, 0)]), np.array([0, 1]))
    assert value == pytest.approx(-np.log(0.3))


def test_hand_univariate_quadratic():
    value, gu, _ = marginal_loss("univariate_quadratic", HAND_MU, HAND_MU2, HAND_EDGES, HAND_LABELS)
    # node 0: 0.2**2 + 0.2**2 = 0.08; node 1: 0.4**2 + 0.4**2 = 0.32
    assert value == pytest.approx(0.40, rel=1e-14)
    np.testing.assert_allclose(gu, [[0.4, -0.4], [-0.8, 0.8], [0, 0]])


def test_hand_smooth_classification():
    value, gu, _ = marginal_loss("smooth_classification", HAND_MU, HAND_MU2, HAND_EDGES, HAND_LABELS, alpha=5)
    # margins t = 0.2 - 0.8 = -0.6 and 0.4 - 0.6 = -0.2: S(-3) + S(-1)
    assert value == pytest.approx(0.3163672945475619, rel=1e-14)
    s3, s1 = 1 / (1 + np.exp(3)), 1 / (1 + np.exp(1))
    d0, d1 = 5 * s3 * (1 - s3), 5 * s1 * (1 - s1)
    np.testing.assert_allclose(gu, [[d0, -d0], [-d1, d1], [0, 0]])


def test_smooth_classification_tie_goes_to_first_maximiser():
    mu = np.array([[0.3, 0.3, 0.4]])
    _, gu, _ = marginal_loss("smooth_classification", mu, None, np.zeros((0, 2)), np.array([2]), alpha=5)
    assert gu[0, 0] > 0 and gu[0, 1] == 0 and gu[0, 2] < 0
    assert gu[0, 0] == -gu[0, 2]


def test_smooth_classification_tends_to_step():
    rng = np.random.default_rng(3)
    n, k = 200, 3
    mu = rng.dirichlet(np.ones(k), size=n)
    labels = rng.integers(0, k, size=n)
    labels[::7] = -1
    obs = labels >= 0
    truth = mu[np.arange(n), np.maximum(labels, 0)]
    others = mu.copy()
    others[np.arange(n), np.maximum(labels, 0)] = -np.inf
    t = others.max(axis=1) - truth
    # keep margins away from 0
    far = np.abs(t) > 0.01
    labels = np.where(far, labels, -1)
    obs = labels >= 0
    value, gu, _ = marginal_loss("smooth_classification", mu, None, np.zeros((0, 2)), labels, alpha=1e4)
    assert value == pytest.approx(np.count_nonzero(t[obs] > 0), abs=1e-30 + 1e-12)
    n_err = hamming_error_from_marginals([labels], [mu]) * obs.sum()  # MPM errors on the labelled nodes
    assert value == pytest.approx(n_err, abs=1e-9)
    assert np.all(np.isfinite(gu))
    # huge alpha * t must not overflow
    value, gu, _ = marginal_loss("smooth_classification", mu, None, np.zeros((0, 2)), labels, alpha=1e308)
    assert np.isfinite(value) and np.all(np.isfinite(gu))


def test_log_floor_keeps_values_finite():
    mu = np.array([[0.0, 1.0], [1.0, 0.0]])
    mu2 = np.zeros((1, 2, 2))
    labels = np.array([0, 1])
    for name in ("univariate_logistic", "clique_logistic"):
        with np.errstate(all="raise"):
            value, gu, gp = marginal_loss(name, mu, mu2, np.array([(0, 1)]), labels)
        assert np.isfinite(value) and np.all(np.isfinite(gu)) and np.all(np.isfinite(gp))
    value, gu, _ = marginal_loss("univariate_logistic", mu, mu2, np.array([(0, 1)]), labels)
    assert value == pytest.approx(-2 * np.log(LOG_FLOOR))
    assert gu[0, 0] == -1 / LOG_FLOOR


def test_all_hidden_is_zero():
    mu = np.full((3, 2), 0.5)
    mu2 = np.full((2, 2, 2), 0.25)
    labels = np.full(3, -1)
    for name in MARGINAL_LOSSES:
        value, gu, gp = marginal_loss(name, mu, mu2, HAND_EDGES, labels, alpha=5)
        assert value == 0 and not gu.any() and not gp.any()


# ---------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------


def test_unknown_name():
    with pytest.raises(ValueError, match="univariate_logistic.*clique_logistic.*smooth_classification"):
        marginal_loss("hinge", HAND_MU, HAND_MU2, HAND_EDGES, HAND_LABELS)


@pytest.mark.parametrize("alpha", [None, 0, -1.0, 0.0])
def test_smooth_classification_bad_alpha(alpha):
    with pytest.raises(ValueError, match="smooth_classification.*alpha"):
        marginal_loss("smooth_classification", HAND_MU, HAND_MU2, HAND_EDGES, HAND_LABELS, alpha=alpha)


def test_alpha_ignored_by_other_losses():
    a = marginal_loss("univariate_logistic", HAND_MU, HAND_MU2, HAND_EDGES, HAND_LABELS)[0]
    b = marginal_loss("univariate_logistic", HAND_MU, HAND_MU2, HAND_EDGES, HAND_LABELS, alpha=5)[0]
    assert a == b


# ---------------------------------------------------------------------------
# pseudolikelihood
# ---------------------------------------------------------------------------


def pseudolikelihood_by_enumeration(edges, unary, pairwise, labels, nodes):
    """-sum_{i in nodes} log p(x_i | x_-i) from the full joint scores."""
    n, k = unary.shape
    scores, states = joint_scores(edges, unary, pairwise)
    x = np.maximum(labels, 0)
    total = 0.0
    for i in nodes:
        others = [v for v in range(n) if v != i]
        match = np.all(states[:, others] == x[others], axis=1)
        s = scores[match]  # one per value of x_i, in order a = 0..K-1
        a_states = states[match, i]
        total -= s[a_states == x[i]][0] - np.log(np.sum(np.exp(s)))
    return total


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("hidden", [[], [3], [1, 4]])
def test_pseudolikelihood_gradient(k, hidden):
    rng = np.random.default_rng(20 + k + len(hidden))
    unary, pairwise = random_model(EDGES, N_NODES, k, rng)
    labels = random_labels(rng, N_NODES, k, hidden)
    value, gu, gp = pseudolikelihood(EDGES, unary, pairwise, labels)
    num_u = numeric_gradient(lambda u: pseudolikelihood(EDGES, u, pairwise, labels)[0], unary)
    num_p = numeric_gradient(lambda p: pseudolikelihood(EDGES, unary, p, labels)[0], pairwise)
    assert rel_err(np.concatenate([gu.ravel(), gp.ravel()]), np.concatenate([num_u.ravel(), num_p.ravel()])) <= 1e-7


@pytest.mark.parametrize("k", [2, 3])
def test_pseudolikelihood_matches_enumeration(k):
    rng = np.random.default_rng(5 + k)
    unary, pairwise = random_model(EDGES, N_NODES, k, rng, scale=2.0)  # asymmetric tables
    labels = rng.integers(0, k, size=N_NODES)
    value, _, _ = pseudolikelihood(EDGES, unary, pairwise, labels)
    assert value == pytest.approx(pseudolikelihood_by_enumeration(EDGES, unary, pairwise, labels, range(N_NODES)))


def test_pseudolikelihood_hidden_drops_touching_terms():
    # chain 0-1-2-3-4, node 3 hidden: nodes 2, 3, 4 touch it, only 0 and 1 remain
    rng = np.random.default_rng(11)
    edges = chain_edges(5)
    unary, pairwise = random_model(edges, 5, 3, rng)
    labels = np.array([2, 0, 1, -1, 1])
    value, gu, gp = pseudolikelihood(edges, unary, pairwise, labels)
    # the conditionals of nodes 0, 1 do not depend on x_3: any fill-in gives the same
    filled = labels.copy()
    filled[3] = 0
    assert value == pytest.approx(pseudolikelihood_by_enumeration(edges, unary, pairwise, filled, [0, 1]))
    assert np.all(gu[2:] == 0)
    assert np.all(gp[2:] == 0)  # edges (2,3), (3,4) touch no kept node
    assert np.any(gp[1] != 0)  # edge (1, 2) feeds node 1's conditional


def test_pseudolikelihood_without_edges_is_independent_nll():
    rng = np.random.default_rng(2)
    unary = rng.normal(size=(6, 4))
    labels = np.array([0, 3, -1, 2, 1, 1])
    edges = np.zeros((0, 2), dtype=np.int64)
    value, gu, gp = pseudolikelihood(edges, unary, np.zeros((0, 4, 4)), labels)
    obs = labels >= 0
    logp = unary - np.log(np.exp(unary).sum(axis=1, keepdims=True))
    assert value == pytest.approx(-logp[np.flatnonzero(obs), labels[obs]].sum())
    assert gp.shape == (0, 4, 4)
    p = np.exp(logp)
    p[np.flatnonzero(obs), labels[obs]] -= 1
    p[~obs] = 0
    np.testing.assert_allclose(gu, p, atol=1e-15)
    # and piecewise coincides with it without edges
    assert piecewise(edges, unary, np.zeros((0, 4, 4)), labels)[0] == pytest.approx(value)


# ---------------------------------------------------------------------------
# piecewise likelihood
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("hidden", [[], [3], [1, 4]])
def test_piecewise_gradient(k, hidden):
    rng = np.random.default_rng(40 + k + len(hidden))
    unary, pairwise = random_model(EDGES, N_NODES, k, rng)
    labels = random_labels(rng, N_NODES, k, hidden)
    _, gu, gp = piecewise(EDGES, unary, pairwise, labels)
    num_u = numeric_gradient(lambda u: piecewise(EDGES, u, pairwise, labels)[0], unary)
    num_p = numeric_gradient(lambda p: piecewise(EDGES, unary, p, labels)[0], pairwise)
    assert rel_err(np.concatenate([gu.ravel(), gp.ravel()]), np.concatenate([num_u.ravel(), num_p.ravel()])) <= 1e-7
    assert np.all(gu[hidden] == 0)


@pytest.mark.parametrize("labels", [(2, 0), (1, 1), (0, 2)])
def test_piecewise_single_edge_by_enumeration(labels):
    rng = np.random.default_rng(sum(labels))
    k = 3
    edges = np.array([(0, 1)])
    unary = rng.normal(size=(2, k))
    pairwise = rng.normal(size=(1, k, k))
    x0, x1 = labels
    node0 = unary[0, x0] - np.log(sum(np.exp(unary[0, a]) for a in range(k)))
    node1 = unary[1, x1] - np.log(sum(np.exp(unary[1, b]) for b in range(k)))
    edge = pairwise[0, x0, x1] - np.log(sum(np.exp(pairwise[0, a, b]) for a in range(k) for b in range(k)))
    value, _, _ = piecewise(edges, unary, pairwise, np.array(labels))
    assert value == pytest.approx(-(node0 + node1 + edge), rel=1e-13)
    # hidden node 1: only node 0's piece remains
    value, _, gp = piecewise(edges, unary, pairwise, np.array([x0, -1]))
    assert value == pytest.approx(-node0, rel=1e-13)
    assert not gp.any()


def test_piecewise_bounds_true_likelihood():
    # A <= A_tilde, so the piecewise NLL is an upper bound on the true NLL
    rng = np.random.default_rng(9)
    unary, pairwise = random_model(EDGES, N_NODES, 3, rng)
    labels = rng.integers(0, 3, size=N_NODES)
    _, _, log_z = brute_force(EDGES, unary, pairwise)
    score = unary[np.arange(N_NODES), labels].sum() + pairwise[np.arange(len(EDGES)), labels[EDGES[:, 0]], labels[EDGES[:, 1]]].sum()
    assert piecewise(EDGES, unary, pairwise, labels)[0] >= log_z - score




@pytest.mark.parametrize("k", [2, 3])
def test_loss_and_grad_routes_each_inference_free_loss_to_its_definition(k):
    # the two losses share one branch of loss_and_grad: swapping them there
    # must show, which their own finite differences cannot see
    from sklearn_margcrf import loss_and_grad

    rng = np.random.default_rng(60 + k)
    unary, pairwise = random_model(EDGES, N_NODES, k, rng, scale=2.0)
    labels = rng.integers(0, k, size=N_NODES)
    pseudo = loss_and_grad(EDGES, unary, pairwise, labels, loss="pseudolikelihood")[0]
    assert pseudo == pytest.approx(pseudolikelihood_by_enumeration(EDGES, unary, pairwise, labels, range(N_NODES)))
    pieces = sum(unary[i, labels[i]] - np.log(np.exp(unary[i]).sum()) for i in range(N_NODES))
    pieces += sum(pairwise[e, labels[i], labels[j]] - np.log(np.exp(pairwise[e]).sum()) for e, (i, j) in enumerate(EDGES))
    assert loss_and_grad(EDGES, unary, pairwise, labels, loss="piecewise")[0] == pytest.approx(-pieces)
    assert pseudo != pytest.approx(-pieces)
