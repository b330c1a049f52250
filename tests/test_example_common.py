"""examples/_common.py: cached features and resumable, checkpointed fits."""

import json
import os
import re
import signal

import numpy as np
import pytest

import _common
from estimator_checks import make_structured_data
from sklearn_margcrf import MarginalCRF
from sklearn_margcrf.callbacks import Checkpoint


def _fresh(store_dir, X, y, segment, max_iter=7):
    store = _common.Checkpoints(store_dir)
    F0 = np.zeros((2, X[0].node_features.shape[1]))
    G0 = np.zeros((2, 2, X[0].edge_features.shape[1]))
    model = MarginalCRF(n_iter=3, init="zeros")
    return store.fit("cell", model, X, y, {"unary_coef": F0, "pairwise_coef": G0}, max_iter, segment)


def _saves(store, monkeypatch, interrupt_at=None):
    """Record the iterations of every checkpoint ``store`` writes; raise
    KeyboardInterrupt right after the one at ``interrupt_at`` iterations."""
    saved = []
    save = store.save

    def spy(name, state):
        save(name, state)
        saved.append(int(state["lbfgs_iterations"]))
        if saved[-1] == interrupt_at:
            raise KeyboardInterrupt  # killed right after this checkpoint

    monkeypatch.setattr(_common.Checkpoints, "save", lambda self, name, state: spy(name, state))
    return saved


def test_a_fit_is_one_estimator_fit_saved_every_segment_iterations(tmp_path, monkeypatch):
    X, y = make_structured_data(n_samples=3)
    saved = _saves(_common.Checkpoints(tmp_path), monkeypatch)
    with _common.ignore_convergence_warnings():
        model, state = _fresh(tmp_path, X, y, segment=3)
        plain = MarginalCRF(n_iter=3, init="zeros", max_iter=7).fit(X, y)
    assert saved == [3, 6, 7]  # every 3 iterations, and at the end
    assert state["done"] and state["segments"] == 3 and model.n_iter_ == state["lbfgs_iterations"] == 7
    assert model.loss_curve_ == plain.loss_curve_
    np.testing.assert_array_equal(model.unary_coef_, plain.unary_coef_)
    np.testing.assert_array_equal(model.pairwise_coef_, plain.pairwise_coef_)
    assert model.callback is None


def test_an_interrupted_fit_resumes_from_its_last_checkpoint(tmp_path, monkeypatch):
    X, y = make_structured_data(n_samples=3)
    with _common.ignore_convergence_warnings():
        reference, _ = _fresh(tmp_path / "a", X, y, segment=2)
        _saves(_common.Checkpoints(tmp_path / "b"), monkeypatch, interrupt_at=4)
        with pytest.raises(KeyboardInterrupt):
            _fresh(tmp_path / "b", X, y, segment=2)
        saved = _common.Checkpoints(tmp_path / "b").load("cell")
        assert not saved["done"] and saved["lbfgs_iterations"] == 4 and saved["segments"] == 2
        assert saved["loss_curve"] == reference.loss_curve_[:4]  # the same fit up to the kill
        resumed, state = _fresh(tmp_path / "b", X, y, segment=2)
        # by hand: a fresh L-BFGS from the checkpoint, for the 3 remaining iterations
        by_hand = MarginalCRF(n_iter=3, init="zeros", max_iter=3).fit(
            X, y, unary_coef_init=saved["unary_coef"], pairwise_coef_init=saved["pairwise_coef"]
        )
    assert state["done"] and state["lbfgs_iterations"] == 7 and state["segments"] == 4
    np.testing.assert_array_equal(resumed.unary_coef_, by_hand.unary_coef_)
    np.testing.assert_array_equal(resumed.pairwise_coef_, by_hand.pairwise_coef_)
    assert resumed.loss_curve_ == saved["loss_curve"] + by_hand.loss_curve_


