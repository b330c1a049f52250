"""Every public keyword arrives where it should and changes the result the way
it should, through ``loss_and_grad`` and through ``MarginalCRF``.

Finite-difference tests compare a function with its own gradient, so they
cannot see an argument that never arrives (an ``alpha`` left at its default,
a ``rho`` replaced by the default rule, 4-sided differences computed as
2-sided): these tests compare with values computed independently.
"""

import copy
import warnings

import numpy as np
import pytest
import scipy.optimize
from estimator_checks import make_structured_data
from reference import brute_force, chain_edges, random_model
from scipy.special import expit

from sklearn_margcrf import MarginalCRF, grid_edges, infer, loss_and_grad


def _model(shape=(3, 3), n_states=3, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    edges = grid_edges(*shape)
    n_nodes = shape[0] * shape[1]
    unary, pairwise = random_model(edges, n_nodes, n_states, rng, scale=scale)
    labels = rng.integers(0, n_states, size=n_nodes)
    return edges, unary, pairwise, labels


def _univariate_logistic(mu, labels):
    return -np.sum(np.log(mu[np.arange(labels.size), labels]))


def _smooth_classification(mu, labels, alpha):
    truth = mu[np.arange(labels.size), labels]
    wrong = mu.copy()
    wrong[np.arange(labels.size), labels] = -np.inf
    return np.sum(expit(alpha * (wrong.max(axis=1) - truth)))


# ---------------------------------------------------------------------------
# loss_and_grad: the value is the loss of the marginals infer() gives with the
# same keywords
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [2.0, 40.0])
def test_alpha_is_the_slope_of_the_smoothed_classification_loss(alpha):
    edges, unary, pairwise, labels = _model()
    value, _, _ = loss_and_grad(edges, unary, pairwise, labels, loss="smooth_classification", alpha=alpha, n_iter=5)
    mu = infer(edges, unary, pairwise, n_iter=5).unary
    assert value == pytest.approx(_smooth_classification(mu, labels, alpha), rel=1e-12)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(inference="trw", rho=0.3, n_iter=6),
        dict(inference="trw", rho=2.0, n_iter=6),
        dict(inference="trw", rho="uniform_spanning_tree", n_iter=6),
        dict(inference="lbp", n_iter=0),
        dict(inference="lbp", n_iter=1),
        dict(inference="mean_field", n_iter=3),
        dict(inference="trw", gradient_mode="backprop", n_iter=None, tol=1e-1, rho=0.5),
        dict(inference="trw", gradient_mode="backprop", n_iter=None, tol=1e-9, rho=0.5),
        dict(inference="mean_field", gradient_mode="perturbation", n_iter=None, tol=1e-6, max_iter=2),
    ],
)
def test_inference_keywords_reach_the_marginals_of_the_loss(kwargs):
    edges, unary, pairwise, labels = _model()
    kwargs = dict(kwargs)
    mode = kwargs.pop("gradient_mode", "truncated")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # max_iter=2: not converged
        value, _, _ = loss_and_grad(edges, unary, pairwise, labels, gradient_mode=mode, **kwargs)
        mu = infer(edges, unary, pairwise, method=kwargs.pop("inference"), **kwargs).unary
    assert value == pytest.approx(_univariate_logistic(mu, labels), rel=1e-12)


def test_the_inference_keywords_change_the_loss():
    edges, unary, pairwise, labels = _model()
    values = [
        loss_and_grad(edges, unary, pairwise, labels, **kwargs)[0]
        for kwargs in (dict(rho=0.3), dict(rho=0.9), dict(n_iter=1), dict(n_iter=2), dict(inference="lbp"))
    ]
    assert len(set(values)) == len(values)


def _exact_gradient(edges, unary, pairwise, labels, loss="univariate_logistic"):
    return loss_and_grad(edges, unary, pairwise, labels, loss=loss, inference="exact", gradient_mode="implicit", n_iter=None)


def _error(grad, reference):
    return np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(grad, reference)))


def test_more_sides_give_a_more_accurate_perturbation_gradient():
    # with a large step the truncation error dominates: O(r) one-sided, O(r^2)
    # two-sided, O(r^4) four-sided
    edges, unary, pairwise, labels = _model(shape=(2, 3))
    reference = _exact_gradient(edges, unary, pairwise, labels)[1:]
    errors = {}
    for sides in (1, 2, 4):
        grad = loss_and_grad(edges, unary, pairwise, labels, inference="exact", gradient_mode="perturbation", n_iter=None,
                             sides=sides, multiplier=1e3)[1:]
        errors[sides] = _error(grad, reference)
    assert errors[4] < errors[2] / 20 < errors[1] / 400, errors


