"""examples/classifier_features.py --quick, on a few of the shared horses."""

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("skimage", reason="the example reads JPEGs with scikit-image")
pytest.importorskip("matplotlib", reason="the example saves a figure")

# ../shared/data beside the repository, or the package's data home variable
SHARED = Path(os.environ.get("SKLEARN_MARGCRF_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def test_classifier_features_example_quick(tmp_path):
    if not (SHARED / "horses").is_dir():
        pytest.skip(f"the shared horses data set {SHARED / 'horses'} is absent (see ../shared/data/README.md; "
                    "SKLEARN_MARGCRF_DATA names another folder)")
    import classifier_features

    out = tmp_path / "out"
    results = classifier_features.main([
        "--data", str(SHARED), "--quick", "--out", str(out), "--n-jobs", "1", "--n-train", "4", "--n-test", "2",
        "--scale", "0.1", "--max-iter", "3", "--n-iter", "3", "--boosting-iter", "5", "--cv", "2",
    ])
    assert list(results) == ["boosting", "boosting + CRF", "paper: univariate logistic TRW", "paper: independent"]
    for record in results.values():
        assert 0.0 <= record["train"] <= 1.0 and 0.0 <= record["test"] <= 1.0
    assert results["boosting"]["seconds"] is None and results["boosting + CRF"]["seconds"] > 0
    table = (out / "classifier_features_table.txt").read_text()
    assert "boosting + CRF" in table and "0.093" in table  # the paper's test error beside ours
    assert json.loads((out / "classifier_features_results.json").read_text()) == results
    assert (out / "classifier_features_marginals.png").stat().st_size > 0
