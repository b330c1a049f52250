"""Tests of MarginalCRF: scikit-learn citizenship, learning, parallelism, bad input."""

import os
import re
import subprocess
import sys
import warnings

import joblib
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer
from sklearn.utils import estimator_checks as sk_checks

import sklearn_margcrf.estimator as estimator_module
from estimator_checks import make_structured_data, parametrize_with_checks
from sklearn_margcrf._graph import grid_edges
from sklearn_margcrf.features import split_by_orientation
from sklearn_margcrf._objective import CRFObjective
from sklearn_margcrf._parallel import ImageBatches
from sklearn_margcrf.estimator import MarginalCRF, _check_X, _check_y
from sklearn_margcrf.inference import infer
from sklearn_margcrf.metrics import hamming_error, neg_log_loss_scorer
from sklearn_margcrf.sample import CRFSample

FAST = dict(n_iter=3, max_iter=4)

CONFIGURATIONS = [
    MarginalCRF(**FAST),
    MarginalCRF(inference="independent", **FAST),
    MarginalCRF(loss="clique_logistic", inference="mean_field", gradient_mode="backprop", **FAST),
    MarginalCRF(loss="surrogate_likelihood", inference="lbp", **FAST),
    MarginalCRF(loss="smooth_classification", init="zeros", **FAST),
    MarginalCRF(loss="pseudolikelihood", **FAST),
    MarginalCRF(inference="exact", gradient_mode="implicit", **FAST),
]