def test_the_multiplier_scales_the_perturbation_step():
    edges, unary, pairwise, labels = _model(shape=(2, 3))
    reference = _exact_gradient(edges, unary, pairwise, labels)[1:]
    errors = []
    for multiplier in (1e2, 1e3, 1e4):
        grad = loss_and_grad(edges, unary, pairwise, labels, inference="exact", gradient_mode="perturbation", n_iter=None,
                             multiplier=multiplier)[1:]
        errors.append(_error(grad, reference))
    # two-sided: the error grows like the square of the step
    assert 30 < errors[1] / errors[0] < 300 and 30 < errors[2] / errors[1] < 300, errors


def test_tol_bounds_the_error_of_the_backprop_gradient():
    edges, unary, pairwise, labels = _model(n_states=2)
    reference = loss_and_grad(edges, unary, pairwise, labels, inference="lbp", gradient_mode="implicit", n_iter=None,
                              tol=1e-13, max_iter=10000)[1:]
    errors = []
    for tol in (1e-2, 1e-5, 1e-9):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a loose tol may fall back to the stored iterations
            grad = loss_and_grad(edges, unary, pairwise, labels, inference="lbp", gradient_mode="backprop", n_iter=None,
                                 tol=tol)[1:]
        errors.append(_error(grad, reference))
    assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-9, errors


# ---------------------------------------------------------------------------
# TRW's log partition, value checks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("rho", [0.3, 0.5, 0.8, "uniform_spanning_tree"])
def test_trw_log_partition_gradient_is_the_marginals(rho):
    # at the TRW fixed point d A~ / d theta = mu (the envelope theorem): the
    # marginals of message passing and the entropy in A~ must agree, which
    # they do only with the entropy weighing each edge by rho
    edges, unary, pairwise, _ = _model(shape=(2, 3), n_states=3, scale=0.8)
    result = infer(edges, unary, pairwise, rho=rho, tol=1e-13, max_iter=20000)
    assert result.converged
    rng = np.random.default_rng(1)
    h = 1e-5
    for _ in range(3):
        d_unary, d_pairwise = rng.standard_normal(unary.shape), rng.standard_normal(pairwise.shape)
        up = infer(edges, unary + h * d_unary, pairwise + h * d_pairwise, rho=rho, tol=1e-13, max_iter=20000)
        down = infer(edges, unary - h * d_unary, pairwise - h * d_pairwise, rho=rho, tol=1e-13, max_iter=20000)
        numeric = (up.log_partition - down.log_partition) / (2 * h)
        analytic = np.sum(result.unary * d_unary) + np.sum(result.pairwise * d_pairwise)
        assert numeric == pytest.approx(analytic, rel=1e-7, abs=1e-9)


@pytest.mark.parametrize("method", ["trw", "lbp"])
def test_trw_log_partition_is_log_z_on_a_chain(method):
    edges = chain_edges(5)
    unary, pairwise = random_model(edges, 5, 3, np.random.default_rng(2), scale=2.0)
    result = infer(edges, unary, pairwise, method=method, tol=1e-13, max_iter=10000)
    assert result.log_partition == pytest.approx(brute_force(edges, unary, pairwise)[2], rel=1e-12)


def test_trw_log_partition_moves_with_rho_as_the_entropy_says():
    # A~(rho) = theta . mu + sum_i H(mu_i) - sum_c rho_c I(mu_c) at the optimum,
    # so by the envelope theorem dA~/drho_c = -I(mu_c) <= 0
    edges, unary, pairwise, _ = _model(shape=(2, 2), scale=1.0)
    values = [infer(edges, unary, pairwise, rho=rho, tol=1e-13, max_iter=20000) for rho in (0.6 - 1e-5, 0.6, 0.6 + 1e-5)]
    mu, mu2 = values[1].unary, values[1].pairwise
    i, j = edges[:, 0], edges[:, 1]
    information = np.einsum("eab,eab->e", mu2, np.log(mu2 / (mu[i][:, :, None] * mu[j][:, None, :])))
    numeric = (values[2].log_partition - values[0].log_partition) / 2e-5
    assert numeric == pytest.approx(-information.sum(), rel=1e-5)


