"""examples/binary_denoising.py runs end to end on tiny BSDS300-format data."""

import json

import numpy as np
import pytest

pytest.importorskip("skimage", reason="the example reads JPEGs with scikit-image")
pytest.importorskip("matplotlib", reason="the example saves a figure")


import _common  # noqa: E402
import binary_denoising  # noqa: E402
from test_datasets import bsds_dir  # noqa: E402, F401  (the tiny BSDS300 fixture: 3 train, 2 test images)


def test_binary_denoising_example(bsds_dir, tmp_path):  # noqa: F811
    out = tmp_path / "results"
    rows = ["surrogate", "ulogistic", "smooth50", "pseudo", "independent"]
    results = binary_denoising.main([
        "--data", str(bsds_dir.parent), "--out", str(out), "--n-jobs", "1",
        "--n-train", "2", "--n-test", "1", "--scale", "0.1", "--max-iter", "2",
        "--noise", "1.25", "5", "--rows", ",".join(rows),
    ])
    assert set(results) == {1.25, 5.0}
    for level in results.values():
        assert list(level) == rows
        for row in level.values():
            assert 0.0 <= row["train"] <= 1.0 and 0.0 <= row["test"] <= 1.0
            assert row["seconds"] >= 0.0 and row["lbfgs_iterations"] <= 2
    table = (out / "binary_denoising_table.txt").read_text()
    assert "surrogate likelihood" in table and "independent" in table and "back-propagation" in table
    assert "Timings: wall clock of each fit, summed over the runs that fitted it (this run: " in table
    assert (out / "binary_denoising_marginals.png").stat().st_size > 0
    saved = json.loads((out / "binary_denoising_results.json").read_text())
    assert set(saved) == {"1.25", "5"}


def test_binary_denoising_truncated(bsds_dir, tmp_path):  # noqa: F811
    out = tmp_path / "results"
    results = binary_denoising.main([
        "--data", str(bsds_dir.parent), "--out", str(out), "--n-jobs", "1",
        "--n-train", "1", "--n-test", "1", "--scale", "0.1", "--max-iter", "2", "--noise", "1.5",
        "--rows", "clogistic,piecewise", "--gradient-mode", "truncated", "--n-iter", "5",
    ])
    errors = [v for row in results[1.5].values() for v in (row["train"], row["test"])]
    assert np.all((np.array(errors) >= 0) & (np.array(errors) <= 1))
    assert "truncated fitting with 5 iterations" in (out / "binary_denoising_table.txt").read_text()
    assert (out / "binary_denoising_marginals.png").exists()


def test_binary_denoising_missing_data(tmp_path):
    with pytest.raises(SystemExit, match="BSDS300"):
        binary_denoising.main(["--data", str(tmp_path / "nowhere"), "--out", str(tmp_path), "--n-jobs", "1"])


def _argv(data, out, *extra):
    return ["--data", str(data), "--out", str(out), "--n-jobs", "1", "--n-train", "2", "--n-test", "1",
            "--scale", "0.1", "--noise", "1.25", *extra]


def test_binary_denoising_rerun_resumes_from_its_checkpoints(bsds_dir, tmp_path, monkeypatch):  # noqa: F811
    from sklearn_margcrf import MarginalCRF

    argv = _argv(bsds_dir, tmp_path, "--max-iter", "3", "--segment", "2", "--rows", "surrogate,smooth5,pseudo,independent")
    first = binary_denoising.main(argv)
    monkeypatch.setattr(MarginalCRF, "fit", lambda *a: pytest.fail("a finished cell was fitted again"))
    assert binary_denoising.main(argv) == first
    assert all(row["segments"] == 2 for row in first[1.25].values())  # 3 iterations in segments of 2


def test_binary_denoising_report_only_shows_the_finished_cells(bsds_dir, tmp_path, monkeypatch):  # noqa: F811
    from sklearn_margcrf import MarginalCRF

    done = binary_denoising.main(_argv(bsds_dir, tmp_path, "--max-iter", "2", "--rows", "ulogistic,independent"))
    monkeypatch.setattr(MarginalCRF, "fit", lambda *a: pytest.fail("--report-only fitted"))
    report = binary_denoising.main(
        _argv(bsds_dir, tmp_path, "--max-iter", "2", "--rows", "ulogistic,clogistic,independent", "--report-only")
    )
    assert report == done and list(report[1.25]) == ["ulogistic", "independent"]
    table = (tmp_path / "binary_denoising_table.txt").read_text()
    assert "PARTIAL RUN: 2 of 3 cells finished; blank cells are not run yet." in table
    assert "(this report: " in table and "(this run: " not in table  # it fitted nothing
    errors, timings = [line for line in table.splitlines() if line.startswith("clique logistic")]
    assert errors.split("|")[0].strip() == timings.strip() == "clique logistic"  # blank: not run yet
    assert (tmp_path / "binary_denoising_marginals.png").stat().st_size > 0


def test_binary_denoising_starts_as_init_independent(bsds_dir, tmp_path):  # noqa: F811
    # one segment: the checkpointed fits are the estimator's own, from the same start
    argv = _argv(bsds_dir, tmp_path, "--max-iter", "2", "--rows", "ulogistic,smooth5")
    binary_denoising.main(argv)
    args = binary_denoising._settings(_common.parse_args("", argv, binary_denoising._arguments))
    X, y, _ = binary_denoising._load(args, 1.25)["train"]
    store = _common.Checkpoints(args.checkpoints)
    assert store.load("n1.25-surrogate")["done"]  # smooth classification's start, though not a row
    for key in ("ulogistic", "smooth5"):
        with _common.ignore_convergence_warnings():
            reference = binary_denoising._model(args, key).fit(X, y)
        saved = store.load(f"n1.25-{key}")
        np.testing.assert_allclose(saved["unary_coef"], reference.unary_coef_, rtol=1e-10)
        np.testing.assert_allclose(saved["pairwise_coef"], reference.pairwise_coef_, rtol=1e-10)
