"""examples/learning_methods.py end to end on a tiny Stanford Background fixture."""

import json

import numpy as np
import pytest

pytest.importorskip("skimage", reason="the features need scikit-image")
pytest.importorskip("matplotlib", reason="the example saves figures")


from test_example_backgrounds import make_stanford_fixture  # noqa: E402


def test_learning_methods_example(tmp_path):
    import learning_methods

    make_stanford_fixture(tmp_path / "data" / "stanford_background", n_images=4)
    out = tmp_path / "out"
    result = learning_methods.main([
        "--data", str(tmp_path / "data"), "--out", str(out), "--n-jobs", "1",
        "--n-train", "2", "--n-test", "2", "--trunc-iters", "2,3", "--tols", "1e-2,1e-4",
        "--max-iter", "2", "--init-max-iter", "5",
    ])
    for name in ("learning_methods_table.txt", "learning_methods.png", "learning_methods_curves.json"):
        assert (out / name).stat().st_size > 0
    curves = result["curves"]
    assert set(curves) == {
        "truncated 2 it.", "truncated 3 it.", "perturbation 1e-02", "perturbation 1e-04",
        "back-propagation 1e-02", "back-propagation 1e-04",
    }
    for c in curves.values():
        assert all(0.0 <= e <= 1.0 for e in c["test_error"])
        assert len(c["test_error"]) == len(c["snap_time"]) >= 2  # the start and at least one snapshot
        assert np.all(np.diff(c["time"]) >= 0) and np.all(np.isfinite(c["objective"]))
        assert 1 <= c["n_iter"] <= 2
        # the callback's snapshots: the start, each snapshot iteration and the last one, at their fit times
        assert c["snap_iteration"][0] == 0 and c["snap_iteration"][-1] == c["n_iter"]
        assert np.all(np.diff(c["snap_iteration"]) > 0)
        assert c["snap_time"][1:] == [c["time"][k - 1] for k in c["snap_iteration"][1:]]
    raw = json.loads((out / "learning_methods_curves.json").read_text())
    assert len(raw["train_ids"]) == 2 and not set(raw["train_ids"]) & set(raw["test_ids"])


def test_learning_methods_time_budget(tmp_path):
    import learning_methods

    make_stanford_fixture(tmp_path / "data" / "stanford_background", n_images=2, seed=3)
    result = learning_methods.main([
        "--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--n-jobs", "1",
        "--n-train", "1", "--n-test", "1", "--methods", "truncated", "--trunc-iters", "2",
        "--max-iter", "5", "--init-max-iter", "3", "--time-budget", "1e-9",
    ])
    [curve] = result["curves"].values()
    assert curve["stop"] == "time budget" and curve["n_iter"] == 1
    assert len(curve["objective"]) == 1 and 0.0 <= curve["test_error"][-1] <= 1.0


def test_snapshots():
    import learning_methods

    assert learning_methods.snapshots(1000, 2.0) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]
    assert learning_methods.snapshots(2, 2.0) == [1, 2]
    assert learning_methods.snapshots(5, 1.5) == [1, 2, 3, 5]


# Resuming: a tiny run of two methods, one truncated, one back-propagation
TRUNCATED, BACKPROP = "truncated 2 it.", "back-propagation 1e-02"
TINY = ["--n-jobs", "1", "--n-train", "2", "--n-test", "2", "--methods", "truncated,backprop",
        "--trunc-iters", "2", "--tols", "1e-2", "--max-iter", "2", "--init-max-iter", "5"]


