"""One label check for every entry point: loss_and_grad, MarginalCRF, the
metrics; and MarginalCRF's encoding of labels of any type (classes_)."""

import numpy as np
import pytest

from sklearn_margcrf import MarginalCRF, grid_edges, loss_and_grad
from sklearn_margcrf.metrics import hamming_error, marginal_log_loss

EDGES = grid_edges(2, 2)
FEATURES = np.ones((4, 1))
EDGE_FEATURES = np.ones((len(EDGES), 1))


def _loss_and_grad(labels):
    return loss_and_grad(EDGES, np.zeros((4, 2)), np.zeros((len(EDGES), 2, 2)), labels, n_iter=2)


def _fit(labels):
    return MarginalCRF(n_iter=2, max_iter=1, n_states=2).fit([(FEATURES, EDGES, EDGE_FEATURES)], [labels])


def _metric(labels):
    return marginal_log_loss([labels], [np.full((4, 2), 0.5)])


ENTRY_POINTS = [_loss_and_grad, _fit, _metric]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize(
    "labels, match",
    [
        (np.array([0.0, 0.5, 1.0, 1.0]), "integer labels .*not whole numbers"),
        (np.array([0.0, np.nan, 1.0, 1.0]), "integer labels .*not whole numbers"),
        (np.array([0.0, np.inf, 1.0, 1.0]), "integer labels .*not whole numbers"),
        (np.array([0, -2, 1, 1]), r"label -2: labels must be >= 0, or -1"),
        (np.array([0, 2, 1, 1]), r"label 2"),
    ],
)
def test_bad_labels_raise_the_same_error_everywhere(entry, labels, match):
    with pytest.raises(ValueError, match=match):
        entry(labels)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_bool_and_whole_float_labels_mean_their_integers(entry):
    ints = np.array([0, 1, 1, 0])
    reference = entry(ints)
    for same in (ints.astype(bool), ints.astype(np.float32), ints.astype(np.int8)):
        got = entry(same)
        if isinstance(reference, MarginalCRF):
            np.testing.assert_array_equal(got.unary_coef_, reference.unary_coef_)
        elif isinstance(reference, tuple):
            for a, b in zip(got, reference):
                np.testing.assert_array_equal(a, b)
        else:
            assert got == reference


def test_hamming_error_refuses_infinite_labels():
    with pytest.raises(ValueError, match="y_true\\[0\\] must hold integer labels"):
        hamming_error([np.array([0.0, np.inf])], [np.array([0, 1])])


def test_loss_and_grad_takes_integer_codes_only():
    # the functional core works on codes 0..K-1; the estimator encodes labels
    with pytest.raises(ValueError, match="integer labels"):
        _loss_and_grad(np.array(["0", "1", "0", "1"]))
