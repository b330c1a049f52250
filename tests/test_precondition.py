"""MarginalCRF(precondition=...): L-BFGS in whitened coordinates finds the
same minimum as L-BFGS on the weights, in fewer iterations where the
features are correlated and differently scaled (as image features are)."""

import warnings

import numpy as np
import pytest
from estimator_checks import make_structured_data

from sklearn_margcrf import CRFSample, MarginalCRF


def _ill_conditioned(n_samples=4, n_states=3):
    """Features of make_structured_data with their columns scaled over four
    orders of magnitude and a near-copy of one column appended."""
    X, y = make_structured_data(n_samples=n_samples, shape=(5, 5), n_states=n_states)
    rng = np.random.default_rng(0)
    scales = 10.0 ** np.linspace(-2, 2, X[0].node_features.shape[1])
    out = []
    for s in X:
        nf = s.node_features * scales
        nf = np.hstack([nf, nf[:, 1:2] + 1e-3 * rng.standard_normal((len(nf), 1))])
        ef = np.hstack([s.edge_features, 30 * s.edge_features[:, :1]])
        out.append(CRFSample(nf, s.edges, ef, grid_shape=s.grid_shape))
    return out, y


def _fit(X, y, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MarginalCRF(**{"init": "zeros", "objective_tol": 0.0, "max_restarts": 10, **params}).fit(X, y)


@pytest.mark.parametrize("params", [dict(inference="independent"), dict(inference="trw", n_iter=3, reg=1e-2)],
                         ids=["independent", "trw"])
def test_the_same_minimum_in_fewer_iterations(params):
    X, y = _ill_conditioned()
    common = dict(lbfgs_tol=1e-7, max_iter=3000, **params)
    plain = _fit(X, y, precondition=False, **common)
    whitened = _fit(X, y, precondition=True, **common)
    assert whitened.n_iter_ < plain.n_iter_ / 4, (whitened.n_iter_, plain.n_iter_)
    if params["inference"] == "independent":  # strictly convex: both reach its one minimum
        assert whitened.loss_curve_[-1] == pytest.approx(plain.loss_curve_[-1], rel=1e-8)
        for a, b in [(whitened.unary_coef_, plain.unary_coef_), (whitened.pairwise_coef_, plain.pairwise_coef_)]:
            np.testing.assert_allclose(a, b, atol=1e-3 * np.abs(b).max())
    else:
        # not convex (3 TRW iterations): the two may end in different local
        # minima (which one plain L-BFGS reaches after its ~500 iterations
        # changes with an ulp of rounding: 7e-6 above the whitened objective
        # or 5e-5 below), of about the same objective; and plain L-BFGS
        # cannot go lower from the whitened end either: a minimum
        assert whitened.loss_curve_[-1] == pytest.approx(plain.loss_curve_[-1], rel=1e-3)
        resumed = MarginalCRF(precondition=False, objective_tol=0.0, **common)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            resumed.fit(X, y, unary_coef_init=whitened.unary_coef_, pairwise_coef_init=whitened.pairwise_coef_)
        assert resumed.loss_curve_[-1] == pytest.approx(whitened.loss_curve_[-1], rel=1e-9)


def test_preconditioning_changes_the_path_from_the_first_iteration():
    X, y = _ill_conditioned()
    plain = _fit(X, y, precondition=False, max_iter=3, inference="independent")
    whitened = _fit(X, y, precondition=True, max_iter=3, inference="independent")
    # L-BFGS's first iterate moves along the gradient scaled to a unit step
    # in each parametrisation, so already the first objective value differs
    assert whitened.loss_curve_[0] != plain.loss_curve_[0]
    assert whitened.loss_curve_[-1] < plain.loss_curve_[-1]


def test_a_feature_that_is_zero_everywhere_without_ridge():
    # reg = 0 and a zero column: the second moment is singular; the
    # preconditioner floors it and the fit stays finite, the column's weights 0
    X, y = make_structured_data(n_samples=3)
    X = [CRFSample(np.hstack([s.node_features, np.zeros((len(s.node_features), 1))]), s.edges, s.edge_features,
                   grid_shape=s.grid_shape) for s in X]
    model = _fit(X, y, reg=0.0, n_iter=2, max_iter=20)
    assert np.all(np.isfinite(model.unary_coef_)) and np.all(np.isfinite(model.pairwise_coef_))
    np.testing.assert_array_equal(model.unary_coef_[:, -1], 0.0)


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_class_weights_enter_the_second_moments_as_they_enter_the_loss(n_jobs):
    # The independent model from F = 0: the gradient is
    # sum_i c_i u_i (1/K - e_{y_i}) / sum_i c_i + 0, and the first step goes
    # along -grad (M_c / 4 + 2 reg I)^-1 with M_c = sum_i c_i u_i u_i^T / sum_i c_i
    X, y = make_structured_data(n_samples=3, n_states=3)
    class_weight, reg = {0: 1.0, 1: 5.0, 2: 0.5}, 1e-3
    model = _fit(X, y, inference="independent", max_iter=1, class_weight=class_weight, reg=reg, n_jobs=n_jobs)
    features = np.vstack([s.node_features for s in X])
    labels = np.concatenate([np.ravel(lab) for lab in y])
    features, labels = features[labels >= 0], labels[labels >= 0]
    c = np.array([class_weight[k] for k in labels])
    grad = ((1 / 3 - np.eye(3)[labels]) * c[:, None]).T @ features / c.sum()

    def direction(weights):
        moment = (features * weights[:, None]).T @ features / weights.sum()
        return (grad @ np.linalg.inv(moment / 4 + 2 * reg * np.eye(len(moment)))).ravel()

    def cosine(a, b):
        return -(a @ b) / (np.linalg.norm(a) * np.linalg.norm(b))

    step = model.unary_coef_.ravel()
    assert cosine(step, direction(c)) == pytest.approx(1.0, abs=1e-10)
    assert cosine(step, direction(np.ones_like(c))) < 0.9999  # unweighted moments: another direction
