"""Resumable fits: MarginalCRF.fit(..., unary_coef_init=, pairwise_coef_init=)
and sklearn_margcrf.callbacks.Checkpoint (atomic saves, one-line resume)."""

import os
import resource
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
from sklearn import config_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer

from estimator_checks import make_structured_data
from sklearn_margcrf import MarginalCRF
from sklearn_margcrf.callbacks import Checkpoint

X, Y = make_structured_data(n_samples=3)
SHAPE_F, SHAPE_G = (2, 3), (2, 2, 2)


def _fit(model, **fit_params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(X, Y, **fit_params)


def _start():
    rng = np.random.default_rng(1)
    return rng.normal(size=SHAPE_F), rng.normal(scale=0.3, size=SHAPE_G)


def test_a_fit_starts_from_the_given_weights_without_initialising_fits():
    F, G = _start()
    stages = []
    model = _fit(MarginalCRF(n_iter=2, max_iter=0, callback=lambda p: stages.append(p.stage)),
                 unary_coef_init=F, pairwise_coef_init=G)
    np.testing.assert_array_equal(model.unary_coef_, F)
    np.testing.assert_array_equal(model.pairwise_coef_, G)
    assert model.unary_coef_ is not F  # copied, never written into
    _fit(MarginalCRF(n_iter=2, max_iter=2, callback=lambda p: stages.append(p.stage)), unary_coef_init=F)
    assert stages == ["fit", "fit"]  # no "independent" stage
    # the one not given is zero; the given weights win over warm_start
    warm = _fit(MarginalCRF(n_iter=2, max_iter=3, warm_start=True))
    _fit(warm.set_params(max_iter=0), unary_coef_init=F)
    np.testing.assert_array_equal(warm.unary_coef_, F)
    assert np.all(warm.pairwise_coef_ == 0)


@pytest.mark.parametrize(
    "fit_params, match",
    [
        ({"unary_coef_init": np.zeros((3, 3))}, r"unary_coef_init has shape \(3, 3\) .* \(2, 3\)"),
        ({"pairwise_coef_init": np.zeros((2, 2, 3))}, r"pairwise_coef_init has shape \(2, 2, 3\) .* \(2, 2, 2\)"),
        ({"unary_coef_init": np.full(SHAPE_F, np.nan)}, "unary_coef_init contains NaN"),
        ({"pairwise_coef_init": "zeros"}, "pairwise_coef_init must be an array of numbers"),
    ],
)
def test_starting_weights_are_checked(fit_params, match):
    with pytest.raises(ValueError, match=match):
        MarginalCRF(max_iter=1).fit(X, Y, **fit_params)


def test_starting_weights_are_routed_through_a_pipeline():
    F, G = _start()
    pipeline = make_pipeline(FunctionTransformer(), MarginalCRF(n_iter=2, max_iter=0))
    pipeline.fit(X, Y, marginalcrf__unary_coef_init=F, marginalcrf__pairwise_coef_init=G)
    np.testing.assert_array_equal(pipeline[-1].unary_coef_, F)
    np.testing.assert_array_equal(pipeline[-1].pairwise_coef_, G)
    # and with scikit-learn's metadata routing, once requested
    with config_context(enable_metadata_routing=True):
        crf = MarginalCRF(n_iter=2, max_iter=0).set_fit_request(unary_coef_init=True, pairwise_coef_init=True)
        make_pipeline(FunctionTransformer(), crf).fit(X, Y, unary_coef_init=F, pairwise_coef_init=G)
    np.testing.assert_array_equal(crf.pairwise_coef_, G)


def _check_resumed(path, stopped_objective=None):
    """Resume from the checkpoint at ``path``: the fit goes on downhill from its objective."""
    saved = Checkpoint.load(path)
    assert saved.stage == "fit" and saved.params["n_iter"] == 2 and saved.params["loss"] == "univariate_logistic"
    if stopped_objective is not None:
        assert saved.objective == stopped_objective
    checkpoint = Checkpoint(path, every=1)
    resumed = _fit(MarginalCRF(n_iter=2, max_iter=5, callback=checkpoint), **checkpoint.fit_params())
    curve = resumed.loss_curve_
    assert curve[0] <= saved.objective and curve[-1] < saved.objective
    assert all(b <= a for a, b in zip(curve, curve[1:]))
    assert Checkpoint.load(path).objective == curve[-1]  # and it saved its own progress


def test_a_stopped_fit_resumes_from_its_checkpoint(tmp_path):
    path = tmp_path / "fit.npz"
    checkpoint = Checkpoint(path, every=2)
    assert checkpoint.fit_params() == {}  # nothing saved: a fresh fit

    def save_and_stop(progress):
        checkpoint(progress)
        return progress.stage == "fit" and progress.n_iter == 4

    stopped = _fit(MarginalCRF(n_iter=2, max_iter=20, callback=save_and_stop), **checkpoint.fit_params())
    saved = Checkpoint.load(path)
    assert saved.n_iter == 4 and stopped.n_iter_ == 4
    np.testing.assert_array_equal(saved.unary_coef, stopped.unary_coef_)
    np.testing.assert_array_equal(saved.pairwise_coef, stopped.pairwise_coef_)
    assert set(checkpoint.fit_params(step="crf")) == {"crf__unary_coef_init", "crf__pairwise_coef_init", "crf__stage_init"}
    assert checkpoint.fit_params()["stage_init"] == (0, 4)  # the rest of the fit: 16 iterations
    _check_resumed(path, stopped.loss_curve_[-1])
    assert os.listdir(tmp_path) == ["fit.npz"]


_KILLED_FIT = """
import sys, time, warnings
sys.path.insert(0, {tests!r})
from estimator_checks import make_structured_data
from sklearn_margcrf import MarginalCRF
from sklearn_margcrf.callbacks import Checkpoint

X, Y = make_structured_data(n_samples=3)
checkpoint = Checkpoint({path!r}, every=1)

def save_then_hang(progress):
    checkpoint(progress)
    if progress.stage == "fit" and progress.n_iter == 3:
        print("saved", flush=True)
        time.sleep(600)  # killed here, mid-fit

warnings.simplefilter("ignore")
MarginalCRF(n_iter=2, max_iter=50, callback=save_then_hang).fit(X, Y)
"""


def test_a_killed_fit_resumes_from_its_checkpoint(tmp_path):
    path = str(tmp_path / "fit.npz")
    script = _KILLED_FIT.format(tests=os.path.dirname(os.path.abspath(__file__)), path=path)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "saved"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    assert Checkpoint.load(path).n_iter == 3
    _check_resumed(path)


def test_a_failed_save_leaves_the_previous_one(tmp_path):
    from sklearn.utils import Bunch

    path = tmp_path / "fit.npz"
    checkpoint = Checkpoint(path, every=1)
    small = Bunch(stage="fit", n_iter=1, objective=1.0, elapsed=0.5, unary_coef=np.ones(SHAPE_F),
                  pairwise_coef=np.ones(SHAPE_G), params={"n_iter": 2})
    checkpoint(small)
    large = Bunch(**dict(small, n_iter=2, unary_coef=np.zeros((2, 2**17))))  # 2 MB: beyond the file size limit below
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2**16, limits[1]))
    try:
        with pytest.raises(OSError):
            checkpoint(large)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    assert os.listdir(tmp_path) == ["fit.npz"]  # no temporary file left
    saved = Checkpoint.load(path)
    assert saved.n_iter == 1 and saved.params == {"n_iter": 2} and saved.elapsed == 0.5
    np.testing.assert_array_equal(saved.unary_coef, small.unary_coef)


