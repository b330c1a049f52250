"""Warm starts of inference between L-BFGS evaluations
(``MarginalCRF(inference_warm_start=...)``): fewer inference iterations, the
same model within the inference tolerance, the same weights bit for bit for
any n_jobs and backend, a clear error where the start is part of the model,
nothing left behind, and room for them in the memory estimate."""

import warnings

import joblib
import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from estimator_checks import make_structured_data
from sklearn_margcrf import MarginalCRF
from sklearn_margcrf._memory import worker_memory
from sklearn_margcrf.estimator import _check_X, _check_y
from sklearn_margcrf.exceptions import WorkerLostWarning

X, Y = make_structured_data(n_samples=3, shape=(6, 7), hidden=0)


def _fit(n_jobs=1, backend="loky", **params):
    params = dict(dict(max_iter=6, tol=1e-8, inference_max_iter=10000), **params)
    with warnings.catch_warnings(), joblib.parallel_config(backend=backend):
        warnings.simplefilter("ignore", ConvergenceWarning)
        return MarginalCRF(n_jobs=n_jobs, **params).fit(X, Y)


@pytest.mark.parametrize(
    "params",
    [dict(gradient_mode="implicit"), dict(inference="mean_field", gradient_mode="perturbation"),
     dict(inference="lbp", gradient_mode="backprop")],
    ids=["trw-implicit", "mean_field-perturbation", "lbp-backprop"],
)
def test_warm_starts_save_iterations_and_leave_the_model_within_tol(params):
    cold = _fit(inference_warm_start=False, **params)
    warm = _fit(inference_warm_start=True, **params)
    auto = _fit(**params)  # "auto": warm for backprop and implicit, cold for perturbation
    assert warm.n_inference_iter_ < cold.n_inference_iter_
    same = cold if params["gradient_mode"] == "perturbation" else warm
    assert auto.n_inference_iter_ == same.n_inference_iter_
    np.testing.assert_array_equal(auto.unary_coef_, same.unary_coef_)
    # inference to tol=1e-8 from either start: the same fit to within its effect
    np.testing.assert_allclose(warm.unary_coef_, cold.unary_coef_, atol=1e-5)
    np.testing.assert_allclose(warm.pairwise_coef_, cold.pairwise_coef_, atol=1e-5)
    np.testing.assert_allclose(warm.loss_curve_, cold.loss_curve_, rtol=1e-6)


def test_auto_starts_truncated_fitting_cold_and_true_refuses_it():
    truncated = _fit(n_iter=3, max_iter=2)
    assert truncated.n_inference_iter_ > 0
    assert _fit(n_iter=3, max_iter=2, inference_warm_start=False).n_inference_iter_ == truncated.n_inference_iter_
    with pytest.raises(ValueError, match="inference_warm_start=True does not apply: with gradient_mode='truncated'"):
        _fit(n_iter=3, inference_warm_start=True)
    with pytest.raises(ValueError, match="loss='pseudolikelihood' needs no inference in training"):
        _fit(loss="pseudolikelihood", inference_warm_start=True)
    with pytest.raises(ValueError, match="inference='exact' is not iterative"):
        _fit(inference="exact", gradient_mode="implicit", inference_warm_start=True)
    with pytest.raises(ValueError, match="inference_warm_start"):
        MarginalCRF(inference_warm_start="yes").fit(X, Y)


@pytest.mark.parametrize("backend", ["threading", "loky", "multiprocessing"])
def test_warm_fits_are_bit_identical_across_n_jobs_and_backends(backend, tmp_path, monkeypatch):
    monkeypatch.setenv("JOBLIB_TEMP_FOLDER", str(tmp_path))
    params = dict(gradient_mode="implicit", tol=1e-4, max_iter=4)
    one = _fit(**params)
    two = _fit(n_jobs=2, backend=backend, **params)
    np.testing.assert_array_equal(two.unary_coef_, one.unary_coef_)
    np.testing.assert_array_equal(two.pairwise_coef_, one.pairwise_coef_)
    assert two.n_inference_iter_ == one.n_inference_iter_
    assert list(tmp_path.iterdir()) == []  # the warm starts went with the batches


def test_warm_starts_are_counted_in_the_memory_estimate():
    samples, _, _ = _check_X(X)
    labels, _ = _check_y(Y, samples)
    shapes = ((2, samples[0].node_features.shape[1]), (2, 2, samples[0].edge_features.shape[1]))
    model = MarginalCRF(gradient_mode="implicit")
    group = range(len(samples))
    warm = worker_memory(samples, labels, group, model._objective(model.loss, "trw", *shapes))
    cold = worker_memory(samples, labels, group, model.set_params(inference_warm_start=False)._objective(
        model.loss, "trw", *shapes))
    # the messages of every image (2 E K float64), for two evaluations
    assert warm.total - cold.total == 2 * sum(2 * s.n_edges * 2 * 8 for s in samples)


@pytest.mark.parametrize("processes, n_workers", [(True, 2), (False, 1), (True, 1)],
                         ids=["processes", "threads", "one-process-two-threads"])
def test_warm_fits_on_dask_equal_local_fits(processes, n_workers):
    # one worker of two threads: its tasks share out both batches, parts of
    # one batch in each task, and each image's end comes back with its part
    distributed = pytest.importorskip("distributed")
    params = dict(gradient_mode="implicit", tol=1e-4, max_iter=3)
    local = _fit(**params)
    workers = dict(n_workers=n_workers, threads_per_worker=2 // n_workers)
    with distributed.LocalCluster(processes=processes, dashboard_address=None, **workers) as cluster:
        with distributed.Client(cluster):
            remote = _fit(n_jobs=2, backend="dask", **params)
    np.testing.assert_array_equal(remote.unary_coef_, local.unary_coef_)
    np.testing.assert_array_equal(remote.pairwise_coef_, local.pairwise_coef_)
    assert remote.n_inference_iter_ == local.n_inference_iter_


def test_a_warm_fit_survives_a_lost_worker_with_the_same_weights(tmp_path, monkeypatch):
    pytest.importorskip("psutil")
    from test_lost_worker import KillWorkerAt

    monkeypatch.setenv("JOBLIB_TEMP_FOLDER", str(tmp_path))
    params = dict(gradient_mode="implicit", tol=1e-4, max_iter=5, init="zeros")
    # the surviving worker wrote its ends of the failed evaluation: the
    # recomputation must start from the ends of the one before, as the lost one did
    with pytest.warns(WorkerLostWarning):
        model = _fit(n_jobs=2, callback=KillWorkerAt(("fit", 2)), **params)
    undisturbed = _fit(**params)
    np.testing.assert_array_equal(model.unary_coef_, undisturbed.unary_coef_)
    np.testing.assert_array_equal(model.pairwise_coef_, undisturbed.pairwise_coef_)
    assert list(tmp_path.iterdir()) == []