def fit_quietly(estimator, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return estimator.fit(X, y)


# ---------------------------------------------------------------------------
# scikit-learn common checks that need no 2-D data, run directly
# ---------------------------------------------------------------------------

SKLEARN_CHECKS = [
    sk_checks.check_estimator_cloneable,
    sk_checks.check_estimator_repr,
    sk_checks.check_estimator_tags_renamed,
    sk_checks.check_valid_tag_types,
    sk_checks.check_no_attributes_set_in_init,
    sk_checks.check_parameters_default_constructible,
    sk_checks.check_get_params_invariance,
    sk_checks.check_set_params,
    sk_checks.check_do_not_raise_errors_in_init_or_set_params,
    sk_checks.check_mixin_order,
    sk_checks.check_estimators_unfitted,
]
if hasattr(sk_checks, "check_estimator_sparse_tag"):  # new in scikit-learn 1.6.1; we support 1.6.0
    SKLEARN_CHECKS.append(sk_checks.check_estimator_sparse_tag)


@pytest.mark.parametrize("check", SKLEARN_CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("estimator", CONFIGURATIONS[:3], ids=lambda e: f"{e.loss}-{e.inference}")
def test_sklearn_data_free_checks(estimator, check):
    check(type(estimator).__name__, clone(estimator))


@parametrize_with_checks(CONFIGURATIONS)
def test_structured_checks(estimator, check):
    check(estimator)


def test_tags_are_honest():
    tags = MarginalCRF().__sklearn_tags__()
    assert tags.input_tags.two_d_array is False
    assert tags.input_tags.allow_nan is False
    assert tags.target_tags.required is True
    assert tags.estimator_type == "classifier"
    assert tags.requires_fit is True


def test_not_fitted_error():
    X, _ = make_structured_data()
    estimator = MarginalCRF()
    with pytest.raises(NotFittedError):
        estimator.predict(X)
    with pytest.raises(NotFittedError):
        estimator.score(X, [np.zeros((4, 5), int)] * len(X))


# ---------------------------------------------------------------------------
# Model and learning
# ---------------------------------------------------------------------------


def test_chain_rule_gradient_matches_finite_differences():
    X, y = make_structured_data(n_samples=2, n_states=3, shape=(3, 4))
    samples, _, _ = _check_X(X)
    labels, classes = _check_y(y, samples)
    n_states = len(classes)
    rng = np.random.default_rng(0)
    F = rng.normal(size=(n_states, samples[0].node_features.shape[1]))
    G = rng.normal(size=(n_states, n_states, 2)) * 0.5
    objective = MarginalCRF(n_iter=5)._objective("univariate_logistic", "trw", F.shape, G.shape)
    w = objective.pack(F, G)
    with ImageBatches(samples, labels) as batches:
        def value(w):
            return objective.loss_gradient(w, batches, n_labelled=1, reg=0.0)[0]

        grad = objective.loss_gradient(w, batches, n_labelled=1, reg=0.0)[1]
        h = 1e-6
        for index in [0, 5, 10, F.size, F.size + 7, w.size - 1]:
            step = np.zeros_like(w)
            step[index] = h
            numeric = (value(w + step) - value(w - step)) / (2 * h)
            assert numeric == pytest.approx(grad[index], rel=1e-5, abs=1e-7)


def test_independent_model_is_multinomial_logistic_regression():
    X, y = make_structured_data(n_samples=3, n_states=3, hidden=0.2)
    reg = 1e-2
    estimator = MarginalCRF(inference="independent", reg=reg, max_iter=500, lbfgs_tol=1e-10).fit(X, y)
    features = np.concatenate([s[0] for s in X])
    labels = np.concatenate([lab.ravel() for lab in y])
    observed = labels >= 0
    reference = LogisticRegression(C=1.0 / (2 * reg * observed.sum()), fit_intercept=False, tol=1e-12, max_iter=5000)
    reference.fit(features[observed], labels[observed])
    np.testing.assert_allclose(estimator.unary_coef_, reference.coef_, atol=1e-4)
    assert np.all(estimator.pairwise_coef_ == 0)


def test_independent_surrogate_likelihood_is_the_logistic_loss():
    # With no edges the surrogate likelihood is the exact likelihood, i.e. the
    # univariate logistic loss: both routes must find the same weights.
    X, y = make_structured_data(n_samples=3, n_states=3)
    params = dict(inference="independent", max_iter=200, lbfgs_tol=1e-9, init="zeros")
    logistic = MarginalCRF(**params).fit(X, y)
    surrogate = MarginalCRF(loss="surrogate_likelihood", **params).fit(X, y)
    np.testing.assert_allclose(surrogate.unary_coef_, logistic.unary_coef_, atol=1e-5)


def test_fitted_attributes():
    X, y = make_structured_data(n_states=3)
    estimator = fit_quietly(MarginalCRF(**FAST), X, y)
    assert estimator.unary_coef_.shape == (3, 4)
    assert estimator.pairwise_coef_.shape == (3, 3, 2)
    assert estimator.n_states_ == 3
    np.testing.assert_array_equal(estimator.classes_, [0, 1, 2])
    assert estimator.n_node_features_ == 4 and estimator.n_edge_features_ == 2
    assert 0 < estimator.n_iter_ <= FAST["max_iter"]
    assert len(estimator.loss_curve_) == estimator.n_iter_
    assert estimator.fit_time_ > 0 and estimator.kernel_time_ > 0
    assert np.all(np.diff(estimator.loss_curve_) <= 1e-12)


def test_init_independent_starts_better_than_zeros():
    X, y = make_structured_data()
    independent = fit_quietly(MarginalCRF(n_iter=3, max_iter=2), X, y)
    zeros = fit_quietly(MarginalCRF(n_iter=3, max_iter=2, init="zeros"), X, y)
    assert independent.loss_curve_[0] < zeros.loss_curve_[0]


def _stages_seen(estimator, X, y):
    """(stage, n_iter) of every L-BFGS iteration of a fit, from its callback."""
    seen = []
    fit_quietly(estimator.set_params(callback=lambda progress: seen.append((progress.stage, progress.n_iter))), X, y)
    return seen


def test_smooth_classification_starts_from_surrogate_likelihood():
    X, y = make_structured_data()
    seen = _stages_seen(MarginalCRF(loss="smooth_classification", n_iter=2, max_iter=2), X, y)
    assert [stage for stage, n_iter in seen if n_iter == 1] == ["independent", "surrogate_likelihood", "fit"]
    seen = _stages_seen(MarginalCRF(loss="smooth_classification", n_iter=2, max_iter=2, init="zeros"), X, y)
    assert {stage for stage, _ in seen} == {"fit"}


def test_convergence_warning_when_max_iter_is_reached():
    X, y = make_structured_data()
    with pytest.warns(ConvergenceWarning, match="max_iter=1"):
        MarginalCRF(n_iter=2, max_iter=1).fit(X, y)


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_warnings_point_at_the_callers_line(n_jobs):
    # not at scikit-learn's fit wrapper or this package: the user sees the
    # line that called fit / predict, and module= filters work
    X, y = make_structured_data(n_samples=2)
    estimator = MarginalCRF(gradient_mode="backprop", inference_max_iter=2, init="zeros", max_iter=3, n_jobs=n_jobs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        estimator.fit(X, y)
        estimator.set_params(n_iter=None, tol=1e-12).predict(X)
    messages = {str(w.message).split(":")[0]: w.filename for w in caught}
    assert any(m.startswith("L-BFGS") for m in messages)  # ConvergenceWarning of the fit
    assert any(m.startswith("during fit") for m in messages)  # recorded in the workers
    assert any(m.startswith("inference did not reach") for m in messages)  # prediction
    assert set(messages.values()) == {__file__}, messages


def test_max_iter_zero_keeps_the_start():
    X, y = make_structured_data()
    zeros = MarginalCRF(max_iter=0, init="zeros").fit(X, y)
    assert np.all(zeros.unary_coef_ == 0) and zeros.n_iter_ == 0
    proba = zeros.predict_proba(X)[0]
    np.testing.assert_allclose(proba, 0.5)


def test_warm_start_continues_and_cold_start_resets():
    X, y = make_structured_data()
    warm = fit_quietly(MarginalCRF(n_iter=3, max_iter=3, warm_start=True), X, y)
    first_curve = list(warm.loss_curve_)
    fit_quietly(warm, X, y)
    assert warm.loss_curve_[0] < first_curve[0]  # continued from the previous weights
    cold = fit_quietly(MarginalCRF(n_iter=3, max_iter=3), X, y)
    fit_quietly(cold, X, y)
    assert cold.loss_curve_ == pytest.approx(first_curve)
    # warm start with incompatible shapes: starts afresh, with a warning
    X3, y3 = make_structured_data(n_states=3)
    with pytest.warns(UserWarning, match="warm_start"):
        fit_quietly(warm, X3, y3)
    assert warm.n_states_ == 3


def test_lbfgs_restarts_after_abnormal_line_search(monkeypatch):
    real_minimize = estimator_module.scipy.optimize.minimize
    calls = []

    def flaky_minimize(fun, x0, **kwargs):
        calls.append(kwargs["options"]["maxiter"])
        if len(calls) == 1:
            options = dict(kwargs["options"], maxiter=2)
            result = real_minimize(fun, x0, **dict(kwargs, options=options))
            result.status = 2
            result.message = "ABNORMAL: bad search direction (simulated)"
            return result
        return real_minimize(fun, x0, **kwargs)

    monkeypatch.setattr(estimator_module.scipy.optimize, "minimize", flaky_minimize)
    X, y = make_structured_data()
    estimator = fit_quietly(MarginalCRF(inference="independent", max_iter=50, init="zeros"), X, y)
    assert estimator.n_restarts_ == 1
    assert calls == [50, 48]
    assert estimator.n_iter_ > 2


def test_incremental_schedule_doubles_images_and_halves_iterations():
    X, y = make_structured_data(n_samples=7)
    params = dict(incremental=2, max_iter=8, random_state=0, n_iter=2, init="zeros", lbfgs_tol=0.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        estimator = MarginalCRF(**params)
        seen = _stages_seen(estimator, X, y)
    last = {}
    for stage, n_iter in seen:
        last[stage] = n_iter
    assert list(last) == ["fit[2 images]", "fit[4 images]", "fit"]
    assert last["fit[2 images]"] <= 8 and last["fit[4 images]"] <= 4 and last["fit"] <= 2
    # intermediate stages stop at their iteration cap without a warning
    assert not any("images]" in str(w.message) for w in caught)
    assert estimator.n_iter_ == len(estimator.loss_curve_) == sum(last.values())
    # the subsets are drawn from random_state
    again = fit_quietly(MarginalCRF(**params), X, y)
    assert again.loss_curve_ == estimator.loss_curve_
    other = fit_quietly(MarginalCRF(**dict(params, random_state=2)), X, y)
    assert other.loss_curve_[0] != estimator.loss_curve_[0]
    # more images in the first stage than in X: one stage with all of them
    assert {stage for stage, _ in _stages_seen(MarginalCRF(incremental=10, max_iter=2, n_iter=2), X, y)} == {"independent", "fit"}


def test_verbose_reports_objective_gradient_and_time(capsys):
    X, y = make_structured_data()
    fit_quietly(MarginalCRF(n_iter=2, max_iter=2, verbose=1), X, y)
    out = capsys.readouterr().out
    assert re.search(r"fit iter +1 +objective [0-9.e+-]+ +\|grad\| [0-9.e+-]+ +time [0-9.]+s", out)
    fit_quietly(MarginalCRF(n_iter=2, max_iter=2), X, y)
    assert capsys.readouterr().out == ""


def test_predict_shapes_follow_the_sample():
    X, y = make_structured_data(n_samples=2, shape=(4, 6))
    estimator = fit_quietly(MarginalCRF(**FAST), X, y)
    nf, edges, ef = X[0]
    image_sample = CRFSample(nf, edges, ef, grid_shape=(4, 6), image_shape=(8, 12))
    flat_sample = (nf, edges, ef)
    pred_image, pred_flat, pred_grid = estimator.predict([image_sample, flat_sample, X[0]])
    assert pred_image.shape == (8, 12) and pred_flat.shape == (24,) and pred_grid.shape == (4, 6)
    proba_image = estimator.predict_proba([image_sample])[0]
    assert proba_image.shape == (8, 12, 2)
    np.testing.assert_array_equal(pred_grid.ravel(), pred_flat)
    # labels at image size are reduced to the grid; score is over nodes
    big_labels = np.kron(np.where(y[0] < 0, 0, y[0]), np.ones((2, 2), dtype=int))
    assert estimator.score([image_sample], [big_labels]) == estimator.score([X[0]], [np.where(y[0] < 0, 0, y[0])])


def test_score_is_one_minus_hamming_error_over_labelled_nodes():
    X, y = make_structured_data(hidden=0.3)
    estimator = fit_quietly(MarginalCRF(**FAST), X, y)
    assert estimator.score(X, y) == pytest.approx(1 - hamming_error(y, estimator.predict(X)))


def test_truncated_prediction_uses_n_iter():
    X, y = make_structured_data(n_samples=2)

    def expected(model, **kwargs):
        nf, edges, ef = X[0]
        unary = nf @ model.unary_coef_.T
        pairwise = (ef @ model.pairwise_coef_.reshape(4, -1).T).reshape(-1, 2, 2)
        return infer(edges, unary, pairwise, **kwargs).unary

    truncated = fit_quietly(MarginalCRF(n_iter=4, max_iter=1, tol=1e-3), X, y)
    np.testing.assert_allclose(truncated.predict_proba(X[:1])[0].reshape(-1, 2),
                               expected(truncated, method="trw", n_iter=4), atol=1e-12)
    backprop = fit_quietly(MarginalCRF(gradient_mode="backprop", inference="mean_field", max_iter=1, tol=1e-3), X, y)
    np.testing.assert_allclose(backprop.predict_proba(X[:1])[0].reshape(-1, 2),
                               expected(backprop, method="mean_field", tol=1e-3), atol=1e-12)


# ---------------------------------------------------------------------------
# Pipeline and grid search
# ---------------------------------------------------------------------------


def _images(n, size=6, seed=0):
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for _ in range(n):
        x = np.zeros((size, size), dtype=np.int64)
        r, c = rng.integers(0, size // 2, size=2)
        x[r : r + size // 2, c : c + size // 2] = 1
        images.append(np.clip(x + rng.normal(scale=0.7, size=x.shape), -2, 3))
        labels.append(x)
    return images, labels


def images_to_samples(images):
    samples = []
    for image in images:
        height, width = image.shape
        edges = grid_edges(height, width)
        edge_features = np.zeros((len(edges), 2))
        edge_features[: height * (width - 1), 0] = 1
        edge_features[height * (width - 1) :, 1] = 1
        node_features = np.stack([np.ones(image.size), image.ravel()], axis=1)
        samples.append(CRFSample(node_features, edges, edge_features, grid_shape=image.shape))
    return samples


def test_pipeline_in_grid_search_over_loss_and_inference():
    images, labels = _images(6)
    pipe = Pipeline([("features", FunctionTransformer(images_to_samples)), ("crf", MarginalCRF(n_iter=3, max_iter=3, n_states=2))])
    grid = {
        "crf__loss": ["univariate_logistic", "surrogate_likelihood"],
        "crf__inference": ["trw", "mean_field", "independent"],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        search = GridSearchCV(pipe, grid, cv=2).fit(images, labels)
        search_ll = GridSearchCV(pipe, {"crf__inference": ["trw", "independent"]}, cv=2, scoring=neg_log_loss_scorer)
        search_ll.fit(images, labels)
    assert len(search.cv_results_["params"]) == 6
    assert np.all(np.isfinite(search.cv_results_["mean_test_score"]))
    predictions = search.best_estimator_.predict(images[:2])
    assert [p.shape for p in predictions] == [(6, 6), (6, 6)]
    assert search.score(images, labels) > 0.5
    assert np.all(search_ll.cv_results_["mean_test_score"] < 0)


# ---------------------------------------------------------------------------
# Synthetic binary denoising (paper, Sec. "Binary Denoising Data")
# ---------------------------------------------------------------------------


def make_denoising(n_images, size=24, noise=1.25, seed=0):
    """Piecewise-constant binary images (a 2 x 2 checkerboard of blocks with a
    random rectangle flipped: about half the pixels are 1) and the paper's
    noise y = x (1 - t^n) + (1 - x) t^n with t uniform; unary features [1, y],
    edge features [horizontal, vertical]. The best independent classifier
    thresholds y at 1/2 and errs on P(t^n > 1/2) = 1 - 2^(-1/n), 43% for
    n = 1.25."""
    rng = np.random.default_rng(seed)
    edges = grid_edges(size, size)
    edge_features = split_by_orientation(np.ones((len(edges), 1)), (size, size))
    X, y = [], []
    for k in range(n_images):
        blocks = np.array([[0, 1], [1, 0]]) ^ (k % 2)
        x = np.kron(blocks, np.ones((size // 2, size // 2), dtype=np.int64))
        h, w = rng.integers(size // 4, size // 2 + 1, size=2)
        r0, c0 = rng.integers(0, size - h + 1), rng.integers(0, size - w + 1)
        x[r0 : r0 + h, c0 : c0 + w] ^= 1
        t = rng.uniform(size=x.shape)
        noisy = x * (1 - t**noise) + (1 - x) * t**noise
        node_features = np.stack([np.ones(x.size), noisy.ravel()], axis=1)
        X.append(CRFSample(node_features, edges, edge_features, grid_shape=x.shape))
        y.append(x)
    return X, y


DENOISING_LOSSES = ["univariate_logistic", "clique_logistic", "univariate_quadratic", "smooth_classification"]


@pytest.fixture(scope="module")
def denoising_scores():
    """Train and test accuracy of each model on 8 + 8 noisy 24 x 24 images (n = 1.25)."""
    (X, y), (X_test, y_test) = make_denoising(8, seed=0), make_denoising(8, seed=1)
    models = {"independent": MarginalCRF(inference="independent")}
    for loss in ["surrogate_likelihood"] + DENOISING_LOSSES:
        models[loss] = MarginalCRF(loss=loss, n_iter=10, max_iter=25)
    scores = {}
    for name, model in models.items():
        fit_quietly(model, X, y)
        scores[name] = (model.score(X, y), model.score(X_test, y_test))
    return scores


def test_denoising_trw_beats_independent_by_a_wide_margin(denoising_scores):
    train, test = denoising_scores["univariate_logistic"]
    train_independent, test_independent = denoising_scores["independent"]
    assert test_independent < 0.65  # close to the best independent rate, 0.57
    assert test > test_independent + 0.1
    assert train > train_independent + 0.1


@pytest.mark.parametrize("loss", DENOISING_LOSSES)
def test_denoising_marginal_losses_not_worse_than_surrogate_likelihood(denoising_scores, loss):
    assert denoising_scores[loss][1] >= denoising_scores["surrogate_likelihood"][1] - 0.015


# ---------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------

_BACKEND_SEQUENCE_SCRIPT = """
import contextlib, sys, warnings
import joblib, numpy as np
sys.path.insert(0, {tests!r})
from estimator_checks import make_structured_data
from sklearn_margcrf import MarginalCRF

X, y = make_structured_data(n_samples=5)
weights = []
for backend, n_jobs in [("loky", 2), ("threading", 2), ("multiprocessing", 2), ("sequential", 2), (None, 1), ("loky", 3),
                        ("threading", 3), ("loky", 2)]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with joblib.parallel_config(backend=backend) if backend else contextlib.nullcontext():
            model = MarginalCRF(n_iter=3, max_iter=3, n_jobs=n_jobs).fit(X, y)
    weights.append(np.concatenate([model.unary_coef_.ravel(), model.pairwise_coef_.ravel()]))
print(max(float(np.abs(w - weights[0]).max()) for w in weights))
"""


def test_weights_are_bitwise_equal_across_backends_in_one_process():
    # A fresh process, because the bug this guards against depended on the
    # process's history: after a threading-backend fit, scipy's multithreaded
    # BLAS made L-BFGS round differently (1e-14) in every later fit.
    script = _BACKEND_SEQUENCE_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=True)
    assert float(out.stdout.split()[-1]) == 0.0, out.stdout


# ---------------------------------------------------------------------------
# Dask
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("processes", [True, False], ids=["processes", "threads"])
def test_dask_fit_equals_local_fit(processes):
    distributed = pytest.importorskip("distributed")
    X, y = make_structured_data(n_samples=5)
    batch_keys = []

    def record_batches(progress):
        held = distributed.get_client().has_what()
        # (a set: Dask may copy a batch to the other worker, which is not packing it again);
        # packed from this process's images ("pack-"), or regrouped on the cluster when images move
        batch_keys.append(sorted({key for keys in held.values() for key in keys
                                  if str(key).startswith(("pack-", "_regroup-"))}))

    params = dict(n_iter=3, max_iter=4)
    local = fit_quietly(MarginalCRF(**params), X, y)
    # two one-thread processes, or one process with two threads
    workers = dict(n_workers=2, threads_per_worker=1) if processes else dict(n_workers=1, threads_per_worker=2)
    with distributed.LocalCluster(processes=processes, dashboard_address=None, **workers) as cluster:
        with distributed.Client(cluster):
            with joblib.parallel_config(backend="dask"):
                remote = fit_quietly(MarginalCRF(callback=record_batches, **params), X, y)
                proba = remote.predict_proba(X)
    # the images are packed once per fit: no packing (from this process)
    # after the first iteration (moves between batches are regroupings)
    packed = {key for key in batch_keys[0] if str(key).startswith("pack-")}
    assert len(batch_keys) > 2 and batch_keys[0]
    assert all({key for key in keys if str(key).startswith("pack-")} <= packed for keys in batch_keys)
    np.testing.assert_array_equal(remote.unary_coef_, local.unary_coef_)
    np.testing.assert_array_equal(remote.pairwise_coef_, local.pairwise_coef_)
    for a, b in zip(proba, local.predict_proba(X)):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


@pytest.fixture
def data():
    return make_structured_data(n_samples=2, hidden=0)


def _replace(sample, index, value):
    parts = list(sample)
    parts[index] = value
    return CRFSample(*parts, grid_shape=sample.grid_shape)


def test_x_and_y_lengths_differ(data):
    X, y = data
    with pytest.raises(ValueError, match="different lengths.*2 samples.*1 label"):
        MarginalCRF().fit(X, y[:1])


@pytest.mark.parametrize("bad, match", [(2, r"label 2 but n_states=2"), (-2, r"label -2.*>= 0, or -1")])
def test_labels_out_of_range(data, bad, match):
    X, y = data
    y = [lab.copy() for lab in y]
    y[1][0, 0] = bad
    with pytest.raises(ValueError, match=match):
        MarginalCRF(n_states=2).fit(X, y)


def test_label_count_differs_from_node_count(data):
    X, y = data
    with pytest.raises(ValueError, match=r"y\[1\].*label count"):
        MarginalCRF().fit(X, [y[0], y[1].ravel()[:-1]])


def test_non_integer_labels(data):
    X, y = data
    with pytest.raises(ValueError, match="integer labels"):
        MarginalCRF().fit(X, [y[0] + 0.5, y[1]])


@pytest.mark.parametrize("index, name", [(0, "node_features"), (2, "edge_features")])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_nan_or_inf_features(data, index, name, value):
    X, y = data
    features = np.array(X[1][index], dtype=float)
    features[1, 1] = value
    X = [X[0], _replace(X[1], index, features)]
    with pytest.raises(ValueError, match=rf"X\[1\] {name} contains NaN or infinite"):
        MarginalCRF().fit(X, y)


def test_edge_indices_out_of_range(data):
    X, y = data
    edges = X[1][1].copy()
    edges[3, 1] = 20
    X = [X[0], _replace(X[1], 1, edges)]
    with pytest.raises(ValueError, match=r"X\[1\].*node indices.*20.*only 20 nodes"):
        MarginalCRF().fit(X, y)


def test_edge_feature_rows_differ_from_edge_count(data):
    X, y = data
    X = [X[0], _replace(X[1], 2, X[1][2][:-1])]
    with pytest.raises(ValueError, match=r"X\[1\] has 31 edges but edge_features has 30 rows"):
        MarginalCRF().fit(X, y)


def test_feature_dimensions_at_predict_differ_from_fit(data):
    X, y = data
    estimator = fit_quietly(MarginalCRF(**FAST), X, y)
    nf, edges, ef = X[0]
    with pytest.raises(ValueError, match="2 node features but fit had 3"):
        estimator.predict([(nf[:, :2], edges, ef)])
    with pytest.raises(ValueError, match="3 edge features but fit had 2"):
        estimator.predict_proba([(nf, edges, np.hstack([ef, ef[:, :1]]))])


def test_feature_dimensions_differ_between_samples(data):
    X, y = data
    nf, edges, ef = X[1]
    with pytest.raises(ValueError, match=r"X\[1\] has 4 node features but X\[0\] had 3"):
        MarginalCRF().fit([X[0], (np.hstack([nf, nf[:, :1]]), edges, ef)], [y[0], y[1].ravel()])


@pytest.mark.parametrize("param", ["loss", "inference", "gradient_mode", "init"])
def test_unknown_names(data, param):
    X, y = data
    with pytest.raises(ValueError, match=rf"'{param}' parameter of MarginalCRF must be"):
        MarginalCRF(**{param: "nonsense"}).fit(X, y)


@pytest.mark.parametrize(
    "params, match",
    [
        (dict(gradient_mode="implicit", inference="mean_field"), "implicit.*mean_field"),
        (dict(gradient_mode="truncated", inference="exact"), "truncated.*exact"),
        (dict(gradient_mode="backprop", inference="exact"), "backprop.*exact"),
    ],
)
def test_unsupported_combination_fails_before_any_work(params, match):
    # X and y that validation would refuse: the combination is checked first
    with pytest.raises(ValueError, match=f"unsupported combination.*{match}"):
        MarginalCRF(**params).fit(None, None)


@pytest.mark.parametrize("params", [dict(n_iter=-1), dict(tol=0), dict(reg=-1.0), dict(alpha=0), dict(n_states=1), dict(sides=3), dict(rho=-0.5), dict(rho="nope"),
                                    dict(rho=5e-324), dict(multiplier=1e-12)])
def test_bad_parameter_values(data, params):
    X, y = data
    with pytest.raises(ValueError, match=f"'{next(iter(params))}' parameter"):
        MarginalCRF(**params).fit(X, y)


def test_overflowing_potentials_name_the_features_not_a_unary(data):
    # finite features whose products with the weights overflow: the error
    # must speak of the features and weights the user gave
    X, y = data
    huge = [CRFSample(s[0] * 1e160, s[1], s[2] * 1e160, grid_shape=getattr(s, "grid_shape", None)) for s in X]
    with pytest.raises(FloatingPointError, match="overflowed.*rescale the features"):
        MarginalCRF(n_iter=2, max_iter=3, init="zeros").fit(huge, y)


def test_complex_features_are_refused(data):
    X, y = data
    bad = [CRFSample(s[0] + 1j, s[1], s[2]) for s in X]
    with pytest.raises(TypeError, match="node_features must be an array of real numbers"):
        MarginalCRF(n_iter=2, max_iter=1).fit(bad, y)


@pytest.mark.parametrize(
    "shapes",
    [
        dict(grid_shape=(-4, -4)),  # (-4) * (-4) is the node count all the same
        dict(grid_shape=(4.9, 4.2)),
        dict(grid_shape=(4, 4), image_shape=(0, 0)),
        dict(grid_shape=(4, 4), image_shape=(-8, -8)),
        dict(grid_shape=(4, 4), image_shape=(8, 8, 3)),
    ],
)
def test_crf_sample_rejects_shapes_that_are_not_two_positive_integers(shapes):
    with pytest.raises(ValueError, match="must be a pair of integers >= 1"):
        CRFSample(np.ones((16, 2)), grid_edges(4, 4), np.ones((24, 1)), **shapes)


def test_crf_sample_accepts_numpy_integer_shapes():
    sample = CRFSample(np.ones((16, 2)), grid_edges(4, 4), np.ones((24, 1)),
                       grid_shape=np.array([4, 4]), image_shape=(np.int32(8), 8))
    assert sample.grid_shape == (4, 4) and sample.image_shape == (8, 8)


def test_x_is_not_a_list_of_samples(data):
    _, y = data
    with pytest.raises(TypeError, match="list of samples"):
        MarginalCRF().fit(np.zeros((2, 3)), y)
    with pytest.raises(TypeError, match="triple"):
        MarginalCRF().fit([np.zeros(2), np.zeros(2)], y)
    with pytest.raises(ValueError, match="empty"):
        MarginalCRF().fit([], [])


def test_all_labels_hidden(data):
    X, y = data
    with pytest.raises(ValueError, match="no labelled node"):
        MarginalCRF().fit(X, [np.full_like(lab, -1) for lab in y])


def test_inputs_are_not_mutated_and_read_only_ok(data):
    X, y = data
    for sample in X:
        for array in sample:
            array.flags.writeable = False
    for lab in y:
        lab.flags.writeable = False
    estimator = fit_quietly(MarginalCRF(**FAST), X, y)
    estimator.predict(X)
    assert estimator.score(X, y) > 0.5


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_time_curve_follows_the_loss_curve():
    rng = np.random.default_rng(3)
    edges = grid_edges(5, 5)
    X = [(np.c_[np.ones(25), rng.normal(size=25)], edges, np.ones((len(edges), 1))) for _ in range(2)]
    y = [rng.integers(0, 2, 25) for _ in range(2)]
    est = MarginalCRF(n_iter=3, max_iter=5).fit(X, y)
    assert len(est.time_curve_) == len(est.loss_curve_) == est.n_iter_
    assert np.all(np.diff(est.time_curve_) >= 0)
    assert 0 <= est.time_curve_[0] and est.time_curve_[-1] <= est.fit_time_


@pytest.mark.parametrize(
    "params,match",
    [
        (dict(loss="clique_logistic", inference="independent"), "no clique terms"),
        (dict(n_jobs=0), "n_jobs"),
    ],
)
def test_rejected_before_any_work(params, match):
    edges = grid_edges(3, 3)
    X = [(np.ones((9, 1)), edges, np.ones((len(edges), 1)))]
    with pytest.raises(ValueError, match=match):
        MarginalCRF(**params).fit(X, [np.zeros(9, dtype=int)])


@pytest.mark.parametrize("backend", ["loky", "threading"])
def test_per_image_diagnostics_are_one_warning_per_kind_per_fit(backend):
    # inference capped at 2 iterations: back-propagation at unconverged messages
    X, y = make_structured_data()
    reported = []
    for n_jobs in [1, 2]:
        est = MarginalCRF(gradient_mode="backprop", inference_max_iter=2, init="zeros", max_iter=3, n_jobs=n_jobs)
        with warnings.catch_warnings(record=True) as caught, joblib.parallel_config(backend=backend):
            warnings.simplefilter("always")
            est.fit(X, y)
            est.predict(X)
        from_fit = [str(w.message) for w in caught if str(w.message).startswith("during fit")]
        assert len(from_fit) == 1 and "did not converge" in from_fit[0]
        assert re.search(r"in \d+ of \d+ per-image gradient computations", from_fit[0])
        assert any(issubclass(w.category, ConvergenceWarning) and "marginals are not converged" in str(w.message)
                   for w in caught)
        reported.append(from_fit)
    assert reported[0] == reported[1]


def _as_float32(X):
    return [
        CRFSample(s.node_features.astype(np.float32), s.edges, s.edge_features.astype(np.float32), grid_shape=s.grid_shape)
        for s in X
    ]


@pytest.mark.parametrize("inference", ["trw", "independent"])
def test_float32_features_are_kept_and_fit_like_float64(inference):
    # The features are exactly representable in both precisions after the
    # cast, so the two fits see the same numbers and must agree to round-off
    # of the float64 arithmetic (the batches are not upcast as a whole).
    X, y = make_structured_data(n_samples=3, n_states=3)
    X32 = _as_float32(X)
    X64 = [CRFSample(s.node_features.astype(np.float64), s.edges, s.edge_features.astype(np.float64),
                     grid_shape=s.grid_shape) for s in X32]
    samples, _, _ = _check_X(X32)
    assert all(s.node_features.dtype == np.float32 and s.edge_features.dtype == np.float32 for s in samples)
    assert all(s.node_features is x.node_features for s, x in zip(samples, X32))  # not copied
    params = dict(inference=inference, n_iter=5, max_iter=30, lbfgs_tol=1e-10)
    a = MarginalCRF(**params)
    b = MarginalCRF(**params)
    fit_quietly(a, X64, y)
    fit_quietly(b, X32, y)
    np.testing.assert_allclose(b.unary_coef_, a.unary_coef_, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(b.pairwise_coef_, a.pairwise_coef_, rtol=1e-7, atol=1e-9)
    for p, q in zip(b.predict_proba(X32), a.predict_proba(X64)):
        assert p.dtype == np.float64
        np.testing.assert_allclose(p, q, atol=1e-10)


def _warning_fit(backend, n_jobs=2):
    X, y = make_structured_data()
    with joblib.parallel_config(backend=backend):
        return MarginalCRF(gradient_mode="backprop", inference_max_iter=2, init="zeros", max_iter=3,
                           n_jobs=n_jobs).fit(X, y)


def test_threading_backend_fit_leaves_the_process_warnings_intact():
    # catch_warnings is process-wide: entered and left in several threads at
    # once, it restored another thread's state, so warnings (the fit's own
    # included) went to a dead list, for the rest of the process.
    show, filters = warnings.showwarning, list(warnings.filters)
    for _ in range(3):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _warning_fit("threading")
            warnings.warn("after the fit", UserWarning)
        messages = [str(w.message) for w in caught]
        assert any(m.startswith("during fit") for m in messages), messages
        assert any(issubclass(w.category, ConvergenceWarning) for w in caught), messages
        assert messages[-1] == "after the fit"
    _warning_fit("threading")  # without a catch_warnings around it
    # sklearn.utils.parallel re-installs the caller's filters in every task
    # (compiling their module patterns): the same filters, written differently
    assert warnings.showwarning is show and _comparable(warnings.filters) == _comparable(filters)


def _comparable(filters):
    return [tuple(getattr(part, "pattern", part) for part in f) for f in filters]


def test_prediction_warnings_reach_the_caller_under_process_backends():
    X, y = make_structured_data(n_samples=4, shape=(6, 6))
    est = fit_quietly(MarginalCRF(n_iter=3, max_iter=2), X, y)
    est.unary_coef_ = est.unary_coef_ * 1000  # messages at the floor
    est.pairwise_coef_ = np.zeros_like(est.pairwise_coef_)
    est.pairwise_coef_[0, 0] = est.pairwise_coef_[1, 1] = 2000
    reported = []
    for n_jobs in [1, 2]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            est.set_params(n_jobs=n_jobs).predict(X)
        reported.append([str(w.message) for w in caught if "at the floor" in str(w.message)])
    assert len(reported[0]) == 1 and "during prediction" in reported[0][0]
    assert "floor 1e-300 of float64" in reported[0][0] and "690 * rho" in reported[0][0]
    assert "dtype=numpy.float64" not in reported[0][0]  # the remedy of float32 fits only
    assert reported[1] == reported[0]


def test_float32_floor_warning_of_a_fit_names_float32s_floor_and_range():
    """Between float32's range (85 * rho) and float64's (690 * rho) only a
    float32 fit floors its messages; its warning says so, with the remedy."""
    X, y = make_structured_data(n_samples=2, shape=(4, 4))
    est = fit_quietly(MarginalCRF(n_iter=3, max_iter=2), X, y)
    unary_coef = np.zeros_like(est.unary_coef_)
    pairwise_coef = np.zeros_like(est.pairwise_coef_)
    assert all(np.all(x.edge_features.sum(axis=1) == 1) for x in X)  # horizontal / vertical indicators
    pairwise_coef[0, 0, :] = 150.0  # theta_ij(0, 0) = 150 on every edge: messages favour 0 by about exp(150 / rho)
    messages = {}
    for dtype in (np.float32, np.float64):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            MarginalCRF(n_iter=3, max_iter=1, dtype=dtype).fit(
                X, y, unary_coef_init=unary_coef, pairwise_coef_init=pairwise_coef)
        messages[dtype] = [str(w.message) for w in caught if "at the floor" in str(w.message)]
    assert messages[np.float64] == []
    assert len(messages[np.float32]) == 1
    assert "floor 1e-37 of float32" in messages[np.float32][0] and "85 * rho" in messages[np.float32][0]
    assert "dtype=numpy.float64" in messages[np.float32][0]