def test_every_is_checked():
    with pytest.raises(ValueError, match="every must be an integer >= 1, got 0"):
        Checkpoint("fit.npz", every=0)


X6, Y6 = make_structured_data(n_samples=6)


def _incremental(callback=None, random_state=3):
    # stages: 2 images x 8 L-BFGS iterations, 4 x 4, 6 x 2
    return MarginalCRF(n_iter=2, max_iter=8, incremental=2, random_state=random_state, objective_tol=0.0,
                       lbfgs_tol=0.0, callback=callback)


def _fit6(model, **fit_params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(X6, Y6, **fit_params)


def _reports():
    seen = []
    return seen, lambda progress: seen.append((progress.stage, progress.stage_index, progress.n_iter)) and False


def test_an_incremental_fit_resumes_in_the_stage_where_it_was_saved(tmp_path):
    whole_reports, record = _reports()
    whole = _fit6(_incremental(record))
    assert [r for r in whole_reports if r[2] == 1] == [
        ("independent", None, 1), ("fit[2 images]", 0, 1), ("fit[4 images]", 1, 1), ("fit", 2, 1)]

    path = tmp_path / "fit.npz"
    checkpoint = Checkpoint(path, every=1)

    def save_and_stop(progress):
        checkpoint(progress)
        return progress.stage_index == 1 and progress.n_iter == stop_at

    # stopped at the end of the second stage: the resumed fit is the third stage of the whole fit, bit for bit
    stop_at = 4
    _fit6(_incremental(save_and_stop))
    assert checkpoint.fit_params()["stage_init"] == (1, 4)
    resumed_reports, record = _reports()
    resumed = _fit6(_incremental(record), **checkpoint.fit_params())
    assert resumed_reports == [r for r in whole_reports if r[1] == 2]
    np.testing.assert_array_equal(resumed.unary_coef_, whole.unary_coef_)
    np.testing.assert_array_equal(resumed.pairwise_coef_, whole.pairwise_coef_)

    # stopped inside the second stage: its remaining 2 iterations, then the third stage's 2
    stop_at = 2
    _fit6(_incremental(save_and_stop))
    saved = Checkpoint.load(path)
    assert (saved.stage, saved.stage_index, saved.n_iter) == ("fit[4 images]", 1, 2)
    resumed_reports, record = _reports()
    seen_objectives = []

    def record_both(progress):
        seen_objectives.append(progress.objective)
        return record(progress)

    _fit6(_incremental(record_both), **checkpoint.fit_params())
    assert resumed_reports == [("fit[4 images]", 1, 3), ("fit[4 images]", 1, 4), ("fit", 2, 1), ("fit", 2, 2)]
    assert seen_objectives[0] <= saved.objective  # downhill from the save, in the same stage

    # without stage_init the same weights start the whole schedule again
    restarted_reports, record = _reports()
    _fit6(_incremental(record), unary_coef_init=saved.unary_coef, pairwise_coef_init=saved.pairwise_coef)
    assert [r[1] for r in restarted_reports] == [0] * 8 + [1] * 4 + [2] * 2


def test_a_save_in_an_initialising_fit_resumes_without_a_stage():
    reports = []

    def stop_in_the_independent_fit(progress):
        reports.append(progress)
        return progress.stage == "independent" and progress.n_iter == 2

    _fit6(_incremental(stop_in_the_independent_fit))
    saved = reports[-1]
    assert saved.stage_index is None
    from sklearn_margcrf.callbacks import SavedFit

    fit_params = SavedFit(saved.unary_coef, saved.pairwise_coef, saved.stage, saved.n_iter, saved.objective,
                          saved.elapsed, {}, "0", saved.stage_index).fit_params()
    assert set(fit_params) == {"unary_coef_init", "pairwise_coef_init"}


@pytest.mark.parametrize("stage_init, extra, match", [
    ((1, 0), {"unary_coef_init": None}, "give unary_coef_init and pairwise_coef_init"),
    ((3, 0), {}, "stage 3 does not exist, this fit has 3 stage"),
    ((1, 5), {}, "stage 1 runs at most 4 L-BFGS iterations, not 5"),
    ((1, -1), {}, "iterations run must be an integer >= 0"),
    ((1.0, 0), {}, "stage index must be an integer >= 0"),
    (1, {}, "must be a pair"),
    ((0, 0), {"random_state": None}, "needs random_state to be the integer"),
])
def test_stage_init_is_checked(stage_init, extra, match):
    F, G = np.zeros((2, 3)), np.zeros((2, 2, 2))
    fit_params = {"unary_coef_init": F, "pairwise_coef_init": G}
    random_state = extra.pop("random_state", 3)
    fit_params.update(extra)
    fit_params = {k: v for k, v in fit_params.items() if v is not None}
    if "unary_coef_init" not in fit_params:
        fit_params.pop("pairwise_coef_init")
    with pytest.raises(ValueError, match=match):
        _fit6(_incremental(random_state=random_state), stage_init=stage_init, **fit_params)
