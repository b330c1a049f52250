"""MarginalCRF.fit reports what L-BFGS could not do in one ConvergenceWarning
that says what happened and what to do, whatever the number of stages."""

import warnings

from sklearn.exceptions import ConvergenceWarning

from sklearn_margcrf import MarginalCRF
from sklearn_margcrf.datasets import make_denoising_problem
from sklearn_margcrf.features import DenoisingFeatures

IMAGES, LABELS = make_denoising_problem(4, shape=(12, 12), noise=1.25, random_state=0)
X = DenoisingFeatures().transform(IMAGES)


def _convergence_warnings(**params):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MarginalCRF(n_iter=3, **params).fit(X, LABELS)
    return [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]


def test_one_summary_for_the_initialising_fits_and_the_fit():
    messages = _convergence_warnings(max_iter=3, loss="smooth_classification")
    assert len(messages) == 1, messages
    message = messages[0]
    for stage in ("independent: reached max_iter=3", "surrogate_likelihood: reached max_iter=3",
                  "fit: reached max_iter=3"):
        assert stage in message
    assert "To go on: raise max_iter" in message


def test_a_failed_line_search_says_what_happened_and_what_to_do():
    # back-propagation at a loose tol from cold starts gives inexact gradients:
    # the line search fails (warm starts end nearer the fixed point). Where
    # the gradient is only a little inexact (tol 0.2-0.6) whether it does
    # depends on rounding (a change of an ulp in the kernels' exp moved the
    # outcome at tol=0.3 and 0.5); from tol=0.8 to 2 it fails every time.
    messages = _convergence_warnings(gradient_mode="backprop", tol=1.0, max_restarts=1, inference_warm_start=False)
    assert len(messages) == 1, messages
    message = messages[0]
    assert "the line search found no lower objective along the search direction" in message
    assert "max_restarts=1" in message and "gradient is inexact" in message
    assert "ABNORMAL:" not in message.replace("(scipy: ABNORMAL)", "")  # never an empty "ABNORMAL:"