def _signalled_in_iteration(n_iter, interrupt_at=None):
    """``_common.timed_fit`` whose fit sends itself SIGUSR1 in L-BFGS iteration
    ``n_iter`` (before the store's callback sees it) and, with
    ``interrupt_at``, is killed in that iteration (the planned stop)."""
    timed_fit = _common.timed_fit

    def signalled(model, X, y, **fit_params):
        store_callback = model.callback

        def callback(progress):
            if progress.n_iter == n_iter:
                os.kill(os.getpid(), signal.SIGUSR1)
            if progress.n_iter == interrupt_at:
                raise KeyboardInterrupt
            return store_callback(progress)

        return timed_fit(model.set_params(callback=callback), X, y, **fit_params)

    return signalled


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_sigusr1_writes_a_checkpoint_after_the_current_iteration(tmp_path, monkeypatch):
    X, y = make_structured_data(n_samples=3)
    saved = _saves(_common.Checkpoints(tmp_path), monkeypatch)
    logged = []
    monkeypatch.setattr(_common, "timed_fit", _signalled_in_iteration(2))
    before = signal.getsignal(signal.SIGUSR1)
    with _common.ignore_convergence_warnings():
        model, state = _common.Checkpoints(tmp_path).fit(
            "cell", MarginalCRF(n_iter=3, init="zeros"), X, y,
            {"unary_coef": np.zeros((2, X[0].node_features.shape[1])),
             "pairwise_coef": np.zeros((2, 2, X[0].edge_features.shape[1]))}, 7, 5, log=logged.append)
        plain = MarginalCRF(n_iter=3, init="zeros", max_iter=7).fit(X, y)
    assert saved == [2, 5, 7]  # the asked one, every 5 iterations, and at the end
    assert logged == ["    checkpoint of cell written after 2 L-BFGS iterations, as asked by SIGUSR1"]
    assert signal.getsignal(signal.SIGUSR1) == before
    assert state["fits"] == 1 and state["segments"] == 2  # the fit went on
    np.testing.assert_array_equal(model.unary_coef_, plain.unary_coef_)


def test_a_finished_fit_is_loaded_not_refitted(tmp_path, monkeypatch):
    X, y = make_structured_data(n_samples=2)
    with _common.ignore_convergence_warnings():
        first, _ = _fresh(tmp_path, X, y, segment=4)
    monkeypatch.setattr(MarginalCRF, "fit", lambda *a: pytest.fail("a finished fit was fitted again"))
    again, _ = _fresh(tmp_path, X, y, segment=4)
    np.testing.assert_array_equal(again.unary_coef_, first.unary_coef_)
    np.testing.assert_array_equal(again.predict_proba(X)[0], first.predict_proba(X)[0])


def test_cached_features_are_the_float32_features_memory_mapped(tmp_path):
    pytest.importorskip("skimage")
    from sklearn_margcrf.features import HorseFeatures

    rng = np.random.default_rng(0)
    images = [rng.random((9, 12, 3)), rng.random((10, 7, 3))]
    transformer = HorseFeatures(dtype=np.float32, scale=0.5)
    cached = _common.cached_features(transformer, images, ["a", "b"], tmp_path)
    again = _common.cached_features(transformer, images[::-1], ["b", "a"], tmp_path)  # read back by key
    for sample, back, image in zip(cached, again[::-1], images):
        [direct] = transformer.transform([image])
        assert isinstance(sample.node_features, np.memmap) and sample.node_features.dtype == np.float32
        np.testing.assert_array_equal(sample.node_features, direct.node_features)
        np.testing.assert_array_equal(sample.edge_features, direct.edge_features)
        np.testing.assert_array_equal(sample.edges, direct.edges)
        assert sample.grid_shape == direct.grid_shape and sample.image_shape == direct.image_shape
        np.testing.assert_array_equal(back.node_features, sample.node_features)


def test_records_are_evaluated_once_and_read_back(tmp_path):
    store = _common.Checkpoints(tmp_path)
    calls = []

    def evaluate():
        calls.append(1)
        return {"test": 0.25}

    first = store.record("cell.errors", evaluate)
    again = store.record("cell.errors", evaluate)
    assert calls == [1] and again == first and first["test"] == 0.25 and first["evaluation_seconds"] >= 0
    assert not store.finished("cell")  # records are not fits


def test_finished_only_after_the_last_checkpoint(tmp_path, monkeypatch):
    X, y = make_structured_data(n_samples=2)
    store = _common.Checkpoints(tmp_path)
    _saves(store, monkeypatch, interrupt_at=2)
    with _common.ignore_convergence_warnings(), pytest.raises(KeyboardInterrupt):
        _fresh(tmp_path, X, y, segment=2)
    assert store.load("cell") is not None and not store.finished("cell")
    with _common.ignore_convergence_warnings():
        _fresh(tmp_path, X, y, segment=2)
    assert store.finished("cell")


def test_an_incremental_schedule_is_refused(tmp_path):
    X, y = make_structured_data(n_samples=2)
    with pytest.raises(ValueError, match="incremental"):
        _common.Checkpoints(tmp_path).fit("cell", MarginalCRF(incremental=1), X, y, None, 4, 2)


