"""Class weights (MarginalCRF(class_weight=...)) and the node weights of
loss_and_grad behind them."""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from sklearn_margcrf import CRFSample, MarginalCRF, grid_edges, infer, loss_and_grad

WEIGHTED = ("univariate_logistic", "clique_logistic", "univariate_quadratic", "smooth_classification",
            "pseudolikelihood", "piecewise")


def _model(seed=0, shape=(2, 3), n_states=3):
    rng = np.random.default_rng(seed)
    edges = grid_edges(*shape)
    n = shape[0] * shape[1]
    unary = rng.normal(size=(n, n_states))
    pairwise = rng.normal(size=(len(edges), n_states, n_states)) * 0.5
    labels = rng.integers(0, n_states, n)
    labels[1] = -1  # a hidden node: weighs nothing whatever its weight
    return edges, unary, pairwise, labels


@pytest.mark.parametrize("loss", WEIGHTED)
def test_node_weights_give_the_weighted_sum_of_the_terms(loss):
    edges, unary, pairwise, labels = _model()
    n = len(labels)
    weights = np.random.default_rng(1).uniform(0, 3, n)

    def run(node_weight):
        return loss_and_grad(edges, unary, pairwise, labels, loss=loss, n_iter=4, node_weight=node_weight)

    plain = run(None)
    for got, want in zip(run(np.ones(n)), plain):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    # every term is one node's (an edge's is the mean of its ends'), so the
    # loss and its gradient are linear in the weights
    per_node = [run(np.eye(n)[i]) for i in range(n)]
    weighted = run(weights)
    assert weighted[0] == pytest.approx(sum(w * p[0] for w, p in zip(weights, per_node)), rel=1e-12)
    for part in (1, 2):
        np.testing.assert_allclose(weighted[part], sum(w * p[part] for w, p in zip(weights, per_node)),
                                   rtol=1e-10, atol=1e-12)
    if loss != "pseudolikelihood":  # a pseudolikelihood term needs its neighbours labelled too
        assert np.any([p[0] != 0 for i, p in enumerate(per_node) if labels[i] >= 0])


def test_weighted_univariate_logistic_by_hand_and_finite_differences():
    edges, unary, pairwise, labels = _model(seed=2)
    weights = np.array([2.0, 5.0, 0.5, 1.0, 3.0, 0.0])
    value, grad_unary, _ = loss_and_grad(edges, unary, pairwise, labels, n_iter=4, node_weight=weights)
    mu = infer(edges, unary, pairwise, method="trw", n_iter=4).unary
    seen = labels >= 0
    assert value == pytest.approx(-np.sum(weights[seen] * np.log(mu[seen, labels[seen]])), rel=1e-12)
    h = 1e-6
    for i, k in [(0, 1), (2, 0), (4, 2)]:
        step = np.zeros_like(unary)
        step[i, k] = h
        up = loss_and_grad(edges, unary + step, pairwise, labels, n_iter=4, node_weight=weights)[0]
        down = loss_and_grad(edges, unary - step, pairwise, labels, n_iter=4, node_weight=weights)[0]
        assert (up - down) / (2 * h) == pytest.approx(grad_unary[i, k], rel=1e-6, abs=1e-8)


def test_node_weight_errors():
    edges, unary, pairwise, labels = _model()
    with pytest.raises(ValueError, match="node_weight does not apply to loss='surrogate_likelihood'.*univariate_logistic"):
        loss_and_grad(edges, unary, pairwise, labels, loss="surrogate_likelihood", node_weight=np.ones(6))
    with pytest.raises(ValueError, match=r"node_weight must have shape \(n,\) = \(6,\)"):
        loss_and_grad(edges, unary, pairwise, labels, node_weight=np.ones(5))
    with pytest.raises(ValueError, match="non-negative"):
        loss_and_grad(edges, unary, pairwise, labels, node_weight=-np.ones(6))


def _rare_class_problem(n_images, seed, shape=(16, 16)):
    """A rare class (about 6% of the pixels, in small squares) whose feature
    overlaps the common one's: unweighted, a model hardly ever predicts it."""
    rng = np.random.default_rng(seed)
    X, y = [], []
    for _ in range(n_images):
        labels = np.zeros(shape, dtype=np.int64)
        for _ in range(2):
            r, c = rng.integers(0, shape[0] - 3, 2)
            labels[r:r + 3, c:c + 3] = 1
        noisy = labels + rng.normal(scale=1.0, size=shape)
        features = np.stack([np.ones(labels.size), noisy.ravel()], axis=1)
        edges = grid_edges(*shape)
        X.append(CRFSample(features, edges, np.ones((len(edges), 1)), grid_shape=shape))
        y.append(labels)
    return X, y


def _recall(model, X, y, label):
    predicted = np.concatenate([p.ravel() for p in model.predict(X)])
    truth = np.concatenate([t.ravel() for t in y])
    return np.mean(predicted[truth == label] == label)


@pytest.mark.parametrize("inference", ["independent", "trw"])
def test_balanced_class_weight_raises_the_recall_of_a_rare_class(inference):
    X, y = _rare_class_problem(6, seed=0)
    X_test, y_test = _rare_class_problem(4, seed=1)
    params = dict(inference=inference, n_iter=5, max_iter=30, reg=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        plain = MarginalCRF(**params).fit(X, y)
        balanced = MarginalCRF(class_weight="balanced", **params).fit(X, y)
    assert _recall(plain, X_test, y_test, 1) < 0.3
    assert _recall(balanced, X_test, y_test, 1) > _recall(plain, X_test, y_test, 1) + 0.3


def test_class_weight_objective_is_the_weighted_mean_per_labelled_node():
    X, y = _rare_class_problem(2, seed=3, shape=(5, 6))
    y[0][0, :3] = -1
    class_weight = {0: 0.5, 1: 4.0}
    reports = []
    reg = 1e-2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        MarginalCRF(n_iter=3, max_iter=2, init="zeros", reg=reg, class_weight=class_weight,
                    callback=reports.append).fit(X, y)
    report = reports[-1]
    F, G = report.unary_coef, report.pairwise_coef
    total, weight_sum = 0.0, 0.0
    for (features, edges, edge_features), labels in zip(X, y):
        labels = labels.ravel()
        weights = np.where(labels == 1, 4.0, 0.5) * (labels >= 0)
        unary = features @ F.T
        pairwise = (edge_features @ G.reshape(4, -1).T).reshape(-1, 2, 2)
        total += loss_and_grad(edges, unary, pairwise, labels, n_iter=3, node_weight=weights)[0]
        weight_sum += weights.sum()
    expected = total / weight_sum + reg * (np.sum(F * F) + np.sum(G * G))
    assert report.objective == pytest.approx(expected, rel=1e-10)


def test_class_weight_errors_name_the_parameter():
    X, y = _rare_class_problem(1, seed=0, shape=(4, 4))
    fit = MarginalCRF(n_iter=2, max_iter=1).fit
    with pytest.raises(ValueError, match="class_weight does not apply to loss='surrogate_likelihood'"):
        MarginalCRF(loss="surrogate_likelihood", class_weight="balanced").fit(X, y)
    with pytest.raises(ValueError, match="class_weight has class 7, which is not among the classes"):
        MarginalCRF(class_weight={7: 1.0}).fit(X, y)
    with pytest.raises(ValueError, match=r"class_weight\[1\] must be a finite number >= 0"):
        MarginalCRF(class_weight={1: -2.0}).fit(X, y)
    with pytest.raises(ValueError, match="class_weight"):
        MarginalCRF(class_weight="inverse").fit(X, y)
    assert fit  # the defaults fit the same data
