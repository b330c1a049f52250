"""Warnings of the functional core point at the caller's line, whichever
public function it called (not at a line of this package)."""

import warnings

import numpy as np
import pytest
from reference import random_model

from sklearn_margcrf import grid_edges, infer, loss_and_grad
from sklearn_margcrf.exceptions import BackpropFallbackWarning
from sklearn_margcrf.mean_field import mean_field_backward, mean_field_forward
from sklearn_margcrf.trw import trw_backward, trw_forward


def small_model(seed, scale=1.0):
    rng = np.random.default_rng(seed)
    edges = grid_edges(3, 3)
    unary, pairwise = random_model(edges, 9, 2, rng, scale=scale)
    return edges, unary, pairwise, rng.integers(0, 2, 9)


def floored():
    edges = grid_edges(2, 2)
    unary = np.array([[1.0, 0], [0, 1], [1, 0], [0, 0]]) * 800
    infer(edges, unary, np.tile(np.eye(2), (4, 1, 1)) * 800, method="trw")


def perturbation_unconverged():
    edges, unary, pairwise, labels = small_model(1)
    loss_and_grad(edges, unary, pairwise, labels, gradient_mode="perturbation", tol=1e-14, max_iter=2)


def backprop_unconverged(inference):
    edges, unary, pairwise, labels = small_model(2)
    loss_and_grad(edges, unary, pairwise, labels, inference=inference, gradient_mode="backprop", tol=1e-14, max_iter=2)


def backprop_fallback():
    # frustrated, strongly coupled: neither loopy BP nor its reverse sweeps converge
    rng = np.random.default_rng(245)
    edges = grid_edges(4, 4)
    unary, pairwise = rng.normal(0, 0.3, (16, 2)), rng.normal(0, 2.5, (len(edges), 2, 2))
    loss_and_grad(edges, unary, pairwise, rng.integers(0, 2, 16), inference="lbp", gradient_mode="backprop", tol=1e-3)


def trw_reverse_sweeps():
    edges, unary, pairwise, _ = small_model(3)
    state = trw_forward(edges, unary, pairwise, np.full(len(edges), 0.5), tol=1e-12)
    gradient = np.random.default_rng(5).normal(size=(9, 2))
    trw_backward(state, gradient, None, mode="fixed_point", tol=1e-14, max_iter=2)


def mean_field_reverse_sweeps():
    edges, unary, pairwise, _ = small_model(4)
    state = mean_field_forward(edges, unary, pairwise, tol=1e-12)
    gradient = np.random.default_rng(5).normal(size=(9, 2))
    mean_field_backward(state, gradient, None, mode="fixed_point", tol=1e-14, max_iter=1)


CASES = {
    "messages at the floor (infer)": (floored, RuntimeWarning, "at the floor"),
    "perturbation, not converged (loss_and_grad)": (perturbation_unconverged, RuntimeWarning, "may be far off"),
    "back TRW at unconverged messages (loss_and_grad)": (
        lambda: backprop_unconverged("trw"), RuntimeWarning, "not a fixed point"),
    "back mean field at unconverged marginals (loss_and_grad)": (
        lambda: backprop_unconverged("mean_field"), RuntimeWarning, "assumes a fixed point"),
    "backprop fallback (loss_and_grad)": (backprop_fallback, BackpropFallbackWarning, "forward iterations"),
    "back TRW reverse sweeps (trw_backward)": (trw_reverse_sweeps, RuntimeWarning, "reverse sweeps"),
    "back mean field reverse sweeps (mean_field_backward)": (
        mean_field_reverse_sweeps, RuntimeWarning, "reverse sweeps"),
}


@pytest.mark.parametrize("case", CASES)
def test_core_warnings_point_at_the_callers_line(case):
    call, category, match = CASES[case]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    ours = [w for w in caught if issubclass(w.category, category) and match in str(w.message)]
    assert ours, [str(w.message) for w in caught]
    assert {w.filename for w in caught} == {__file__}, [(w.filename, str(w.message)) for w in caught]


def test_a_module_filter_on_the_callers_module_applies():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", module="test_warnings")
        floored()
    assert caught == []