def test_partial_run_note_and_checkpoint_folder(tmp_path):
    assert _common.partial_run_note(3, 3) == ""
    assert _common.partial_run_note(1, 3) == "\nPARTIAL RUN: 1 of 3 cells finished; blank cells are not run yet."
    args = _common.parse_args("", ["--out", str(tmp_path)], lambda p: _common.resumable_arguments(p, "demo"))
    assert args.segment == 50 and not args.report_only
    assert _common.checkpoint_folder(args, "demo", "a1-b2").checkpoints == str(tmp_path / "demo_checkpoints" / "a1-b2")
    args.segment = 0
    with pytest.raises(SystemExit, match="--segment"):
        _common.checkpoint_folder(args, "demo", "x")


def test_bootstrap_sd_is_the_standard_error_of_a_mean():
    values = np.random.default_rng(5).normal(size=400)
    sd = _common.bootstrap_sd(lambda i: values[i].mean(), len(values), draws=4000)
    assert sd == pytest.approx(values.std() / np.sqrt(len(values)), rel=0.1)
    assert _common.bootstrap_sd(lambda i: 0.25, 10) == 0.0
    # seeded: the same resamples every time
    assert sd == _common.bootstrap_sd(lambda i: values[i].mean(), len(values), draws=4000)


def test_format_table_keeps_wide_headers_and_cells_apart():
    """Headers wider than a number ("10it train") and long status texts
    stay separated from their neighbours, in our columns and the paper's."""
    header = ["loss", "lambda", "10it train", "10it test", "status"]
    rows = [("clique logistic", ["1e-3", 0.193, 0.203, "shared by the rows at this lambda"]),
            ("independent", ["1e-4", None, 0.288, "ok"])]
    paper = {"clique logistic": ["1e-3", 0.198, 0.223, "long paper entry"]}
    text = _common.format_table("title", header, rows, paper=paper)
    head, _, first, second = text.splitlines()[2:6]
    ours, theirs = head.split("|")
    assert re.split(r"\s{2,}", ours.strip()) == header
    assert re.split(r"\s{2,}", theirs.strip()) == ["paper:"] + header[1:]
    assert first.split("|")[0].split() == ["clique", "logistic", "1e-3", "0.193", "0.203", "shared", "by", "the",
                                           "rows", "at", "this", "lambda"]
    assert first.split("|")[1].split() == ["1e-3", "0.198", "0.223", "long", "paper", "entry"]
    # columns line up: each value ends where its header ends
    for line, value in ((first, "0.203"), (second, "0.288")):
        assert line.index(value) + len(value) == ours.index("10it test") + len("10it test")


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_sigusr1_checkpoints_a_resumable_fit_which_a_rerun_resumes(tmp_path, monkeypatch):
    # backgrounds.py's store: the signal must save the iterations since the last
    # periodic save, not end the run (before, it ended it and lost them)
    X, y = make_structured_data(n_samples=3)
    logged = []

    def model():
        return MarginalCRF(n_iter=3, init="zeros", max_iter=7, incremental=1, random_state=0)

    store = _common.ResumableFits(tmp_path, every=5, log=logged.append)
    before = signal.getsignal(signal.SIGUSR1)
    with _common.ignore_convergence_warnings():
        with monkeypatch.context() as patch:
            patch.setattr(_common, "timed_fit", _signalled_in_iteration(2, interrupt_at=3))
            with pytest.raises(KeyboardInterrupt):
                store.fit("cell", model(), X, y)
        assert signal.getsignal(signal.SIGUSR1) == before
        assert logged == ["    checkpoint of cell written after 2 L-BFGS iterations, as asked by SIGUSR1"]
        progress = json.loads((tmp_path / "cell.progress.json").read_text())
        assert progress["lbfgs_iterations"] == 2 and progress["runs"] == 1
        saved = Checkpoint(tmp_path / "cell.fit.npz").fit_params()
        assert saved["stage_init"] == (0, 2)  # in the schedule's first stage, after 2 of its iterations
        resumed, state = store.fit("cell", model(), X, y)
        by_hand = model().fit(X, y, **saved)
    assert logged[1].startswith("    resuming cell at stage (0, 2) after 2 L-BFGS iterations")
    assert state["runs"] == 2 and state["lbfgs_iterations"] == 2 + by_hand.n_iter_
    np.testing.assert_array_equal(resumed.unary_coef_, by_hand.unary_coef_)
    np.testing.assert_array_equal(resumed.pairwise_coef_, by_hand.pairwise_coef_)
