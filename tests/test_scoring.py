"""Scoring by name: get_scorer, SCORERS, and the grid or image resolution."""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV, cross_validate
from sklearn.pipeline import make_pipeline

from sklearn_margcrf import metrics
from sklearn_margcrf.estimator import MarginalCRF
from sklearn_margcrf.metrics import SCORERS, get_scorer, marginal_log_loss, node_accuracy


def test_scorer_names_are_the_keys_and_the_objects_names():
    assert set(SCORERS) == {"node_accuracy", "neg_hamming_error", "neg_marginal_log_loss", "neg_marginal_brier_score"}
    for name, scorer in SCORERS.items():
        assert scorer.name == name
        assert getattr(metrics, f"{name}_scorer") is scorer
        assert get_scorer(name) is scorer and scorer.resolution == "grid"
        assert f"{name}_scorer" in metrics.__all__


@pytest.mark.parametrize("name, counterpart", [("accuracy", "node_accuracy"), ("neg_log_loss", "neg_marginal_log_loss")])
def test_unknown_names_list_the_known_ones(name, counterpart):
    with pytest.raises(ValueError) as info:
        get_scorer(name)
    message = str(info.value)
    assert all(known in message for known in SCORERS)
    assert f"use {counterpart!r}" in message
    with pytest.raises(ValueError, match="choose one of"):
        get_scorer("f1")
    with pytest.raises(ValueError, match="resolution"):
        get_scorer("node_accuracy", resolution="pixels")


@pytest.fixture(scope="module")
def reduced():
    """A pipeline whose CRF grid is half the image size, and test images."""
    pytest.importorskip("skimage", reason="the features use scikit-image")
    from sklearn_margcrf.datasets import make_denoising_problem
    from sklearn_margcrf.features import DenoisingFeatures

    images, labels = make_denoising_problem(4, shape=(12, 14), noise=1.25, random_state=0)
    pipe = make_pipeline(DenoisingFeatures(scale=0.5), MarginalCRF(n_iter=3, max_iter=3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        pipe.fit(images[:2], labels[:2])
    return pipe, images[2:], labels[2:]


def test_grid_and_image_resolution(reduced):
    pipe, images, labels = reduced
    grid = get_scorer("node_accuracy")
    image = get_scorer("node_accuracy", resolution="image")
    assert grid(pipe, images, labels) == pytest.approx(pipe.score(images, labels))
    pixels = node_accuracy(labels, pipe.predict(images))
    assert image(pipe, images, labels) == pytest.approx(pixels)
    assert pixels != pytest.approx(pipe.score(images, labels))  # the two really differ here
    log_loss = get_scorer("neg_marginal_log_loss", resolution="image")
    assert log_loss(pipe, images, labels) == pytest.approx(-marginal_log_loss(labels, pipe.predict_proba(images)))
    # labels on the grid cannot be scored at the image size
    small = [lab[::2, ::2] for lab in labels]
    with pytest.raises(ValueError, match="labels"):
        image(pipe, images, small)


def test_grid_search_by_name_and_with_a_dict():
    from estimator_checks import make_structured_data

    X, y = make_structured_data(n_samples=4, hidden=0.1)
    crf = MarginalCRF(n_iter=2, max_iter=2, n_states=2)
    grid = {"inference": ["trw", "independent"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        single = GridSearchCV(crf, grid, cv=2, scoring=get_scorer("neg_marginal_log_loss")).fit(X, y)
        several = cross_validate(
            crf, X, y, cv=2, scoring={name: get_scorer(name) for name in ("node_accuracy", "neg_marginal_log_loss")}
        )
        # scikit-learn's names compare flat arrays: they fail on structured labels
        with pytest.raises((ValueError, TypeError)):
            GridSearchCV(crf, grid, cv=2, scoring="accuracy", error_score="raise").fit(X, y)
    assert np.all(single.cv_results_["mean_test_score"] < 0)
    assert np.all((several["test_node_accuracy"] >= 0) & (several["test_node_accuracy"] <= 1))
    assert np.all(several["test_neg_marginal_log_loss"] < 0)
