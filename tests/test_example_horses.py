"""examples/horses.py runs end to end on tiny Weizmann-format data."""

import json

import numpy as np
import pytest

pytest.importorskip("skimage", reason="the example reads JPEGs with scikit-image")
pytest.importorskip("matplotlib", reason="the example saves a figure")


import horses  # noqa: E402
from test_datasets import horses_dir  # noqa: E402, F401  (3 tiny horses in the original layout)


def test_horses_example(horses_dir, tmp_path):  # noqa: F811
    out = tmp_path / "results"
    rows = ["surrogate-trw", "ulogistic-trw", "smooth50", "ulogistic-mnf", "pseudo", "independent"]
    results = horses.main([
        "--data", str(horses_dir.parent), "--out", str(out), "--n-jobs", "1",
        "--split", "2", "--n-train", "2", "--n-test", "1", "--max-iter", "2", "--iters", "3", "5",
        "--rows", ",".join(rows),
    ])
    expected = {(k, n) for k in rows[:4] for n in (3, 5)} | {("pseudo", None), ("independent", None)}
    assert set(results) == expected
    for row in results.values():
        assert 0.0 <= row["train"] <= 1.0 and 0.0 <= row["test"] <= 1.0
        assert row["lbfgs_iterations"] <= 2
    table = (out / "horses_table.txt").read_text()
    assert "univariate logistic MNF" in table and "pseudolikelihood TRW" in table
    assert "Timings: wall clock of each fit, summed over the runs that fitted it (this run: " in table
    assert (out / "horses_marginals.png").stat().st_size > 0
    assert len(json.loads((out / "horses_results.json").read_text())) == len(expected)


def test_horses_default_is_the_half_grid_and_other_scales_name_their_outputs(horses_dir, tmp_path, monkeypatch):  # noqa: F811
    from sklearn_margcrf import MarginalCRF
    from sklearn_margcrf.datasets import load_horses

    predict_proba, shapes = MarginalCRF.predict_proba, set()

    def recording_predict_proba(self, X):
        probs = predict_proba(self, X)
        shapes.update(p.shape[:2] for p in probs)
        return probs

    monkeypatch.setattr(MarginalCRF, "predict_proba", recording_predict_proba)
    out = tmp_path / "results"
    argv = ["--data", str(horses_dir), "--out", str(out), "--n-jobs", "1", "--split", "2", "--n-train", "1",
            "--n-test", "1", "--max-iter", "2", "--iters", "2", "--rows", "clogistic-trw,piecewise"]
    train_shape = np.shape(load_horses(horses_dir, subset="train", n_train=2).labels[0])
    test_shape = np.shape(load_horses(horses_dir, subset="test", n_train=2).labels[0])
    outputs = {}
    for extra, scale, stem in (([], 0.5, "horses"), (["--scale", "1"], 1, "horses-scale1")):
        shapes.clear()
        results = horses.main(argv + extra)
        errors = np.array([v for row in results.values() for v in (row["train"], row["test"])])
        assert np.all((errors >= 0) & (errors <= 1))
        outputs[stem] = (out / f"{stem}_table.txt").read_text()
        assert f"at scale {scale:g}" in outputs[stem]
        assert (out / f"{stem}_marginals.png").stat().st_size > 0
        assert json.loads((out / f"{stem}_results.json").read_text()) == [
            {"row": key, **value} for (key, _), value in results.items()]
        # train errors at the reduced resolution, test errors against the full-resolution masks
        reduced = horses._common.downscale(np.zeros(train_shape + (3,)), np.zeros(train_shape), scale)[1].shape
        assert shapes == {reduced, test_shape}
    # the full-resolution run left the default (half grid) table as it was
    assert (out / "horses_table.txt").read_text() == outputs["horses"]
    assert sorted(p.name for p in out.glob("*_table.txt")) == ["horses-scale1_table.txt", "horses_table.txt"]


