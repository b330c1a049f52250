"""examples/backgrounds.py end to end on a tiny Stanford Background fixture
(original format: images/<id>.jpg, labels/<id>.regions.txt)."""

import json

import numpy as np
import pytest

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
