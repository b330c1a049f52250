"""Smoke test of examples/perturbation_multipliers.py on a tiny configuration."""

import importlib

import numpy as np
import pytest

pytest.importorskip("matplotlib")

@pytest.fixture(scope="module")
def script():
    return importlib.import_module("perturbation_multipliers")  # examples/ is on sys.path (conftest.py)


def test_perturbation_multipliers_tiny(script, tmp_path, capsys):
    result = script.main(
        ["--grid", "4", "--scales", "0.1", "1", "--n-models", "1", "--exponents", "-8", "0", "2",
         "--n-jobs", "1", "--out", str(tmp_path)]
    )
    errors = result["errors"]  # (methods, scales, models, sides, multipliers)
    assert errors.shape == (2, 2, 1, 3, 3)
    assert np.all(np.isfinite(errors)) and np.all(errors >= 0)
    # the finite-difference "true" gradient agrees with back-propagation
    assert np.all(result["backprop_gap"] < 1e-6)
    m1 = result["exponents"].index(0)
    two = result["sides"].index(2)
    weak = result["scales"].index(0.1)
    # 2-sided perturbation at m = 1 on a weakly coupled model: accurate
    assert np.all(errors[:, weak, :, two, m1] < 1e-3)
    # too small a step: numerical error dominates
    assert np.all(errors[:, weak, :, :, 0] > errors[:, weak, :, :, m1])
    # more sides are better at the largest step
    assert np.all(errors[:, weak, :, 0, -1] > errors[:, weak, :, 1, -1])
    assert (tmp_path / "perturbation_multipliers.png").stat().st_size > 0
    assert (tmp_path / "perturbation_multipliers.txt").exists()
    out = capsys.readouterr().out
    assert "2-sided" in out and "Our results" in out
