"""Tests of sklearn_margcrf.metrics: plain functions and GridSearchCV scorers."""

import pickle
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import brier_score_loss, log_loss
from sklearn.model_selection import GridSearchCV

from estimator_checks import make_structured_data
from sklearn_margcrf.estimator import MarginalCRF
from sklearn_margcrf.metrics import (
    SCORERS,
    get_scorer,
    hamming_error,
    make_structured_scorer,
    marginal_brier_score,
    marginal_log_loss,
    neg_brier_score_scorer,
    neg_hamming_error_scorer,
    neg_log_loss_scorer,
    node_accuracy,
    node_accuracy_scorer,
)


def _random_marginals(shapes, n_states, rng):
    out = []
    for shape in shapes:
        p = rng.uniform(0.05, 1.0, size=shape + (n_states,))
        out.append(p / p.sum(axis=-1, keepdims=True))
    return out


def test_hamming_error_ignores_unlabelled_nodes():
    y_true = [np.array([0, 1, -1, 2]), np.array([[1, -1], [0, 0]])]
    y_pred = [np.array([0, 0, 2, 2]), np.array([[1, 1], [1, 0]])]
    # labelled: 3 + 3 nodes, wrong: 1 + 1
    assert hamming_error(y_true, y_pred) == pytest.approx(2 / 6)
    assert node_accuracy(y_true, y_pred) == pytest.approx(4 / 6)


def test_marginal_scores_match_sklearn_on_flattened_nodes():
    rng = np.random.default_rng(0)
    shapes = [(3, 4), (5,)]
    marginals = _random_marginals(shapes, 3, rng)
    y_true = [rng.integers(-1, 3, size=s) for s in shapes]
    labels = np.concatenate([y.ravel() for y in y_true])
    mu = np.concatenate([m.reshape(-1, 3) for m in marginals])
    observed = labels >= 0
    assert marginal_log_loss(y_true, marginals) == pytest.approx(
        log_loss(labels[observed], mu[observed], labels=[0, 1, 2])
    )
    expected_brier = np.mean(np.sum((mu[observed] - np.eye(3)[labels[observed]]) ** 2, axis=1))
    assert marginal_brier_score(y_true, marginals) == pytest.approx(expected_brier)
    # binary case: twice sklearn's Brier score of the positive class
    marginals2 = _random_marginals([(6,)], 2, rng)
    y2 = [np.array([0, 1, 1, 0, 1, 0])]
    assert marginal_brier_score(y2, marginals2) == pytest.approx(2 * brier_score_loss(y2[0], marginals2[0][:, 1]))


def test_perfect_and_clipped_marginals():
    y_true = [np.array([0, 1])]
    perfect = [np.array([[1.0, 0.0], [0.0, 1.0]])]
    assert marginal_log_loss(y_true, perfect) == 0.0
    assert marginal_brier_score(y_true, perfect) == 0.0
    wrong = [np.array([[0.0, 1.0], [1.0, 0.0]])]
    assert np.isfinite(marginal_log_loss(y_true, wrong))
    assert marginal_brier_score(y_true, wrong) == pytest.approx(2.0)


@pytest.mark.parametrize(
    "func, args, match",
    [
        (hamming_error, ([np.array([0, 1])], [np.array([0])]), "2 labels"),
        (hamming_error, ([np.array([0])], []), "1 samples"),
        (hamming_error, ([np.array([-1, -1])], [np.array([0, 1])]), "no labelled node"),
        (marginal_log_loss, ([np.array([0, 3])], [np.full((2, 2), 0.5)]), "label 3"),
        (marginal_log_loss, ([np.array([0, -2])], [np.full((2, 2), 0.5)]), "label -2"),
        (marginal_brier_score, ([np.array([0, 1])], [np.full(2, 0.5)]), "trailing axis"),
    ],
)
def test_bad_input(func, args, match):
    with pytest.raises(ValueError, match=match):
        func(*args)


