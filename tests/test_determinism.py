"""Determinism: the same data and parameters give bit-identical weights,
learning curves and marginals across n_jobs, joblib backends and repeated
runs (images are summed in a fixed order; L-BFGS runs on one BLAS thread).
A history-dependent variant, several backends in one fresh process, is in
test_estimator.py."""

import warnings

import joblib
import numpy as np
import pytest
from estimator_checks import make_structured_data

from sklearn_margcrf import MarginalCRF

RUNS = [("sequential", 1), ("threading", 2), ("loky", 2), ("threading", 2), ("loky", 2)]  # the last two repeat


@pytest.mark.parametrize(
    "params",
    [
        dict(inference="trw", rho=0.5, n_iter=3),
        dict(loss="smooth_classification", inference="mean_field", gradient_mode="backprop", alpha=5.0),
        dict(loss="clique_logistic", inference="lbp", gradient_mode="perturbation", sides=4),
    ],
    ids=["trw-truncated", "mean_field-backprop", "lbp-perturbation"],
)
def test_weights_are_bit_identical_across_n_jobs_backends_and_runs(params):
    X, y = make_structured_data(n_samples=3, shape=(3, 4), n_states=3)
    fits = []
    for backend, n_jobs in RUNS:
        with warnings.catch_warnings(), joblib.parallel_config(backend=backend):
            warnings.simplefilter("ignore")
            model = MarginalCRF(max_iter=3, tol=1e-6, n_jobs=n_jobs, **params).fit(X, y)
            proba = model.predict_proba(X)
        fits.append((model, proba))
    first, first_proba = fits[0]
    for model, proba in fits[1:]:
        np.testing.assert_array_equal(model.unary_coef_, first.unary_coef_)
        np.testing.assert_array_equal(model.pairwise_coef_, first.pairwise_coef_)
        assert model.loss_curve_ == first.loss_curve_
        for p, q in zip(proba, first_proba):
            np.testing.assert_array_equal(p, q)
    assert np.any(first.pairwise_coef_)  # the fit moved the weights


@pytest.mark.parametrize("shape", [(4, 5), (12, 15)])
def test_rho_of_a_graph_does_not_depend_on_the_blas_threads_of_its_first_use(shape):
    # rho="auto" solves a linear system once per graph and caches it: if the
    # first solve (say, a loss_and_grad call before any fit) ran with other
    # BLAS threads than a later one, every later fit of that graph moved by
    # an ulp. Two graphs with the same edges but a different node count (an
    # extra isolated node) are cached apart and solve the same system.
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from sklearn_margcrf import edge_appearance_probabilities, grid_edges

    edges = grid_edges(*shape)
    n_nodes = shape[0] * shape[1]
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        one_thread = edge_appearance_probabilities(n_nodes + 1, edges, rule="uniform_spanning_tree")
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        two_threads = edge_appearance_probabilities(n_nodes + 2, edges, rule="uniform_spanning_tree")
    np.testing.assert_array_equal(one_thread, two_threads)
