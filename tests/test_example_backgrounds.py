"""examples/backgrounds.py end to end on a tiny Stanford Background fixture
(original format: images/<id>.jpg, labels/<id>.regions.txt)."""

import json
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

pytest.importorskip("skimage", reason="the features need scikit-image")
pytest.importorskip("matplotlib", reason="the example saves figures")



def make_stanford_fixture(root, n_images=4, shape=(30, 40), seed=0):
    """Tiny Stanford Background data set: sky above, road below, some
    foreground, a few unknown (negative) labels, as the original files."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "labels").mkdir(parents=True, exist_ok=True)
    for k in range(n_images):
        h, w = shape
        labels = np.zeros(shape, np.int64)  # sky
        horizon = h // 2 + int(rng.integers(-3, 4))
        labels[horizon:] = 2  # road
        left = int(rng.integers(0, w - 10))
        labels[horizon - 6 : horizon + 4, left : left + 8] = 7  # foreground object
        labels[:2, :3] = -1  # unknown
        colours = np.array([[120, 170, 250], [0, 100, 0], [128, 128, 128], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [250, 190, 0]])
        image = colours[np.maximum(labels, 0)] + rng.integers(-25, 26, size=shape + (3,))
        ident = f"{k:07d}"
        Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(root / "images" / f"{ident}.jpg", quality=95)
        np.savetxt(root / "labels" / f"{ident}.regions.txt", labels, fmt="%d")
    return root


def test_backgrounds_example(tmp_path):
    import backgrounds

    make_stanford_fixture(tmp_path / "data" / "stanford_background")
    out = tmp_path / "out"
    result = backgrounds.main([
        "--data", str(tmp_path / "data"), "--out", str(out), "--n-jobs", "1",
        "--n-folds", "2", "--iters", "2", "--max-iter", "2", "--incremental", "0",
    ])
    for name in ("backgrounds_table.txt", "backgrounds_marginals.png", "backgrounds_results.json"):
        assert (out / name).stat().st_size > 0
    errors = result["errors"]
    assert set(errors) == {(key, 2) for key in ("surrogate_em", "univariate_logistic", "clique_logistic")} | {
        (key, None) for key in ("pseudolikelihood", "piecewise", "independent")
    }
    for train, test in errors.values():
        assert 0.0 <= train <= 1.0 and 0.0 <= test <= 1.0
    table = (out / "backgrounds_table.txt").read_text()
    assert "surrogate EM" in table and "paper" in table and "0.519" in table
    raw = json.loads((out / "backgrounds_results.json").read_text())
    assert len(raw["fits"]) == 6


def test_backgrounds_incremental_and_rows(tmp_path):
    import backgrounds

    make_stanford_fixture(tmp_path / "data" / "stanford_background", n_images=4, seed=1)
    out = tmp_path / "out"
    result = backgrounds.main([
        "--data", str(tmp_path / "data"), "--out", str(out), "--n-jobs", "1", "--n-folds", "2",
        "--folds", "0", "--iters", "2", "--max-iter", "2", "--incremental", "1",
        "--rows", "univariate_logistic,independent",
    ])
    assert set(result["errors"]) == {("univariate_logistic", 2), ("independent", None)}
    for train, test in result["errors"].values():
        assert 0.0 <= train <= 1.0 and 0.0 <= test <= 1.0
    assert (out / "backgrounds_marginals.png").exists()


def test_schedule_work():
    import backgrounds

    # 32 x 1000 + 64 x 500 + 100 x 250
    assert backgrounds.schedule_work(100, 32, 1000) == 32 * 1000 + 64 * 500 + 100 * 250
    assert backgrounds.schedule_work(10, None, 7) == 70


def test_remaining_estimate_is_the_protocol_less_the_fits_done():
    """Two of five folds of the paper's protocol: what is left is the
    estimate less the fitting done; a run of another protocol, or a
    complete one, has no such line."""
    import argparse
    import types

    import backgrounds

    fits = [(key, n) for key, (_, _, truncated) in backgrounds.ROWS.items()
            for n in (backgrounds.ITERATIONS if truncated else [None])]
    n_train = 715 - 143
    work = backgrounds.schedule_work(n_train, 32, 1000)
    times = {fit: 3600.0 * 2 for fit in fits}  # every fit measured over two folds: 1 h each
    result = dict(
        data=types.SimpleNamespace(images=[None] * 715), fits=fits, times=times,
        work={fit: 2 * work for fit in fits}, start_times={1e-3: (1800.0, 2 * n_train * 30)},
        finished=2 * len(fits),
    )
    args = argparse.Namespace(n_folds=5, incremental=32, max_iter=1000, iters=list(backgrounds.ITERATIONS),
                              rows=list(backgrounds.ROWS))
    estimate, _ = backgrounds.full_protocol_estimate(result, args)
    line = backgrounds.remaining_estimate(result, args, estimate)
    done = 2 * len(fits) + 0.5
    assert f"{2 * len(fits)} of the protocol's {5 * len(fits)} fits, {done:.1f} h" in line
    assert f"remaining at this cost: {(estimate / 3600 - done):.1f} h" in line
    assert "no finished fit yet" not in line
    # the fits of a row not measured yet are named (their cost is not in the figure)
    partial = dict(result, work={fit: (0 if fit[0] == "piecewise" else w) for fit, w in result["work"].items()})
    assert "rows with no finished fit yet (piecewise" in backgrounds.remaining_estimate(partial, args, estimate)
    assert backgrounds.remaining_estimate(dict(result, finished=5 * len(fits)), args, estimate) == ""
    for other in (dict(n_folds=2), dict(max_iter=30), dict(incremental=None), dict(rows=["independent"])):
        assert backgrounds.remaining_estimate(result, argparse.Namespace(**{**vars(args), **other}), estimate) == ""
    assert backgrounds.remaining_estimate(dict(result, data=types.SimpleNamespace(images=[None] * 40)),
                                          args, estimate) == ""


def _recording_fits(monkeypatch):
    """The keyword arguments of every MarginalCRF.fit call, in a list."""
    from sklearn_margcrf import MarginalCRF

    real_fit, calls = MarginalCRF.fit, []

    def fit(self, X, y, **kwargs):
        calls.append(kwargs)
        return real_fit(self, X, y, **kwargs)

    monkeypatch.setattr(MarginalCRF, "fit", fit)
    return calls


def test_backgrounds_rerun_reads_its_records_and_resumes_an_interrupted_fit(tmp_path, monkeypatch):
    import backgrounds
    from sklearn_margcrf import MarginalCRF
    from sklearn_margcrf.callbacks import Checkpoint

    make_stanford_fixture(tmp_path / "data" / "stanford_background", n_images=4, seed=2)
    out = tmp_path / "out"
    # two training images: stages of 1 image x 4 L-BFGS iterations, then 2 x 2
    argv = ["--data", str(tmp_path / "data"), "--out", str(out), "--n-jobs", "1", "--n-folds", "2", "--folds", "0",
            "--iters", "2", "--max-iter", "4", "--incremental", "1", "--segment", "1",
            "--rows", "univariate_logistic,independent"]
    real_save = Checkpoint.save

    def save_then_die(self, progress):
        real_save(self, progress)
        if progress.stage_index == 1 and progress.n_iter == 1 and "univariate" in self.path:
            raise KeyboardInterrupt("killed after a save in the second stage")

    monkeypatch.setattr(Checkpoint, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        backgrounds.main(argv)
    monkeypatch.setattr(Checkpoint, "save", real_save)
    folder = next((out / "backgrounds_checkpoints").iterdir())
    assert (folder / "fold0-univariate_logistic-2it.fit.npz").exists()
    assert not (folder / "fold0-univariate_logistic-2it.record.json").exists()

    calls = _recording_fits(monkeypatch)
    resumed = backgrounds.main(argv)
    # the interrupted fit resumed in its second stage after 1 iteration, then the independent row ran afresh
    assert [c.get("stage_init") for c in calls] == [(1, 1), None]
    record = json.loads((folder / "fold0-univariate_logistic-2it.record.json").read_text())
    assert record["runs"] == 2 and record["lbfgs_iterations"] >= 2
    assert not (folder / "fold0-univariate_logistic-2it.fit.npz").exists()  # kept only while unfinished

    # a third run fits nothing and reports the same errors
    monkeypatch.setattr(MarginalCRF, "fit", lambda *a, **k: pytest.fail("a finished fit was fitted again"))
    assert backgrounds.main(argv)["errors"] == resumed["errors"]
    assert backgrounds.main(argv + ["--report-only"])["errors"] == resumed["errors"]


def test_backgrounds_report_only_shows_the_finished_fits(tmp_path, monkeypatch):
    import backgrounds
    from sklearn_margcrf import MarginalCRF

    make_stanford_fixture(tmp_path / "data" / "stanford_background", n_images=4, seed=3)
    out = tmp_path / "out"
    argv = ["--data", str(tmp_path / "data"), "--out", str(out), "--n-jobs", "1", "--n-folds", "2", "--folds", "0",
            "--iters", "2", "--max-iter", "2", "--incremental", "0"]
    done = backgrounds.main(argv + ["--rows", "independent"])
    monkeypatch.setattr(MarginalCRF, "fit", lambda *a, **k: pytest.fail("--report-only fitted"))
    report = backgrounds.main(argv + ["--rows", "univariate_logistic,independent", "--report-only"])
    assert report["errors"][("independent", None)] == done["errors"][("independent", None)]
    assert np.isnan(report["errors"][("univariate_logistic", 2)][0])
    assert "PARTIAL RUN: 1 of 2 cells finished" in (out / "backgrounds_table.txt").read_text()
    # other settings do not read these records: they fit
    with pytest.raises(pytest.fail.Exception, match="--report-only fitted"):
        backgrounds.main(argv[:-1] + ["1", "--rows", "independent"])


def test_backgrounds_dtype_is_the_fits_precision_with_checkpoints_of_its_own(tmp_path, monkeypatch):
    import backgrounds
    from sklearn_margcrf import MarginalCRF

    make_stanford_fixture(tmp_path / "data" / "stanford_background", n_images=4, seed=4)
    real_fit, seen = MarginalCRF.fit, []
    monkeypatch.setattr(MarginalCRF, "fit", lambda self, *a, **k: seen.append(self.dtype) or real_fit(self, *a, **k))
    argv = ["--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--n-jobs", "1", "--n-folds", "2",
            "--folds", "0", "--iters", "2", "--max-iter", "1", "--incremental", "0", "--rows", "univariate_logistic"]
    backgrounds.main(argv + ["--dtype", "float32"])
    assert seen == ["float32"] * 2  # the shared independent start, then the row
    backgrounds.main(argv)  # float64 does not read the float32 records: it fits
    assert seen == ["float32"] * 2 + ["float64"] * 2
    folders = sorted(p.name for p in (tmp_path / "out" / "backgrounds_checkpoints").iterdir())
    assert len(folders) == 2 and folders[0] + "-float32" == folders[1]


def test_backgrounds_cache_gives_the_same_results_and_spares_the_features(tmp_path, monkeypatch):
    import backgrounds

    from sklearn_margcrf.features import BackgroundFeatures

    make_stanford_fixture(tmp_path / "data" / "stanford_background", n_images=4, seed=2)
    argv = ["--data", str(tmp_path / "data"), "--n-jobs", "1", "--n-folds", "2", "--folds", "0", "--iters", "2",
            "--max-iter", "2", "--incremental", "0", "--rows", "univariate_logistic"]
    plain = backgrounds.main(argv + ["--out", str(tmp_path / "plain")])
    cache = tmp_path / "features"
    cached = backgrounds.main(argv + ["--out", str(tmp_path / "cached"), "--cache", str(cache)])
    assert cached["errors"] == plain["errors"]
    assert len(list((cache / "scale0.2").glob("*.node.npy"))) == 4  # one file per image, by id
    # a rerun elsewhere (no checkpoints to read) fits again but reads the features from the cache
    monkeypatch.setattr(BackgroundFeatures, "transform", lambda *a, **k: pytest.fail("features computed again"))
    again = backgrounds.main(argv + ["--out", str(tmp_path / "again"), "--cache", str(cache)])
    assert again["errors"] == plain["errors"]


def test_backgrounds_rows_share_one_independent_start_per_fold_and_lambda(tmp_path, monkeypatch):
    """Each fold fits the independent model once per lambda, and the rows start
    from it: the same weights as each row's own init="independent" fit."""
    import backgrounds

    from sklearn_margcrf import MarginalCRF
    from sklearn_margcrf.datasets import load_stanford_background

    make_stanford_fixture(tmp_path / "data" / "stanford_background", n_images=4, seed=3)
    real_fit, fits = MarginalCRF.fit, []

    def recording_fit(self, X, y, **kwargs):
        fits.append((self.inference, self.loss, self.reg, "unary_coef_init" in kwargs))
        return real_fit(self, X, y, **kwargs)

    monkeypatch.setattr(MarginalCRF, "fit", recording_fit)
    out = tmp_path / "out"
    backgrounds.main([
        "--data", str(tmp_path / "data"), "--out", str(out), "--n-jobs", "1", "--n-folds", "2", "--iters", "2",
        "--max-iter", "3", "--incremental", "0", "--rows", "univariate_logistic,clique_logistic,independent",
    ])
    per_fold = [("independent", "univariate_logistic", 1e-3, False), ("trw", "univariate_logistic", 1e-3, True),
                ("trw", "clique_logistic", 1e-3, True), ("independent", "univariate_logistic", 1e-4, False)]
    assert fits == per_fold * 2
    table = (out / "backgrounds_table.txt").read_text()
    assert "independent start 1e-3" in table and "independent start 1e-4" not in table

    # the clique logistic row of fold 0 is the fit that init="independent" makes by itself
    monkeypatch.setattr(MarginalCRF, "fit", real_fit)
    data = load_stanford_background(tmp_path / "data" / "stanford_background", n_folds=2, random_state=0)
    X = backgrounds.compute_features(data.images, 0.2, 1)
    train = [i for i, f in enumerate(data.folds) if f != 0]
    with warnings.catch_warnings():  # 3 L-BFGS iterations, as the run's: they stop before converging
        warnings.simplefilter("ignore", ConvergenceWarning)
        own = MarginalCRF(loss="clique_logistic", reg=1e-3, n_iter=2, n_states=8, max_iter=3, objective_tol=0.0,
                          random_state=0).fit([X[i] for i in train], [data.labels[i] for i in train])
    folder = next((out / "backgrounds_checkpoints").iterdir())
    with np.load(folder / "fold0-clique_logistic-2it.weights.npz") as saved:
        np.testing.assert_allclose(saved["unary_coef"], own.unary_coef_, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(saved["pairwise_coef"], own.pairwise_coef_, rtol=1e-9, atol=1e-12)


def test_backgrounds_rho_reaches_the_trw_fits_with_checkpoints_of_their_own(tmp_path, monkeypatch):
    import backgrounds
    from sklearn_margcrf import MarginalCRF

    make_stanford_fixture(tmp_path / "data" / "stanford_background", n_images=4, seed=5)
    real_fit, seen = MarginalCRF.fit, []
    monkeypatch.setattr(MarginalCRF, "fit", lambda self, *a, **k: seen.append((self.inference, self.rho)) or real_fit(self, *a, **k))
    out = tmp_path / "out"
    argv = ["--data", str(tmp_path / "data"), "--out", str(out), "--n-jobs", "1", "--n-folds", "2", "--folds", "0",
            "--iters", "2", "--max-iter", "3", "--incremental", "0", "--rows", "clique_logistic"]
    backgrounds.main(argv)
    # the default "auto" on these 48-node grids is the uniform spanning tree's rho; the forest cover's is 0.5
    backgrounds.main(argv + ["--rho", "forest_cover"])
    assert seen == [("independent", None), ("trw", None), ("independent", None), ("trw", "forest_cover")]
    folders = sorted(p.name for p in (out / "backgrounds_checkpoints").iterdir())
    assert len(folders) == 2 and folders[0] + "-rho-forest_cover" == folders[1]
    weights = [np.load(out / "backgrounds_checkpoints" / f / "fold0-clique_logistic-2it.weights.npz")["pairwise_coef"]
               for f in folders]
    assert not np.allclose(weights[0], weights[1])  # another rho, another fit
    with pytest.raises(SystemExit):
        backgrounds.main(argv + ["--rho", "-0.5"])


def test_backgrounds_objective_tol_is_the_stopping_rule_of_every_fit(tmp_path, monkeypatch):
    import backgrounds
    from sklearn_margcrf import MarginalCRF

    make_stanford_fixture(tmp_path / "data" / "stanford_background", n_images=4, seed=6)
    real_fit, seen = MarginalCRF.fit, []
    monkeypatch.setattr(MarginalCRF, "fit", lambda self, *a, **k: seen.append(self.objective_tol) or real_fit(self, *a, **k))
    out = tmp_path / "out"
    argv = ["--data", str(tmp_path / "data"), "--out", str(out), "--n-jobs", "1", "--n-folds", "2", "--folds", "0",
            "--iters", "2", "--max-iter", "30", "--incremental", "0", "--rows", "univariate_logistic"]
    backgrounds.main(argv)
    backgrounds.main(argv + ["--objective-tol", "0.5"])
    assert seen == [0.0, 0.0, 0.5, 0.5]  # the shared independent start follows the rule, as init="independent" would
    folders = sorted((out / "backgrounds_checkpoints").iterdir())
    assert len(folders) == 2 and folders[0].name + "-objtol0.5" == folders[1].name
    iterations = [json.loads((f / "fold0-univariate_logistic-2it.record.json").read_text())["lbfgs_iterations"]
                  for f in folders]
    assert iterations[0] == 30 and 10 < iterations[1] < 30  # the paper's runs to max_iter; the rule stops


def test_backgrounds_contiguous_folds_train_on_the_images_of_the_other_id_runs(tmp_path, monkeypatch):
    import backgrounds
    from sklearn_margcrf import MarginalCRF
    from sklearn_margcrf.datasets import load_stanford_background

    data_dir = tmp_path / "data"
    make_stanford_fixture(data_dir / "stanford_background", n_images=4, seed=7)
    data = load_stanford_background(data_dir / "stanford_background", n_folds=2, random_state=0)
    assert data.folds.tolist() != [0, 0, 1, 1]  # the random folds differ from the contiguous ones
    real_fit, trained_on = MarginalCRF.fit, []

    def recording_fit(self, X, y, **kwargs):
        trained_on.append(sorted(int(np.sum(labels)) for labels in y))
        return real_fit(self, X, y, **kwargs)

    monkeypatch.setattr(MarginalCRF, "fit", recording_fit)
    out = tmp_path / "out"
    argv = ["--data", str(data_dir), "--out", str(out), "--n-jobs", "1", "--n-folds", "2", "--folds", "0",
            "--iters", "2", "--max-iter", "1", "--incremental", "0", "--rows", "independent"]
    backgrounds.main(argv)
    backgrounds.main(argv + ["--contiguous-folds"])
    label_sums = [int(np.sum(labels)) for labels in data.labels]
    assert trained_on[0] == sorted(s for s, f in zip(label_sums, data.folds) if f != 0)
    assert trained_on[1] == sorted(label_sums[2:])  # fold 0 holds the first two ids: train on the last two
    assert "contiguous in id order" in (out / "backgrounds-contiguous_table.txt").read_text()
    assert "contiguous" not in (out / "backgrounds_table.txt").read_text()  # each run has a table of its own
    folders = sorted(p.name for p in (out / "backgrounds_checkpoints").iterdir())
    assert len(folders) == 2 and folders[0] + "-contiguous" == folders[1]