def _run(tmp_path, *options):
    import learning_methods

    return learning_methods.main(["--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), *TINY, *options])


def _checkpoints(tmp_path):
    """The one settings folder the runs under ``tmp_path`` wrote."""
    [folder] = (tmp_path / "out" / "learning_methods_checkpoints").iterdir()
    return folder


def _spy_fits(monkeypatch, interrupt=None):
    """The parameters (and number of images) of every MarginalCRF.fit from now on; ``interrupt(params)``
    true: that fit is killed (KeyboardInterrupt) instead."""
    from sklearn_margcrf import MarginalCRF

    calls, fit = [], MarginalCRF.fit

    def spy(self, X, y, **kwargs):
        params = dict(self.get_params(), n_images=len(X))
        if interrupt is not None and interrupt(params):
            raise KeyboardInterrupt
        calls.append(params)
        return fit(self, X, y, **kwargs)

    monkeypatch.setattr(MarginalCRF, "fit", spy)
    return calls


def _forbid_fits(monkeypatch):
    from sklearn_margcrf import MarginalCRF

    monkeypatch.setattr(MarginalCRF, "fit", lambda *args, **kwargs: pytest.fail("fitted a method that has a record"))


def test_every_method_and_the_start_are_saved_and_a_rerun_fits_nothing(tmp_path, monkeypatch):
    make_stanford_fixture(tmp_path / "data" / "stanford_background", n_images=4)
    first = _run(tmp_path)
    folder = _checkpoints(tmp_path)
    assert folder.name == "train2-test2-seed0-scale0.2-maxiter2-initmaxiter5-budget3600-ratio3"
    assert sorted(p.name for p in folder.iterdir()) == [
        "back-propagation_1e-02.json", "independent_model.json", "independent_model.npz", "truncated_2_it.json",
    ]  # and no temporary file left
    for label, name in ((TRUNCATED, "truncated_2_it.json"), (BACKPROP, "back-propagation_1e-02.json")):
        assert json.loads((folder / name).read_text()) == first["curves"][label]
    # both methods start from the one independent model, its fit the start of both time axes
    start = json.loads((folder / "independent_model.json").read_text())
    for curve in first["curves"].values():
        assert curve["init_seconds"] == curve["snap_time"][0] == start["seconds"]
        assert curve["test_error"][0] == start["test_error"]
    assert "PARTIAL" not in first["table"]

    _forbid_fits(monkeypatch)
    second = _run(tmp_path)
    assert second["curves"] == first["curves"]
    assert second["table"].split("Wall time")[0] == first["table"].split("Wall time")[0]  # table and conclusion
    raw = json.loads((tmp_path / "out" / "learning_methods_curves.json").read_text())
    assert raw["curves"] == first["curves"] and raw["not_run_yet"] == []
    assert raw["train_ids"] == start["train_ids"]


def test_a_rerun_fits_only_the_method_without_a_record(tmp_path, monkeypatch):
    make_stanford_fixture(tmp_path / "data" / "stanford_background", n_images=4)
    first = _run(tmp_path)
    (_checkpoints(tmp_path) / "back-propagation_1e-02.json").unlink()
    calls = _spy_fits(monkeypatch)
    second = _run(tmp_path)
    # the method's warm-up (one image, one iteration) and its fit; not the independent model
    assert [(c["inference"], c["gradient_mode"], c["tol"], c["max_iter"], c["n_images"]) for c in calls] == [
        ("trw", "backprop", 1e-2, 1, 1), ("trw", "backprop", 1e-2, 2, 2),
    ]
    assert second["curves"][TRUNCATED] == first["curves"][TRUNCATED]
    refit, original = second["curves"][BACKPROP], first["curves"][BACKPROP]
    # from the saved independent model: the same start, time origin and L-BFGS path
    assert refit["init_seconds"] == original["init_seconds"] and refit["test_error"][0] == original["test_error"][0]
    assert refit["objective"] == original["objective"] and refit["test_error"] == original["test_error"]
    assert (_checkpoints(tmp_path) / "back-propagation_1e-02.json").exists()

    # records of other images (another copy of the data set) are not resumed
    start = _checkpoints(tmp_path) / "independent_model.json"
    start.write_text(json.dumps({**json.loads(start.read_text()), "train_ids": ["elsewhere", "other"]}))
    (_checkpoints(tmp_path) / "back-propagation_1e-02.json").unlink()
    with pytest.raises(SystemExit, match="images chosen differ"):
        _run(tmp_path)


def test_an_interrupted_run_leaves_a_partial_report_and_report_only_fits_nothing(tmp_path, monkeypatch):
    make_stanford_fixture(tmp_path / "data" / "stanford_background", n_images=4)
    out = tmp_path / "out"
    _spy_fits(monkeypatch, interrupt=lambda params: params["gradient_mode"] == "backprop")
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path)
    folder = _checkpoints(tmp_path)
    assert (folder / "truncated_2_it.json").exists() and not (folder / "back-propagation_1e-02.json").exists()
    assert not list(folder.glob("*.tmp"))
    # the outputs written after the finished method
    table = (out / "learning_methods_table.txt").read_text()
    assert "PARTIAL RUN: 1 of 2" in table and TRUNCATED in table
    assert json.loads((out / "learning_methods_curves.json").read_text())["not_run_yet"] == [BACKPROP]

    monkeypatch.undo()
    _forbid_fits(monkeypatch)
    (tmp_path / "data").rename(tmp_path / "elsewhere")  # a report needs no data
    report = _run(tmp_path, "--report-only")
    assert set(report["curves"]) == {TRUNCATED}
    assert report["curves"][TRUNCATED] == json.loads((folder / "truncated_2_it.json").read_text())
    assert "PARTIAL RUN: 1 of 2" in report["table"]
    [row] = [line for line in report["table"].splitlines() if line.startswith(BACKPROP)]
    assert row.strip() == BACKPROP  # blank: not run yet
    assert (out / "learning_methods_table.txt").read_text().strip() == report["table"]
    assert json.loads((out / "learning_methods_curves.json").read_text())["not_run_yet"] == [BACKPROP]
    assert not (folder / "back-propagation_1e-02.json").exists()


def test_other_settings_do_not_resume(tmp_path, monkeypatch):
    make_stanford_fixture(tmp_path / "data" / "stanford_background", n_images=4)
    _run(tmp_path, "--methods", "truncated")
    [first_folder] = (tmp_path / "out" / "learning_methods_checkpoints").iterdir()
    first_record = (first_folder / "truncated_2_it.json").read_text()
    calls = _spy_fits(monkeypatch)
    result = _run(tmp_path, "--methods", "truncated", "--max-iter", "3")
    # a fresh independent model and method, in a folder of their own
    assert [(c["inference"], c["max_iter"]) for c in calls if c["n_images"] == 2] == [("independent", 5), ("trw", 3)]
    folders = sorted((tmp_path / "out" / "learning_methods_checkpoints").iterdir())
    assert len(folders) == 2 and any("maxiter3" in f.name for f in folders)
    assert (first_folder / "truncated_2_it.json").read_text() == first_record
    assert result["curves"][TRUNCATED]["n_iter"] == 3
