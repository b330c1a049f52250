"""MarginalCRF encodes the labels it is given, like scikit-learn's classifiers:
integers, strings, booleans, masks of 0/255; classes_, predict, predict_proba,
score and the scorers follow them."""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV

from sklearn_margcrf import MarginalCRF
from sklearn_margcrf.datasets import make_denoising_problem
from sklearn_margcrf.features import DenoisingFeatures
from sklearn_margcrf.metrics import get_scorer, hamming_error, marginal_log_loss

IMAGES, LABELS = make_denoising_problem(4, shape=(12, 12), noise=1.0, random_state=0)
X = DenoisingFeatures().transform(IMAGES)


def _fit(y, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return MarginalCRF(n_iter=3, max_iter=8, init="zeros", **params).fit(X, y)


@pytest.fixture(scope="module")
def reference():
    return _fit(LABELS)


def _relabel(mapping):
    return [np.vectorize(mapping.get, otypes=[object])(lab).astype(type(mapping[0])) for lab in LABELS]


@pytest.mark.parametrize(
    "mapping, classes",
    [
        ({0: 0, 1: 255}, [0, 255]),  # a 0/255 mask: two classes, not a 256-state model
        ({0: 3, 1: 7}, [3, 7]),
        ({0: "background", 1: "horse"}, ["background", "horse"]),
        ({0: False, 1: True}, [False, True]),
        ({0: 0.0, 1: 255.0}, [0, 255]),  # whole floats are read as integers
    ],
)
def test_labels_of_any_type_fit_the_same_model_and_predict_in_them(reference, mapping, classes):
    y = _relabel(mapping)
    crf = _fit(y)
    assert crf.classes_.tolist() == classes and crf.n_states_ == 2
    assert crf.unary_coef_.shape == reference.unary_coef_.shape
    np.testing.assert_allclose(crf.unary_coef_, reference.unary_coef_, atol=1e-10)
    expected = [np.vectorize(mapping.get)(p) for p in reference.predict(X)]
    for got, want in zip(crf.predict(X), expected):
        assert got.dtype == crf.classes_.dtype
        np.testing.assert_array_equal(got, want)
    assert crf.score(X, y) == reference.score(X, LABELS)


def test_predict_proba_follows_classes_when_the_order_of_the_names_differs(reference):
    # label 0 is called "zebra", label 1 "ant": classes_ sorts them, so the
    # columns of predict_proba swap
    crf = _fit(_relabel({0: "zebra", 1: "ant"}))
    assert crf.classes_.tolist() == ["ant", "zebra"]
    for swapped, original in zip(crf.predict_proba(X), reference.predict_proba(X)):
        np.testing.assert_allclose(swapped, original[..., ::-1], atol=1e-8)


def test_none_marks_unlabelled_nodes_of_object_arrays():
    hidden_int = [lab.copy() for lab in LABELS]
    hidden_int[0][:3] = -1
    hidden_str = [np.where(lab == 1, "horse", "background").astype(object) for lab in LABELS]
    hidden_str[0][:3] = None
    np.testing.assert_allclose(_fit(hidden_str).unary_coef_, _fit(hidden_int).unary_coef_, atol=1e-10)


def test_classes_and_n_states_for_data_that_lack_a_class():
    # one image's labels only, with its class 1 removed: a fold of a cross-validation
    only_zero = [np.zeros_like(LABELS[0])]
    X0 = X[:1]
    with pytest.raises(ValueError, match="at least two.*classes="):
        _fit_one(X0, only_zero)
    assert _fit_one(X0, only_zero, n_states=3).classes_.tolist() == [0, 1, 2]
    names = [np.full(LABELS[0].shape, "background")]
    crf = _fit_one(X0, names, classes=["horse", "background"])
    assert crf.classes_.tolist() == ["background", "horse"]
    assert crf.predict_proba(X0)[0].shape[-1] == 2
    with pytest.raises(ValueError, match="n_states=3 but y holds 1 classes.*classes="):
        _fit_one(X0, names, n_states=3)
    with pytest.raises(ValueError, match="'cat', which is not among the classes"):
        crf.score(X0, [np.full(LABELS[0].shape, "cat")])


def _fit_one(X0, y, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return MarginalCRF(n_iter=2, max_iter=2, init="zeros", **params).fit(X0, y)


def test_mixed_or_unsupported_labels_are_refused():
    with pytest.raises(ValueError, match="y mixes labels of several kinds"):
        _fit([LABELS[0]] + [np.where(lab == 1, "a", "b") for lab in LABELS[1:]])
    with pytest.raises(ValueError, match="labels of one kind"):
        _fit([np.array([["a", 1] * 6] * 12, dtype=object)] + LABELS[1:])
    with pytest.raises(ValueError, match="not whole numbers"):
        _fit([lab * 0.5 for lab in LABELS])


def test_scorers_and_metrics_follow_the_classes(reference):
    y = _relabel({0: "background", 1: "horse"})
    crf = _fit(y)
    for name in ("node_accuracy", "neg_marginal_log_loss", "neg_marginal_brier_score"):
        for resolution in ("grid", "image"):
            scorer = get_scorer(name, resolution=resolution)
            assert scorer(crf, X, y) == pytest.approx(scorer(reference, X, LABELS), abs=1e-9)
    predicted = crf.predict(X)
    assert hamming_error(y, predicted) == pytest.approx(1 - crf.score(X, y))
    assert marginal_log_loss(y, crf.predict_proba(X), classes=crf.classes_) == pytest.approx(
        -get_scorer("neg_marginal_log_loss")(crf, X, y)
    )


def test_grid_search_on_string_labels():
    y = _relabel({0: "background", 1: "horse"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        search = GridSearchCV(
            MarginalCRF(n_iter=2, max_iter=3, init="zeros", classes=["background", "horse"]),
            {"inference": ["trw", "independent"]}, cv=2, scoring=get_scorer("neg_marginal_log_loss"),
            error_score="raise",
        ).fit(X, y)
    assert set(np.unique(search.predict(X[:1])[0])) <= {"background", "horse"}
