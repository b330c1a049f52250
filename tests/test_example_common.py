"""examples/_common.py: cached features and resumable, segmented fits."""

import numpy as np
import pytest

import _common
from estimator_checks import make_structured_data
from sklearn_margcrf import MarginalCRF


def _fresh(store_dir, X, y, segment, max_iter=7):
    store = _common.Checkpoints(store_dir)
    F0 = np.zeros((2, X[0].node_features.shape[1]))
    G0 = np.zeros((2, 2, X[0].edge_features.shape[1]))
    model = MarginalCRF(n_iter=3, init="zeros")
    return store.fit("cell", model, X, y, {"unary_coef": F0, "pairwise_coef": G0}, max_iter, segment)


def test_segments_are_warm_started_fits_of_at_most_segment_iterations(tmp_path):
    X, y = make_structured_data(n_samples=3)
    with _common.ignore_convergence_warnings():
        model, state = _fresh(tmp_path, X, y, segment=3)
        # the same thing by hand: 3 + 3 + 1 iterations, each from the last weights
        manual = MarginalCRF(n_iter=3, init="zeros", max_iter=3).fit(X, y)
        manual.set_params(warm_start=True).fit(X, y)
        manual.set_params(max_iter=1).fit(X, y)
    assert state["done"] and state["segments"] == 3 and model.n_iter_ == state["lbfgs_iterations"] == 7
    assert len(model.loss_curve_) == 7
    np.testing.assert_allclose(model.unary_coef_, manual.unary_coef_, rtol=1e-12)
    np.testing.assert_allclose(model.pairwise_coef_, manual.pairwise_coef_, rtol=1e-12)


def test_an_interrupted_fit_resumes_to_the_same_weights(tmp_path, monkeypatch):
    X, y = make_structured_data(n_samples=3)
    with _common.ignore_convergence_warnings():
        reference, _ = _fresh(tmp_path / "a", X, y, segment=2)
        fit = MarginalCRF.fit
        calls = []

        def interrupted(self, X, y):
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt  # killed in the third segment
            return fit(self, X, y)

        monkeypatch.setattr(MarginalCRF, "fit", interrupted)
        with pytest.raises(KeyboardInterrupt):
            _fresh(tmp_path / "b", X, y, segment=2)
        saved = _common.Checkpoints(tmp_path / "b").load("cell")
        assert not saved["done"] and saved["lbfgs_iterations"] == 4
        monkeypatch.setattr(MarginalCRF, "fit", fit)
        resumed, state = _fresh(tmp_path / "b", X, y, segment=2)
    assert state["done"] and state["lbfgs_iterations"] == 7
    np.testing.assert_array_equal(resumed.unary_coef_, reference.unary_coef_)
    np.testing.assert_array_equal(resumed.pairwise_coef_, reference.pairwise_coef_)
    np.testing.assert_array_equal(resumed.loss_curve_, reference.loss_curve_)


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


def test_finished_only_after_the_last_segment(tmp_path, monkeypatch):
    X, y = make_structured_data(n_samples=2)
    store = _common.Checkpoints(tmp_path)
    fit = MarginalCRF.fit
    monkeypatch.setattr(MarginalCRF, "fit", lambda self, X, y: (_ for _ in ()).throw(KeyboardInterrupt)
                        if store.load("cell") is not None else fit(self, X, y))
    with _common.ignore_convergence_warnings(), pytest.raises(KeyboardInterrupt):
        _fresh(tmp_path, X, y, segment=2)
    assert store.load("cell") is not None and not store.finished("cell")
    monkeypatch.setattr(MarginalCRF, "fit", fit)
    with _common.ignore_convergence_warnings():
        _fresh(tmp_path, X, y, segment=2)
    assert store.finished("cell")


def test_partial_run_note_and_checkpoint_folder(tmp_path):
    assert _common.partial_run_note(3, 3) == ""
    assert _common.partial_run_note(1, 3) == "\nPARTIAL RUN: 1 of 3 cells finished; blank cells are not run yet."
    args = _common.parse_args("", ["--out", str(tmp_path)], lambda p: _common.resumable_arguments(p, "demo"))
    assert args.segment == 50 and not args.report_only
    assert _common.checkpoint_folder(args, "demo", "a1-b2").checkpoints == str(tmp_path / "demo_checkpoints" / "a1-b2")
    args.segment = 0
    with pytest.raises(SystemExit, match="--segment"):
        _common.checkpoint_folder(args, "demo", "x")