@pytest.fixture(scope="module")
def fitted():
    X, y = make_structured_data(n_samples=4, n_states=3, hidden=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        estimator = MarginalCRF(n_iter=3, max_iter=5).fit(X, y)
    return estimator, X, y


def test_scorers_agree_with_functions_and_score(fitted):
    estimator, X, y = fitted
    proba = estimator.predict_proba(X)
    pred = estimator.predict(X)
    assert node_accuracy_scorer(estimator, X, y) == pytest.approx(estimator.score(X, y))
    assert neg_hamming_error_scorer(estimator, X, y) == pytest.approx(-hamming_error(y, pred))
    assert neg_log_loss_scorer(estimator, X, y) == pytest.approx(-marginal_log_loss(y, proba))
    assert neg_brier_score_scorer(estimator, X, y) == pytest.approx(-marginal_brier_score(y, proba))


def test_scorers_are_picklable_and_named():
    for name, scorer in SCORERS.items():
        assert get_scorer(name) is scorer
        restored = pickle.loads(pickle.dumps(scorer))
        assert repr(restored) == repr(scorer)
    with pytest.raises(ValueError, match="unknown structured scorer"):
        get_scorer("accuracy")
    with pytest.raises(ValueError, match="response_method"):
        make_structured_scorer(hamming_error, response_method="decision_function")


def test_scorers_in_grid_search_multimetric():
    X, y = make_structured_data(n_samples=6, hidden=0.1)
    search = GridSearchCV(
        MarginalCRF(n_iter=3, max_iter=3, n_states=2),
        {"inference": ["trw", "independent"]},
        cv=2,
        scoring={"acc": node_accuracy_scorer, "ll": neg_log_loss_scorer, "brier": neg_brier_score_scorer},
        refit="ll",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        search.fit(X, y)
    results = search.cv_results_
    assert np.all((results["mean_test_acc"] >= 0) & (results["mean_test_acc"] <= 1))
    assert np.all(results["mean_test_ll"] < 0)
    assert np.all((results["mean_test_brier"] <= 0) & (results["mean_test_brier"] >= -2))
    assert search.best_params_["inference"] in ("trw", "independent")


def test_scorer_on_plain_estimator_uses_predict_proba():
    class Constant:
        def predict_proba(self, X):
            return [np.full((len(x), 2), 0.5) for x in X]

    X = [np.zeros(4), np.zeros(2)]
    y = [np.array([0, 1, 1, -1]), np.array([1, 1])]
    assert neg_log_loss_scorer(Constant(), X, y) == pytest.approx(-np.log(2))
    assert neg_brier_score_scorer(Constant(), X, y) == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="sample_weight"):
        neg_log_loss_scorer(Constant(), X, y, sample_weight=np.ones(2))


def test_fractional_labels_are_rejected():
    from sklearn_margcrf.metrics import hamming_error

    with pytest.raises(ValueError, match="integer labels"):
        hamming_error([np.array([0.7, 1.0])], [np.array([0, 1])])


def test_scorers_on_a_pipeline_score_the_crf_nodes_like_pipeline_score():
    # With scale < 1 the CRF grid is coarser than the images: the scorers must
    # score its nodes, as Pipeline.score (GridSearchCV's default) does, not the
    # upsampled pixels of predict_proba.
    from sklearn.pipeline import make_pipeline

    from sklearn_margcrf.datasets import make_denoising_problem
    from sklearn_margcrf.features import DenoisingFeatures

    images, labels = make_denoising_problem(4, shape=(12, 14), noise=1.25, random_state=0)
    pipe = make_pipeline(DenoisingFeatures(scale=0.5), MarginalCRF(n_iter=3, max_iter=3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        pipe.fit(images[:2], labels[:2])
    test_images, test_labels = images[2:], labels[2:]
    assert node_accuracy_scorer(pipe, test_images, test_labels) == pytest.approx(pipe.score(test_images, test_labels))
    crf, grids = pipe[-1], pipe[:-1].transform(test_images)
    assert neg_log_loss_scorer(pipe, test_images, test_labels) == pytest.approx(neg_log_loss_scorer(crf, grids, test_labels))
    nested = make_pipeline(make_pipeline(pipe[0]), make_pipeline(crf))
    assert node_accuracy_scorer(nested, test_images, test_labels) == pytest.approx(pipe.score(test_images, test_labels))
    # the pixel-level score differs here, so the test can tell the two apart
    pixels = node_accuracy(test_labels, [np.argmax(p, axis=-1) for p in pipe.predict_proba(test_images)])
    assert pixels != pytest.approx(pipe.score(test_images, test_labels))
