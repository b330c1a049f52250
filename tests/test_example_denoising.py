"""examples/binary_denoising.py runs end to end on tiny BSDS300-format data."""

import json

import numpy as np
import pytest

pytest.importorskip("skimage", reason="the example reads JPEGs with scikit-image")
pytest.importorskip("matplotlib", reason="the example saves a figure")


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
    assert "Timings on" in table
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
