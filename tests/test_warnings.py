"""Warnings of the functional core point at the caller's line, whichever
public function it called (not at a line of this package)."""

import warnings

import numpy as np
import pytest
from test_gradients import frustrated_problem, make_problem
from test_inference import floored_model

from sklearn_margcrf import infer, loss_and_grad
from sklearn_margcrf.exceptions import BackpropFallbackWarning
from sklearn_margcrf.mean_field import mean_field_backward, mean_field_forward
from sklearn_margcrf.trw import trw_backward, trw_forward


def floored():
    infer(*floored_model(800), method="trw")


def floored_gradient():
    loss_and_grad(*floored_model(800), np.array([0, 1, 0, 1]), gradient_mode="backprop")


def perturbation_unconverged():
    edges, unary, pairwise, labels = make_problem((3, 3), 1, n_states=2)
    loss_and_grad(edges, unary, pairwise, labels, gradient_mode="perturbation", tol=1e-14, max_iter=2)


def backprop_unconverged(inference):
    edges, unary, pairwise, labels = make_problem((3, 3), 2, n_states=2)
    loss_and_grad(edges, unary, pairwise, labels, inference=inference, gradient_mode="backprop", tol=1e-14, max_iter=2)


def backprop_fallback():
    loss_and_grad(*frustrated_problem(), inference="lbp", gradient_mode="backprop", tol=1e-3)


def trw_reverse_sweeps():
    edges, unary, pairwise, _ = make_problem((3, 3), 3, n_states=2)
    state = trw_forward(edges, unary, pairwise, np.full(len(edges), 0.5), tol=1e-12)
    gradient = np.random.default_rng(5).normal(size=(9, 2))
    trw_backward(state, gradient, None, mode="fixed_point", tol=1e-14, max_iter=2)


def mean_field_reverse_sweeps():
    edges, unary, pairwise, _ = make_problem((3, 3), 4, n_states=2)
    state = mean_field_forward(edges, unary, pairwise, tol=1e-12)
    gradient = np.random.default_rng(5).normal(size=(9, 2))
    mean_field_backward(state, gradient, None, mode="fixed_point", tol=1e-14, max_iter=1)


CASES = {
    "messages at the floor (infer)": (floored, RuntimeWarning, "at the floor"),
    "messages at the floor (loss_and_grad)": (floored_gradient, RuntimeWarning, "message entries are at the floor"),
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