# ---------------------------------------------------------------------------
# MarginalCRF: the objective and the first L-BFGS step, recomputed by hand
# through loss_and_grad with the estimator's keywords
# ---------------------------------------------------------------------------


def _objective_by_hand(X, y, F, G, reg, **kwargs):
    """Mean loss per labelled node + reg |w|^2 and its gradient in (F, G)."""
    total, grad_f, grad_g, n_labelled = 0.0, np.zeros_like(F), np.zeros_like(G), 0
    for (node_features, edges, edge_features), labels in zip(X, y):
        labels = np.ravel(labels)
        unary = node_features @ F.T
        pairwise = np.einsum("abf,ef->eab", G, edge_features)
        value, grad_unary, grad_pairwise = loss_and_grad(edges, unary, pairwise, labels, **kwargs)
        total += value
        grad_f += grad_unary.T @ node_features
        grad_g += np.einsum("eab,ef->abf", grad_pairwise, edge_features)
        n_labelled += np.count_nonzero(labels >= 0)
    w = np.concatenate([F.ravel(), G.ravel()])
    grad = np.concatenate([grad_f.ravel(), grad_g.ravel()]) / n_labelled + 2 * reg * w
    return total / n_labelled + reg * w @ w, grad


ESTIMATOR_KEYWORDS = [
    # (MarginalCRF keywords, the same as loss_and_grad keywords)
    (dict(inference="independent"), dict(n_iter=0)),  # TRW without iterations: softmax(theta_i)
    (dict(rho=0.3, n_iter=5), dict(rho=0.3, n_iter=5)),
    (dict(loss="smooth_classification", alpha=3.0, inference="mean_field", n_iter=4),
     dict(loss="smooth_classification", alpha=3.0, inference="mean_field", n_iter=4)),
    (dict(inference="lbp", gradient_mode="perturbation", sides=4, multiplier=1e4, tol=1e-8),
     dict(inference="lbp", gradient_mode="perturbation", sides=4, multiplier=1e4, tol=1e-8, n_iter=None)),
    (dict(inference="lbp", gradient_mode="perturbation", sides=1, multiplier=10.0, tol=1e-8),
     dict(inference="lbp", gradient_mode="perturbation", sides=1, multiplier=10.0, tol=1e-8, n_iter=None)),
    (dict(loss="clique_logistic", gradient_mode="backprop", tol=1e-10, inference_max_iter=3),
     dict(loss="clique_logistic", gradient_mode="backprop", tol=1e-10, max_iter=3, n_iter=None)),
]


def _whitened(grad, X, y, reg, shape_f):
    """The gradient mapped by S^2 = (M / 4 + 2 reg I)^-1, M the second moments
    of the node features over the labelled nodes and of the edge features over
    all edges, per labelled node: where a preconditioned L-BFGS steps first."""
    labelled = [np.ravel(labels) >= 0 for labels in y]
    n_labelled = sum(int(mask.sum()) for mask in labelled)
    node = sum(nf[mask].T @ nf[mask] for (nf, _, _), mask in zip(X, labelled)) / n_labelled
    edge = sum(ef.T @ ef for (_, _, ef), _ in zip(X, labelled)) / n_labelled
    size_f = int(np.prod(shape_f))
    grad_f = grad[:size_f].reshape(shape_f) @ np.linalg.inv(node / 4 + 2 * reg * np.eye(len(node)))
    grad_g = grad[size_f:].reshape(-1, len(edge)) @ np.linalg.inv(edge / 4 + 2 * reg * np.eye(len(edge)))
    return np.concatenate([grad_f.ravel(), grad_g.ravel()])