def test_horses_dtype_is_the_fits_precision_with_checkpoints_of_its_own(horses_dir, tmp_path, monkeypatch):  # noqa: F811
    from sklearn_margcrf import MarginalCRF

    fit = MarginalCRF.fit
    seen = []

    def recording_fit(self, *args, **kwargs):
        seen.append(self.dtype)
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(MarginalCRF, "fit", recording_fit)
    argv = ["--data", str(horses_dir), "--out", str(tmp_path), "--n-jobs", "1", "--split", "2", "--n-train", "1",
            "--n-test", "1", "--max-iter", "1", "--iters", "2", "--rows", "ulogistic-trw"]
    horses.main(argv + ["--dtype", "float32"])
    assert seen and set(seen) == {"float32"}
    seen.clear()
    horses.main(argv)  # float64 does not resume from the float32 checkpoints: it fits
    assert seen and set(seen) == {"float64"}
    folders = sorted(p.name for p in (tmp_path / "horses_checkpoints").iterdir())
    assert len(folders) == 2 and folders[0] + "-float32" == folders[1]
    assert {p.name for p in tmp_path.glob("*_table.txt")} == {"horses_table.txt", "horses-float32_table.txt"}


def test_horses_downscale_labels():
    image = np.zeros((20, 30, 3), np.uint8)
    labels = np.zeros((20, 30), np.int64)
    labels[:, 15:] = 1
    small, small_labels = horses._common.downscale(image, labels, 0.5)
    assert small.shape == (10, 15, 3) and small.dtype == np.uint8
    assert small_labels.shape == (10, 15)
    assert small_labels[:, :7].max() == 0 and small_labels[:, 8:].min() == 1


def test_horses_rerun_resumes_from_its_checkpoints(horses_dir, tmp_path, monkeypatch):  # noqa: F811
    from sklearn_margcrf import MarginalCRF

    argv = [
        "--data", str(horses_dir), "--out", str(tmp_path), "--n-jobs", "1", "--split", "2", "--n-train", "2",
        "--n-test", "1", "--max-iter", "3", "--segment", "2", "--iters", "2", "--rows", "surrogate-trw,smooth5,pseudo",
    ]
    first = horses.main(argv)
    monkeypatch.setattr(MarginalCRF, "fit", lambda *a: pytest.fail("a finished cell was fitted again"))
    assert horses.main(argv) == first
    assert all(row["segments"] == 2 for row in first.values())  # 3 iterations in segments of 2


def test_horses_report_only_shows_the_finished_cells(horses_dir, tmp_path, monkeypatch):  # noqa: F811
    from sklearn_margcrf import MarginalCRF

    argv = ["--data", str(horses_dir), "--out", str(tmp_path), "--n-jobs", "1", "--split", "2", "--n-train", "2",
            "--n-test", "1", "--max-iter", "2", "--iters", "2"]
    done = horses.main(argv + ["--rows", "ulogistic-trw,independent"])
    monkeypatch.setattr(MarginalCRF, "fit", lambda *a: pytest.fail("--report-only fitted"))
    report = horses.main(argv + ["--rows", "ulogistic-trw,clogistic-mnf,independent", "--report-only"])
    assert report == done
    table = (tmp_path / "horses_table.txt").read_text()
    assert "PARTIAL RUN: 2 of 3 cells finished" in table
    assert "(this report: " in table and "(this run: " not in table  # it fitted nothing


