"""examples/horses_ablation.py end to end on tiny Weizmann-format data."""

import json

import numpy as np
import pytest

pytest.importorskip("skimage", reason="the example reads JPEGs with scikit-image")

import horses_ablation  # noqa: E402
from test_datasets import horses_dir  # noqa: E402, F401  (3 tiny horses in the original layout)


def _argv(horses_dir, out, variants):  # noqa: F811
    return ["--data", str(horses_dir), "--out", str(out), "--n-jobs", "1", "--split", "2", "--n-train", "1",
            "--n-test", "1", "--max-iter", "2", "--variants", variants]


def test_horses_ablation_variants_reach_the_fit_and_resume(horses_dir, tmp_path, monkeypatch):  # noqa: F811
    from sklearn_margcrf import MarginalCRF
    from sklearn_margcrf.features import reduced_shape

    real_fit, fitted = MarginalCRF.fit, []

    def recording_fit(self, X, y, **kwargs):
        fitted.append((self.inference, self.rho, X[0].grid_shape, X[0].edge_features.shape[1],
                       np.asarray(X[0].edge_features).copy(), X[0].image_shape))
        return real_fit(self, X, y, **kwargs)

    monkeypatch.setattr(MarginalCRF, "fit", recording_fit)
    variants = "paper,one-hot,scale-0.5,rho-0.25,images-0.5,colour-resolution,train-101-200"
    with pytest.raises(SystemExit, match="the variants need 101 training images"):
        horses_ablation.main(_argv(horses_dir, tmp_path, variants))
    records = horses_ablation.main(_argv(horses_dir, tmp_path, variants.replace(",train-101-200", "")))
    assert list(records) == ["paper", "one-hot", "scale-0.5", "rho-0.25", "images-0.5", "colour-resolution"]
    for record in records.values():
        for key in ("independent_test", "train", "test"):
            assert 0.0 <= record[key] <= 1.0
        # the per-image counts behind the pooled test errors (for the bootstrap)
        labelled = sum(record["test_labelled"])
        assert len(record["test_wrong"]) == len(record["independent_test_wrong"]) == 1
        assert sum(record["test_wrong"]) / labelled == record["test"]
        assert sum(record["independent_test_wrong"]) / labelled == record["independent_test"]
    # two fits per variant: the independent model, then TRW from it
    assert [f[0] for f in fitted] == ["independent", "trw"] * 6
    paper, one_hot, half, rho, small, colour = (fitted[k] for k in (1, 3, 5, 7, 9, 11))
    assert paper[1] is None and rho[1] == 0.25
    assert half[2] == reduced_shape(paper[2], 0.5) != paper[2]  # the grid at half resolution
    assert half[5] == paper[5] == paper[2]  # marginals upsampled to the image, errors counted there
    assert small[2] == small[5] == half[2]  # the image itself at half resolution
    # ... and its test errors counted against the full-resolution masks as well, where every
    # other variant counts them: the same labelled pixels as the paper reading's
    reduced = records["images-0.5"]
    assert sum(reduced["full_test_labelled"]) == sum(records["paper"]["test_labelled"])
    assert sum(reduced["test_labelled"]) < sum(reduced["full_test_labelled"])
    full_test = sum(reduced["full_test_wrong"]) / sum(reduced["full_test_labelled"])
    assert "full_test_wrong" not in records["scale-0.5"]  # counted at full resolution already
    assert colour[2] == colour[5] == (24, 32)  # the fixture's colour images: twice the masks' size
    assert one_hot[3] == paper[3] and not np.array_equal(one_hot[4], paper[4])
    np.testing.assert_array_equal(rho[4], paper[4])  # rho changes the model, not the features
    table = (tmp_path / "horses_ablation_table.txt").read_text()
    assert "one-hot threshold bins" in table and "te-paper" in table and "bootstrap standard deviation" in table
    rows = {line.split()[0]: line.split() for line in table.splitlines() if line.startswith(("paper", "images-0.5"))}
    assert float(rows["images-0.5"][3]) == pytest.approx(full_test, abs=5e-5)  # the table's: full res.
    assert f"images-0.5           independent {reduced['independent_test']:.4f}, TRW 20 {reduced['test']:.4f}" in table
    folder = next((tmp_path / "horses_ablation_checkpoints").iterdir())
    saved = json.loads((folder / "one-hot" / "errors-test1.json").read_text())
    assert saved["features"] == {"threshold_coding": "one_hot"} and saved["test"] == records["one-hot"]["test"]

    # a rerun fits nothing; --report-only too
    monkeypatch.setattr(MarginalCRF, "fit", lambda *a, **k: pytest.fail("a finished variant was fitted again"))
    assert horses_ablation.main(_argv(horses_dir, tmp_path, "paper,one-hot,scale-0.5,rho-0.25,images-0.5,colour-resolution")) == records
    assert horses_ablation.main(_argv(horses_dir, tmp_path, "paper,fourier-1") + ["--report-only"]) == {
        "paper": records["paper"]}
    assert "PARTIAL RUN: 1 of 2 cells finished" in (tmp_path / "horses_ablation_table.txt").read_text()


def test_table_spread_reports_the_saved_cells_with_their_spread(horses_dir, tmp_path):  # noqa: F811
    from sklearn_margcrf import MarginalCRF

    rng = np.random.default_rng(0)
    folder = tmp_path / "horses_checkpoints"
    folder.mkdir()
    weights = {}
    for name in ("independent-1e-04", "ulogistic-trw-40"):
        weights[name] = dict(unary_coef=rng.normal(size=(2, 100)), pairwise_coef=rng.normal(size=(2, 2, 42)))
        np.savez(folder / f"{name}.npz", **weights[name])
    argv = ["--data", str(horses_dir), "--out", str(tmp_path), "--n-jobs", "1", "--split", "1", "--n-test", "2",
            "--table-spread", str(folder)]
    assert horses_ablation.main(argv) == {}
    table = (tmp_path / "horses_test_spread.txt").read_text()
    lines = {line.split("  ")[0]: line.split() for line in table.splitlines() if line.startswith(("independent", "univariate"))}
    assert set(lines) == {"independent", "univariate logistic TRW"}
    # the test error is the TRW model's (40 iterations) on the two test images, pooled
    from sklearn_margcrf.datasets import load_horses
    from sklearn_margcrf.features import HorseFeatures

    test = load_horses(horses_dir, subset="test", n_train=1)
    X = HorseFeatures(dtype=np.float32).transform(test.images)
    trw = horses_ablation._common.restore(MarginalCRF(n_iter=40), weights["ulogistic-trw-40"])
    wrong, total = horses_ablation._common.error_counts(trw, X, [np.asarray(m) for m in test.labels])
    assert float(lines["univariate logistic TRW"][3]) == pytest.approx(wrong / total, abs=5e-5)
    assert lines["univariate logistic TRW"][5] == "0.093"  # the paper's, beside


def test_drop_features_keeps_only_the_paper_readings_and_reruns_need_none(horses_dir, tmp_path, monkeypatch):  # noqa: F811
    from sklearn_margcrf.features import HorseFeatures

    argv = _argv(horses_dir, tmp_path, "paper,one-hot") + ["--drop-features"]
    records = horses_ablation.main(argv)
    cache = tmp_path / "horses_ablation_features"
    assert sorted(p.name for p in cache.iterdir()) == ["edge-default", "node-default"]
    monkeypatch.setattr(HorseFeatures, "transform", lambda *a, **k: pytest.fail("features computed again"))
    assert horses_ablation.main(argv) == records
