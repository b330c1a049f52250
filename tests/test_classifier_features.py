"""ClassifierFeatures: a per-pixel classifier's cross-fitted log-probabilities
as node features, before MarginalCRF."""

import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.dummy import DummyClassifier
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import make_pipeline

from estimator_checks import make_structured_data
from sklearn_margcrf import CRFSample, MarginalCRF
from sklearn_margcrf.features import MIN_PROBABILITY, ClassifierFeatures


def _nodes(X, y, indices):
    """Stacked node features and labels of the labelled nodes of samples ``indices``."""
    features = np.concatenate([X[k][0][np.ravel(y[k]) >= 0] for k in indices])
    labels = np.concatenate([np.ravel(y[k])[np.ravel(y[k]) >= 0] for k in indices])
    return features, labels


def test_fit_transform_is_cross_fitted_over_images_and_transform_uses_all_data():
    X, y = make_structured_data(n_samples=4, n_states=3, hidden=0.2)
    features = ClassifierFeatures(LogisticRegression(), cv=2)
    out = features.fit_transform(X, y)
    for train, test in KFold(2).split(np.zeros((4, 1))):
        fold = LogisticRegression().fit(*_nodes(X, y, train))
        for k in test:
            np.testing.assert_allclose(out[k].node_features, np.log(fold.predict_proba(X[k][0])), rtol=1e-6)
    full = LogisticRegression().fit(*_nodes(X, y, range(4)))
    np.testing.assert_allclose(features.estimator_.coef_, full.coef_)
    for sample, new in zip(X, features.transform(X)):
        np.testing.assert_allclose(new.node_features, np.log(full.predict_proba(sample[0])), rtol=1e-6)
    np.testing.assert_array_equal(features.classes_, [0, 1, 2])


def test_cross_fitting_hides_the_classifiers_overfitting():
    # random features and labels: a 1-nearest-neighbour classifier recalls
    # every training pixel, and knows nothing about other images
    rng = np.random.default_rng(0)
    X, y = make_structured_data(n_samples=6, hidden=0.0)
    X = [CRFSample(rng.normal(size=s[0].shape), s[1], s[2], grid_shape=s.grid_shape) for s in X]
    y = [rng.integers(0, 2, size=lab.shape) for lab in y]
    features = ClassifierFeatures(KNeighborsClassifier(n_neighbors=1), cv=3)

    def accuracy(samples):
        return np.mean([np.mean(np.argmax(s[0], axis=1) == np.ravel(lab)) for s, lab in zip(samples, y)])

    assert accuracy(features.fit(X, y).transform(X)) == 1.0  # what a CRF fitted on transform would see
    assert accuracy(features.fit_transform(X, y)) < 0.7  # what it sees: chance, as on new images


def test_graph_is_kept_and_unlabelled_nodes_are_ignored():
    X, y = make_structured_data(n_samples=3, hidden=0.3)
    out = ClassifierFeatures(DummyClassifier(strategy="prior"), cv=3).fit(X, y).transform(X)
    labelled = np.concatenate([np.ravel(lab)[np.ravel(lab) >= 0] for lab in y])
    prior = np.bincount(labelled) / labelled.size
    for sample, new in zip(X, out):
        assert new.edges is sample.edges and new.edge_features is sample.edge_features
        assert new.grid_shape == sample.grid_shape and new.image_shape == sample.image_shape
        np.testing.assert_allclose(new.node_features, np.tile(np.log(prior), (sample[0].shape[0], 1)))


def test_a_fold_without_a_class_gets_the_floor():
    X, y = make_structured_data(n_samples=3, n_states=3, hidden=0.0)
    y = [np.zeros_like(y[0]), np.ones_like(y[1]), np.full_like(y[2], 2)]
    splits = [([0, 1], [2]), ([1, 2], [0]), ([0, 2], [1])]
    out = ClassifierFeatures(DummyClassifier(strategy="prior"), cv=splits).fit_transform(X, y)
    for k in range(3):
        np.testing.assert_allclose(out[k].node_features[:, k], np.log(MIN_PROBABILITY))
        np.testing.assert_allclose(np.delete(out[k].node_features, k, axis=1), np.log(0.5))


def test_in_a_pipeline_before_the_crf_from_images():
    pytest.importorskip("skimage", reason="the image features use scikit-image")
    from sklearn_margcrf.datasets import make_denoising_problem
    from sklearn_margcrf.features import DenoisingFeatures

    images, labels = make_denoising_problem(6, shape=(12, 14), noise=1.25, random_state=0)
    pipe = make_pipeline(
        DenoisingFeatures(scale=0.5), ClassifierFeatures(LogisticRegression(), cv=2), MarginalCRF(n_iter=3, max_iter=3)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        pipe.fit(images[:4], labels[:4])  # labels at image size, reduced to the grid
    assert [p.shape for p in pipe.predict(images[4:])] == [(12, 14)] * 2
    assert 0.5 < pipe.score(images[4:], labels[4:]) <= 1.0
    assert pipe[-1].unary_coef_.shape == (2, 2)
    assert list(pipe[:-1].get_feature_names_out()) == ["log_proba(0)", "log_proba(1)"]
    edge_names = pipe[0].get_edge_feature_names_out()
    assert list(pipe[1].get_edge_feature_names_out(edge_names)) == ["horizontal:1", "vertical:1"]
    assert list(pipe[1].get_edge_feature_names_out()) == ["edge[0]", "edge[1]"]


def test_in_grid_search():
    X, y = make_structured_data(n_samples=6, hidden=0.1)
    pipe = make_pipeline(ClassifierFeatures(LogisticRegression()), MarginalCRF(n_iter=2, max_iter=2, n_states=2))
    search = GridSearchCV(
        pipe, {"classifierfeatures__estimator__C": [0.1, 10.0], "classifierfeatures__cv": [2, 3]}, cv=2
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        search.fit(X, y)
    assert np.all(np.isfinite(search.cv_results_["mean_test_score"]))
    assert search.best_estimator_[0].estimator_.C == search.best_params_["classifierfeatures__estimator__C"]


def test_sklearn_conventions_and_errors():
    features = ClassifierFeatures(LogisticRegression(C=2.0), cv=3)
    assert clone(features).get_params()["estimator__C"] == 2.0
    assert not hasattr(features, "estimator_")
    X, y = make_structured_data(n_samples=2)
    with pytest.raises(NotFittedError):
        features.transform(X)
    with pytest.raises(ValueError, match="3 folds but X has 2"):
        features.fit_transform(X, y)
    with pytest.raises(ValueError, match="no labelled node"):
        features.fit(X, [np.full_like(lab, -1) for lab in y])
    with pytest.raises(ValueError, match="estimator"):
        ClassifierFeatures(object()).fit(X, y)
    features.fit(X, y)
    assert features.estimator is not features.estimator_ and not hasattr(features.estimator, "coef_")
    narrow = [CRFSample(s[0][:, :1], s[1], s[2]) for s in X]
    with pytest.raises(ValueError, match="node features"):
        features.transform(narrow)


def test_data_free_common_checks():
    from sklearn.utils.estimator_checks import (
        check_get_params_invariance,
        check_no_attributes_set_in_init,
        check_parameters_default_constructible,
        check_set_params,
    )

    for check in (check_no_attributes_set_in_init, check_parameters_default_constructible,
                  check_get_params_invariance, check_set_params):
        check("ClassifierFeatures", ClassifierFeatures(LogisticRegression()))
