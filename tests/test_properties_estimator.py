"""Property-based tests of ``MarginalCRF``: fit and predict_proba on random
small samples (graphs of every kind of :mod:`strategies`, hidden labels,
every loss, inference method and gradient mode that apply)."""

import warnings

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from strategies import GRAPH_KINDS, make_graph

from sklearn_margcrf import MarginalCRF
from sklearn_margcrf.gradients import GRADIENT_MODES, LOSSES, check_combination

def _applies(loss, inference, mode):
    if inference == "independent":
        return mode == "truncated" and loss != "clique_logistic"
    if loss in ("pseudolikelihood", "piecewise") and mode != "truncated":
        return False  # the mode is ignored: one of them is enough
    try:
        check_combination(loss, inference, mode)
    except ValueError:
        return False
    return True


ESTIMATOR_COMBINATIONS = [
    (loss, inference, mode)
    for loss in LOSSES
    for inference in ("trw", "lbp", "mean_field", "exact", "independent")
    for mode in GRADIENT_MODES
    if _applies(loss, inference, mode)
]


@st.composite
def data_sets(draw):
    """1 to 3 samples with 1 to 3 node features and 1 to 2 edge features."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n_states = draw(st.integers(2, 4))
    n_node_features, n_edge_features = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    scale = 10.0 ** draw(st.floats(-1.0, 1.0))
    X, y = [], []
    for _ in range(draw(st.integers(1, 3))):
        n_nodes, edges = make_graph(draw(st.sampled_from(GRAPH_KINDS)), draw(st.integers(1, 3)), rng)
        node_features = scale * rng.standard_normal((n_nodes, n_node_features))
        edge_features = scale * rng.standard_normal((edges.shape[0], n_edge_features))
        labels = rng.integers(0, n_states, size=n_nodes)
        labels[rng.random(n_nodes) < draw(st.sampled_from((0.0, 0.3)))] = -1
        X.append((node_features, edges, edge_features))
        y.append(labels)
    y[0][0] = 0  # at least one labelled node
    return X, y, n_states


@given(
    data=data_sets(),
    combination=st.sampled_from(ESTIMATOR_COMBINATIONS),
    n_iter=st.sampled_from((0, 2, 10)),
    init=st.sampled_from(("independent", "zeros")),
)
def test_fit_and_predict_proba_on_random_samples(data, combination, n_iter, init):
    X, y, n_states = data
    loss, inference, mode = combination
    model = MarginalCRF(
        loss=loss, inference=inference, gradient_mode=mode, n_iter=n_iter, n_states=n_states, init=init,
        max_iter=3, tol=1e-6,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning after 3 iterations, floored messages
        model.fit(X, y)
        proba = model.predict_proba(X)
        predictions = model.predict(X)
    assert np.all(np.isfinite(model.unary_coef_)) and np.all(np.isfinite(model.pairwise_coef_))
    assert model.unary_coef_.shape == (n_states, X[0][0].shape[1])
    assert model.pairwise_coef_.shape == (n_states, n_states, X[0][2].shape[1])
    if inference == "independent":
        assert not np.any(model.pairwise_coef_)
    assert len(model.loss_curve_) == model.n_iter_ and np.all(np.isfinite(model.loss_curve_))
    for p, sample in zip(proba, X):
        assert p.shape == (sample[0].shape[0], n_states)
        assert np.all(np.isfinite(p)) and np.all(p >= 0)
        np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-9)
    for p, labels in zip(proba, predictions):
        np.testing.assert_array_equal(labels, np.argmax(p, axis=1))
