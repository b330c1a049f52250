"""examples/fit_curves.py: records a fit's curve, measures test errors,
replays the stopping rule, and resumes a stopped run."""

import json

import numpy as np
import pytest

pytest.importorskip("skimage", reason="the example reads JPEGs with scikit-image")
pytest.importorskip("matplotlib", reason="the example saves a figure")


import fit_curves  # noqa: E402
from test_datasets import bsds_dir  # noqa: E402, F401  (the tiny BSDS300 fixture: 3 train, 2 test images)


def test_stop_iteration_is_the_rule_of_the_estimator():
    f = [None, 10.0, 9.0, 8.99, 8.985, 8.984, 5.0]
    # window 2: at k = 3, 10 - 8.99 = 1.01 is not below 0.002 * 8.99; at k = 4, 9 - 8.985 = 0.015 < 0.018
    assert fit_curves.stop_iteration(f, 2, 2e-3) == 4
    assert fit_curves.stop_iteration(f, 2, 1e-4) is None
    assert fit_curves.stop_iteration(f, 1, 1e-3) == 4  # 8.99 - 8.985 < 0.008985


def test_fit_curves_denoising_records_resumes_and_reports(bsds_dir, tmp_path):  # noqa: F811
    out = tmp_path / "curves"
    common = ["denoising", "--data", str(bsds_dir.parent), "--out", str(out), "--n-jobs", "1",
              "--n-train", "2", "--n-test", "1", "--scale", "0.1"]
    fit_curves.main(common + ["--max-iter", "2"])
    [path] = out.glob("fit_curve_*.json")
    first = json.loads(path.read_text())
    assert [it["n_iter"] for it in first["iterations"]] == [0, 1, 2]
    assert set(first["test_error"]) == {"0", "1", "2"}
    # a rerun with a larger budget continues from the last recorded weights
    fit_curves.main(common + ["--max-iter", "4"])
    record = json.loads(path.read_text())
    assert [it["n_iter"] for it in record["iterations"]][:3] == [0, 1, 2]
    assert record["iterations"][-1]["n_iter"] <= 4 and len(record["iterations"]) > 3
    np.testing.assert_array_equal(record["iterations"][2]["unary_coef"], first["iterations"][2]["unary_coef"])
    assert all(0.0 <= e <= 1.0 for e in record["test_error"].values())
    fit_curves.main(["report", "--out", str(out)])
    text = (out / "fit_curves.txt").read_text()
    assert "n_iter_no_change" in text and record["name"] in text
    assert (out / "fit_curves.png").stat().st_size > 0


def test_fit_curves_dtype_is_the_fits_precision_with_a_record_of_its_own(bsds_dir, tmp_path):  # noqa: F811
    out = tmp_path / "curves"
    common = ["denoising", "--data", str(bsds_dir.parent), "--out", str(out), "--n-jobs", "1",
              "--n-train", "2", "--n-test", "1", "--scale", "0.1", "--max-iter", "1"]
    fit_curves.main(common)
    fit_curves.main(common + ["--dtype", "float32"])
    records = {p.name: json.loads(p.read_text()) for p in out.glob("fit_curve_*.json")}
    [name64] = [n for n in records if not n.endswith("-float32.json")]
    r64, r32 = records[name64], records[name64.replace(".json", "-float32.json")]
    assert (r64["params"]["dtype"], r32["params"]["dtype"]) == ("float64", "float32")
    f64, f32 = r64["iterations"][1]["objective"], r32["iterations"][1]["objective"]
    assert f32 != f64 and abs(f32 - f64) < 1e-4 * abs(f64)  # the same fit, in the other precision


def test_fit_curves_no_precondition_is_the_papers_lbfgs_with_a_record_of_its_own(bsds_dir, tmp_path):  # noqa: F811
    out = tmp_path / "curves"
    common = ["denoising", "--data", str(bsds_dir.parent), "--out", str(out), "--n-jobs", "1",
              "--n-train", "2", "--n-test", "1", "--scale", "0.1", "--max-iter", "2"]
    fit_curves.main(common)
    fit_curves.main(common + ["--no-precondition"])
    records = {p.name: json.loads(p.read_text()) for p in out.glob("fit_curve_*.json")}
    [name] = [n for n in records if not n.endswith("-noprecondition.json")]
    plain = records[name.replace(".json", "-noprecondition.json")]
    assert (records[name]["params"]["precondition"], plain["params"]["precondition"]) == (True, False)
    # the same objective along another path (from the independent start,
    # which the default stopping rule ends elsewhere without preconditioning)
    assert records[name]["iterations"][1]["objective"] != plain["iterations"][1]["objective"]