@pytest.mark.parametrize("precondition", [True, False])
@pytest.mark.parametrize(
    "params, kwargs", ESTIMATOR_KEYWORDS,
    ids=["independent", "rho", "alpha", "sides4-multiplier", "sides1-multiplier", "tol-inference_max_iter"],
)
def test_estimator_objective_and_step_use_its_keywords(params, kwargs, precondition):
    X, y = make_structured_data(n_samples=2, shape=(3, 3), n_states=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = MarginalCRF(inference="independent", init="zeros", max_iter=5).fit(X, y)
        model = copy.deepcopy(start).set_params(warm_start=True, max_iter=1, reg=1e-2, precondition=precondition,
                                                **{"inference": "trw", **params})
        model.fit(X, y)
        w0 = np.concatenate([start.unary_coef_.ravel(), start.pairwise_coef_.ravel()])
        w1 = np.concatenate([model.unary_coef_.ravel(), model.pairwise_coef_.ravel()])
        value, _ = _objective_by_hand(X, y, model.unary_coef_, model.pairwise_coef_, 1e-2, **kwargs)
        _, grad = _objective_by_hand(X, y, start.unary_coef_, start.pairwise_coef_, 1e-2, **kwargs)
    assert model.loss_curve_[0] == pytest.approx(value, rel=1e-10)
    # L-BFGS's first step is along the negative gradient in its coordinates:
    # in the weights, along -S^2 grad with the preconditioner S
    direction = _whitened(grad, X, y, 1e-2, start.unary_coef_.shape) if precondition else grad
    step = w1 - w0
    cosine = -(step @ direction) / (np.linalg.norm(step) * np.linalg.norm(direction))
    assert cosine == pytest.approx(1.0, abs=1e-10)
    if precondition:  # and the features of this problem make that another direction
        assert -(step @ grad) / (np.linalg.norm(step) * np.linalg.norm(grad)) < 0.999


def _always_abnormal(real_minimize):
    def minimize(fun, x0, **kwargs):
        result = real_minimize(fun, x0, **dict(kwargs, options=dict(kwargs["options"], maxiter=2)))
        result.status, result.message = 2, "ABNORMAL: simulated"
        return result

    return minimize


@pytest.mark.parametrize("max_restarts", [0, 2])
def test_max_restarts_bounds_the_restarts_after_abnormal_line_searches(monkeypatch, max_restarts):
    X, y = make_structured_data()
    monkeypatch.setattr(scipy.optimize, "minimize", _always_abnormal(scipy.optimize.minimize))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = MarginalCRF(inference="independent", init="zeros", max_iter=50, max_restarts=max_restarts).fit(X, y)
    assert model.n_restarts_ == max_restarts
    assert model.n_iter_ == 2 * (max_restarts + 1)


def test_lbfgs_tol_stops_the_fit_at_that_gradient():
    X, y = make_structured_data()
    n_iter = {}
    for lbfgs_tol in (3e-2, 1e-5):  # (at 1e-7, scipy's ftol stops first: the objective changes by 1e-11)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = MarginalCRF(inference="independent", init="zeros", max_iter=200, lbfgs_tol=lbfgs_tol).fit(X, y)
        n_iter[lbfgs_tol] = model.n_iter_
        # the independent model: TRW with no iteration has the marginals softmax(theta_i)
        _, grad = _objective_by_hand(X, y, model.unary_coef_, model.pairwise_coef_, 1e-3, n_iter=0)
        assert np.abs(grad).max() < lbfgs_tol
    assert n_iter[3e-2] < n_iter[1e-5]


@pytest.mark.parametrize(
    "params, kwargs",
    [
        (dict(rho=0.3, n_iter=4, tol=1e-3), dict(method="trw", rho=0.3, n_iter=4)),
        (dict(inference="lbp", gradient_mode="backprop", tol=1e-3), dict(method="lbp", tol=1e-3)),
        (dict(inference="mean_field", loss="pseudolikelihood", n_iter=3, tol=1e-9, inference_max_iter=2),
         dict(method="mean_field", tol=1e-9, max_iter=2)),  # fit without inference: predict runs to tol
    ],
    ids=["trw-rho-n_iter", "lbp-tol", "mean_field-inference_max_iter"],
)
def test_predict_proba_is_inference_with_the_estimator_keywords(params, kwargs):
    X, y = make_structured_data(n_samples=2, shape=(3, 3), n_states=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = MarginalCRF(max_iter=2, **params).fit(X, y)
        proba = model.predict_proba(X)
        for (node_features, edges, edge_features), p in zip(X, proba):
            unary = node_features @ model.unary_coef_.T
            pairwise = np.einsum("abf,ef->eab", model.pairwise_coef_, edge_features)
            expected = infer(edges, unary, pairwise, **kwargs).unary
            np.testing.assert_allclose(p.reshape(expected.shape), expected, rtol=1e-12, atol=1e-15)