def test_horses_cells_with_a_record_but_no_weights(horses_dir, tmp_path, monkeypatch):  # noqa: F811
    """A cell whose weights were lost is reported from its record, and refitted
    only when a smooth classification cell to be fitted starts from it."""
    from sklearn_margcrf import MarginalCRF

    argv = ["--data", str(horses_dir), "--out", str(tmp_path), "--n-jobs", "1", "--split", "2", "--n-train", "2",
            "--n-test", "1", "--max-iter", "2", "--iters", "2"]
    first = horses.main(argv + ["--rows", "surrogate-trw,ulogistic-trw,smooth5"])
    folder = next((tmp_path / "horses_checkpoints").iterdir())
    for cell in ("surrogate-trw-2", "ulogistic-trw-2", "smooth5-2"):
        (folder / f"{cell}.npz").unlink()
    surrogate_record, = folder.glob("surrogate-trw-2.errors-*.json")
    lost = json.loads(surrogate_record.read_text())
    surrogate_record.write_text(json.dumps({**lost, "train": 2.0}))  # marks the record of the lost weights

    real_fit, fitted = MarginalCRF.fit, []
    monkeypatch.setattr(MarginalCRF, "fit", lambda self, *a, **k: pytest.fail("a cell with a record was fitted"))
    real_save, titles = horses._common.save_figure, []
    monkeypatch.setattr(horses._common, "save_figure", lambda fig, *a: titles.append(
        [ax.get_title() for ax in fig.axes]) or real_save(fig, *a))
    for extra in ([], ["--report-only"]):
        kept = horses.main(argv + ["--rows", "surrogate-trw,ulogistic-trw,smooth5"] + extra)
        assert kept[("ulogistic-trw", 2)] == first[("ulogistic-trw", 2)]
        assert kept[("smooth5", 2)] == first[("smooth5", 2)]
        assert kept[("surrogate-trw", 2)]["train"] == 2.0
        assert "(d) U. logistic TRW\n(weights not kept)" in titles[-1]  # it ran, its panel is lost
        assert "(g) U. logistic MNF\n(not run)" in titles[-1]
    assert not (folder / "surrogate-trw-2.npz").exists()

    # smooth5 is to be fitted again, so the surrogate likelihood fit it starts from is too
    next(folder.glob("smooth5-2.errors-*.json")).unlink()
    monkeypatch.setattr(MarginalCRF, "fit", lambda self, *a, **k: fitted.append(self.loss) or real_fit(self, *a, **k))
    again = horses.main(argv + ["--rows", "surrogate-trw,ulogistic-trw,smooth5"])
    assert fitted.count("surrogate_likelihood") == 1 and fitted.count("smooth_classification") == 1
    assert "univariate_logistic" not in fitted
    assert again[("surrogate-trw", 2)]["train"] != 2.0  # evaluated afresh
    assert again[("surrogate-trw", 2)]["train"] == pytest.approx(first[("surrogate-trw", 2)]["train"])
    assert (folder / "surrogate-trw-2.npz").exists()


def test_horses_rho_reaches_the_trw_fits_with_checkpoints_of_their_own(horses_dir, tmp_path, monkeypatch):  # noqa: F811
    from sklearn_margcrf import MarginalCRF

    fit, seen = MarginalCRF.fit, []
    monkeypatch.setattr(MarginalCRF, "fit", lambda self, *a, **k: seen.append((self.inference, self.rho)) or fit(self, *a, **k))
    argv = ["--data", str(horses_dir), "--out", str(tmp_path), "--n-jobs", "1", "--split", "2", "--n-train", "1",
            "--n-test", "1", "--max-iter", "3", "--iters", "3", "--rows", "ulogistic-trw"]
    default = horses.main(argv)
    assert ("trw", None) in seen
    seen.clear()
    spanning = horses.main(argv + ["--rho", "0.25"])
    assert ("trw", 0.25) in seen  # the TRW row; the independent start is read from nothing: it is refitted too
    folders = sorted(p.name for p in (tmp_path / "horses_checkpoints").iterdir())
    assert len(folders) == 2 and folders[0] + "-rho0.25" == folders[1]
    assert set(spanning) == set(default)
    weights = [np.load(tmp_path / "horses_checkpoints" / folder / "ulogistic-trw-3.npz")["pairwise_coef"] for folder in folders]
    assert not np.allclose(weights[0], weights[1])  # another rho, another fit
    for bad in ("0", "1.5", "everywhere"):
        with pytest.raises(SystemExit):
            horses.main(argv + ["--rho", bad])


def test_horses_objective_tol_stops_the_fits_early(horses_dir, tmp_path):  # noqa: F811
    argv = ["--data", str(horses_dir), "--out", str(tmp_path), "--n-jobs", "1", "--split", "2", "--n-train", "1",
            "--n-test", "1", "--max-iter", "25", "--iters", "3", "--rows", "ulogistic-trw,independent"]
    paper = horses.main(argv)
    stopped = horses.main(argv + ["--objective-tol", "0.5"])
    # the paper's protocol runs L-BFGS to its own end; the rule stops once 10 iterations gain less than half
    assert {cell: paper[cell]["lbfgs_iterations"] for cell in paper} == {cell: 25 for cell in paper}
    assert all(10 < stopped[cell]["lbfgs_iterations"] < 25 for cell in stopped)
    folders = sorted(p.name for p in (tmp_path / "horses_checkpoints").iterdir())
    assert len(folders) == 2 and folders[0] + "-objtol0.5" == folders[1]
    with pytest.raises(SystemExit):
        horses.main(argv + ["--objective-tol", "-1"])
