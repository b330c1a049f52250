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
