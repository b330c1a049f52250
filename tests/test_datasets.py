"""Data-set loaders: on the shared data when present, and on tiny fixtures in
the original formats made here."""

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("skimage", reason="the loaders read JPEGs with scikit-image")

from sklearn_margcrf import datasets
from sklearn_margcrf.datasets import (
    BSDS300_URL,
    HORSES_URL,
    STANFORD_BACKGROUND_URL,
    binary_noise,
    get_data_home,
    load_bsds_denoising,
    load_horses,
    load_stanford_background,
    make_denoising_problem,
    read_regions,
)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def _shared(name):
    folder = SHARED / name
    if not folder.is_dir():
        pytest.skip(f"the shared data set {folder} is absent (see ../shared/data/README.md)")
    return folder


# ---------------------------------------------------------------------------
# Fixtures in the original formats


def _jpeg(path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    from PIL import Image

    Image.fromarray(array).save(path, quality=95)


@pytest.fixture
def horses_dir(tmp_path):
    root = tmp_path / "weizmann_horse_db"
    rng = np.random.default_rng(0)
    for k in range(1, 4):
        mask = np.zeros((12, 16), np.uint8)
        mask[3:9, 4 + k : 12] = 255
        # colour images are stored at twice the mask's size
        rgb = rng.integers(0, 256, size=(24, 32, 3)).astype(np.uint8)
        _jpeg(root / "rgb" / f"horse{k:03d}.jpg", rgb)
        _jpeg(root / "figure_ground" / f"horse{k:03d}.jpg", mask)
    return root


@pytest.fixture
def stanford_dir(tmp_path):
    root = tmp_path / "iccv09Data"
    rng = np.random.default_rng(1)
    for k, shape in enumerate([(6, 8), (8, 6), (6, 8), (5, 7), (7, 5)]):
        ident = f"{k:07d}"
        _jpeg(root / "images" / f"{ident}.jpg", rng.integers(0, 256, size=shape + (3,)).astype(np.uint8))
        labels = rng.integers(-1, 8, size=shape)
        labels[0, 0] = -5  # any negative value is unknown
        (root / "labels").mkdir(parents=True, exist_ok=True)
        np.savetxt(root / "labels" / f"{ident}.regions.txt", labels, fmt="%d")
    return root


@pytest.fixture
def bsds_dir(tmp_path):
    root = tmp_path / "bsds300"
    rng = np.random.default_rng(2)
    shapes = {"101": (32, 48), "102": (48, 32), "103": (32, 48), "201": (32, 48), "202": (48, 32)}
    for ident, shape in shapes.items():
        image = np.zeros(shape + (3,), np.uint8)
        image[: shape[0] // 2] = 220  # a bright top half
        image = np.clip(image + rng.integers(0, 20, size=image.shape), 0, 255).astype(np.uint8)
        _jpeg(root / "images" / f"{ident}.jpg", image)
    (root / "train.txt").write_text("101\n102\n103\n")
    (root / "val.txt").write_text("201\n202\n")
    return root


# ---------------------------------------------------------------------------
# Horses


def test_horses_fixture(horses_dir):
    data = load_horses(horses_dir, n_train=2)
    assert data.ids == ["horse001", "horse002", "horse003"]
    assert list(data.subset) == ["train", "train", "test"]
    np.testing.assert_array_equal(data.train_index, [0, 1])
    np.testing.assert_array_equal(data.test_index, [2])
    for k, (image, labels) in enumerate(zip(data.images, data.labels), start=1):
        assert image.shape == (12, 16, 3) and image.dtype == np.uint8  # resized to the mask
        assert labels.shape == (12, 16) and labels.dtype == np.int64
        assert set(np.unique(labels)) == {0, 1}
        expected = np.zeros((12, 16), int)
        expected[3:9, 4 + k : 12] = 1
        assert np.mean(labels != expected) < 0.02  # JPEG ringing at most
    images, labels = load_horses(horses_dir.parent, n_train=2, subset="test", return_X_y=True)
    assert len(images) == len(labels) == 1
    assert load_horses(horses_dir, ids=["horse002"]).ids == ["horse002"]
    assert load_horses(horses_dir, max_images=2).ids == ["horse001", "horse002"]
    with pytest.raises(ValueError, match="subset"):
        load_horses(horses_dir, subset="validation")
    with pytest.raises(ValueError, match="unknown ids"):
        load_horses(horses_dir, ids=["horse999"])


def test_horses_at_the_colour_images_resolution(horses_dir):
    data = load_horses(horses_dir, n_train=2, resolution="image")
    assert "masks resized to their colour images' size" in data.DESCR
    at_masks = load_horses(horses_dir, n_train=2)
    for k, (image, labels, small) in enumerate(zip(data.images, data.labels, at_masks.labels), start=1):
        assert image.shape == (24, 32, 3) and labels.shape == (24, 32)  # the colour image as stored
        expected = np.zeros((24, 32), int)
        expected[6:18, 2 * (4 + k) : 24] = 1  # the mask's rectangle, twice as large
        assert np.mean(labels != expected) < 0.03
        # each 2 x 2 block of the upsampled labels mostly agrees with its mask pixel
        assert np.mean(labels.reshape(12, 2, 16, 2).mean(axis=(1, 3)).round() != small) < 0.03


def test_horses_shared():
    folder = _shared("horses")
    data = load_horses(folder, max_images=2)
    assert data.ids == ["horse001", "horse002"]
    assert list(data.subset) == ["train", "train"]
    for image, labels in zip(data.images, data.labels):
        assert image.shape == labels.shape + (3,)
        assert set(np.unique(labels)) <= {0, 1} and 0.02 < labels.mean() < 0.9
    test = load_horses(SHARED, subset="test", max_images=1)  # the parent folder works too
    assert test.ids == ["horse201"] and list(test.subset) == ["test"]


# ---------------------------------------------------------------------------
# Stanford Background


def test_read_regions(tmp_path):
    path = tmp_path / "x.regions.txt"
    path.write_text("0 1 -1\n7 -3 2\n")
    labels = read_regions(path)
    np.testing.assert_array_equal(labels, [[0, 1, -1], [7, -1, 2]])
    assert labels.dtype == np.int64


def test_stanford_fixture(stanford_dir):
    data = load_stanford_background(stanford_dir)
    assert len(data.images) == 5 and data.ids[0] == "0000000"
    for image, labels in zip(data.images, data.labels):
        assert image.shape[:2] == labels.shape and image.shape[2] == 3
        assert labels.min() == -1 and labels.max() <= 7
    assert sorted(data.folds) == [0, 1, 2, 3, 4]  # five folds of one image
    again = load_stanford_background(stanford_dir.parent, n_folds=2, random_state=3)
    assert set(again.folds) == {0, 1}
    subset = load_stanford_background(stanford_dir, ids=["0000003", "0000001"])
    assert subset.ids == ["0000001", "0000003"]
    np.testing.assert_array_equal(subset.folds, data.folds[[1, 3]])  # folds do not depend on the subset
    images, labels = load_stanford_background(stanford_dir, max_images=2, return_X_y=True)
    assert len(images) == 2
    assert len(data.target_names) == 8


def test_stanford_contiguous_folds_follow_the_sorted_ids(stanford_dir):
    contiguous = load_stanford_background(stanford_dir, n_folds=2, shuffle=False, random_state=7)
    np.testing.assert_array_equal(contiguous.folds, [0, 0, 0, 1, 1])  # KFold's sizes, in id order
    again = load_stanford_background(stanford_dir, n_folds=2, shuffle=False, random_state=0)
    np.testing.assert_array_equal(again.folds, contiguous.folds)  # random_state unused
    subset = load_stanford_background(stanford_dir, ids=["0000004", "0000001"], n_folds=2, shuffle=False)
    np.testing.assert_array_equal(subset.folds, [0, 1])  # folds of all images, not of the subset
    drawn = {tuple(load_stanford_background(stanford_dir, n_folds=2, random_state=seed).folds) for seed in range(8)}
    assert len(drawn) > 1  # shuffle=True (the default) draws the folds with random_state


@pytest.mark.parametrize("shuffle", [None, "yes", 1])
def test_stanford_bad_shuffle(stanford_dir, shuffle):
    with pytest.raises(ValueError, match="shuffle must be True or False"):
        load_stanford_background(stanford_dir, shuffle=shuffle)


def test_stanford_shared():
    folder = _shared("stanford_background")
    data = load_stanford_background(folder, max_images=4)
    assert data.ids == ["0000047", "0000051", "0000059", "0000072"]
    for image, labels in zip(data.images, data.labels):
        assert image.shape[:2] == labels.shape
        assert labels.min() >= -1 and labels.max() <= 7
    assert set(data.folds) <= set(range(5))
    same = load_stanford_background(folder, ids=data.ids[2:])
    np.testing.assert_array_equal(same.folds, data.folds[2:])


# ---------------------------------------------------------------------------
# BSDS denoising


def test_bsds_fixture(bsds_dir):
    data = load_bsds_denoising(bsds_dir, n_train=2, n_test=2, shape=(20, 30))
    assert data.ids == ["101", "102", "201", "202"]
    assert list(data.subset) == ["train", "train", "test", "test"]
    assert [x.shape for x in data.labels] == [(20, 30), (30, 20), (20, 30), (30, 20)]
    for y, x in zip(data.images, data.labels):
        assert y.shape == x.shape and y.dtype == np.float64 and 0 <= y.min() and y.max() <= 1
        assert set(np.unique(x)) == {0, 1}
        assert x[: x.shape[0] // 3].all() and not x[-x.shape[0] // 3 :].any()  # bright top half
    # the noise of an image depends on (random_state, id) only
    other = load_bsds_denoising(bsds_dir, n_train=0, n_test=1, shape=(20, 30))
    np.testing.assert_array_equal(other.images[0], data.images[2])
    reseeded = load_bsds_denoising(bsds_dir, n_train=0, n_test=1, shape=(20, 30), random_state=1)
    assert not np.array_equal(reseeded.images[0], data.images[2])
    np.testing.assert_array_equal(reseeded.labels[0], data.labels[2])
    with pytest.raises(ValueError, match="asked for"):
        load_bsds_denoising(bsds_dir, n_train=4, n_test=0)


def test_bsds_original_layout(tmp_path, bsds_dir):
    root = tmp_path / "BSDS300"
    for split, ids in (("train", ["101", "102"]), ("test", ["201"])):
        for ident in ids:
            (root / "images" / split).mkdir(parents=True, exist_ok=True)
            (root / "images" / split / f"{ident}.jpg").write_bytes((bsds_dir / "images" / f"{ident}.jpg").read_bytes())
    (root / "iids_train.txt").write_text("101\n102\n")
    (root / "iids_test.txt").write_text("201\n")
    images, labels = load_bsds_denoising(root, n_train=2, n_test=1, shape=(20, 30), return_X_y=True)
    reference = load_bsds_denoising(bsds_dir, n_train=2, n_test=1, shape=(20, 30))
    assert len(images) == 3
    np.testing.assert_array_equal(images[2], reference.images[2])


def test_bsds_shared():
    folder = _shared("bsds300")
    data = load_bsds_denoising(folder, n_train=1, n_test=1)
    assert data.ids == ["2092", "3096"]
    for y, x in zip(data.images, data.labels):
        assert x.shape in ((200, 300), (300, 200)) and y.shape == x.shape
    # the paper's independent-model error at n = 1.25 is about 0.42
    error = np.mean([(y > 0.5) != x for y, x in zip(data.images, data.labels)])
    assert 0.38 < error < 0.46


# ---------------------------------------------------------------------------
# Locations and errors


def test_missing_data_says_where_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "_shared_roots", lambda: [])
    for loader, url in (
        (load_horses, HORSES_URL),
        (load_stanford_background, STANFORD_BACKGROUND_URL),
        (load_bsds_denoising, BSDS300_URL),
    ):
        with pytest.raises(FileNotFoundError, match="Download it from") as info:
            loader(tmp_path / "nothing")
        assert url in str(info.value)
        with pytest.raises(FileNotFoundError, match=str(tmp_path / "empty_home")):
            loader(data_home=tmp_path / "empty_home")


def test_data_home(tmp_path, monkeypatch, horses_dir):
    monkeypatch.setenv("SKLEARN_MARGCRF_DATA", str(tmp_path))
    assert get_data_home() == tmp_path
    assert get_data_home(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("SKLEARN_MARGCRF_DATA")
    assert get_data_home() == Path("~/sklearn_margcrf_data").expanduser()
    # path=None finds the data set under data_home by its usual name
    monkeypatch.setattr(datasets, "_shared_roots", lambda: [])
    assert load_horses(data_home=tmp_path, max_images=1).ids == ["horse001"]


# ---------------------------------------------------------------------------
# Built-in problem


def test_binary_noise_formula():
    x = np.array([[0, 1, 1], [0, 0, 1]])
    t = np.random.RandomState(5).uniform(size=x.shape)
    expected = x * (1 - t**1.5) + (1 - x) * t**1.5
    np.testing.assert_allclose(binary_noise(x, 1.5, 5), expected)
    with pytest.raises(ValueError, match="noise"):
        binary_noise(x, 0)


def test_make_denoising_problem():
    images, labels = make_denoising_problem(4, shape=(30, 40), noise=1.25, random_state=0)
    assert len(images) == len(labels) == 4
    for y, x in zip(images, labels):
        assert y.shape == x.shape == (30, 40)
        assert x.dtype == np.int64 and set(np.unique(x)) == {0, 1}
        assert 0.0 <= y.min() and y.max() <= 1.0
    again, _ = make_denoising_problem(4, shape=(30, 40), noise=1.25, random_state=0)
    np.testing.assert_array_equal(images[3], again[3])
    other, other_labels = make_denoising_problem(4, shape=(30, 40), noise=1.25, random_state=1)
    assert not np.array_equal(labels[0], other_labels[0])
    # little noise at n = 5, a lot at n = 1.25 (the paper's independent errors .13 and .42)
    easy, easy_labels = make_denoising_problem(6, shape=(30, 40), noise=5, random_state=0)
    assert np.mean([(y > 0.5) != x for y, x in zip(easy, easy_labels)]) < 0.2
    assert np.mean([(y > 0.5) != x for y, x in zip(images, labels)]) > 0.35
    with pytest.raises(ValueError, match="n_images"):
        make_denoising_problem(-1)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(n_train=-1), "n_train must be an integer >= 0"),
        (dict(n_train=1.5), "n_train must be an integer >= 0"),
        (dict(n_train="a"), "n_train must be an integer >= 0"),
        (dict(max_images="a"), "max_images must be an integer >= 0"),
        (dict(threshold=0), "threshold must be a number in"),
        (dict(threshold=1000), "threshold must be a number in"),
        (dict(threshold="a"), "threshold must be a number in"),
        (dict(resolution="rgb"), "resolution must be one of"),
    ],
)
def test_horses_bad_arguments(horses_dir, kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_horses(horses_dir, **kwargs)


def test_horses_folder_without_masks_is_not_an_empty_data_set(tmp_path):
    (tmp_path / "horses" / "rgb").mkdir(parents=True)
    (tmp_path / "horses" / "figure_ground").mkdir()
    with pytest.raises(FileNotFoundError, match="no figure_ground"):
        load_horses(tmp_path / "horses")


@pytest.mark.parametrize("n_folds", [0, -3, 2.5])
def test_stanford_bad_fold_count(stanford_dir, n_folds):
    with pytest.raises(ValueError, match="n_folds must be an integer >= 1"):
        load_stanford_background(stanford_dir, n_folds=n_folds)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(shape=(0, 5)), "shape must be a pair of integers >= 1"),
        (dict(shape=(10, 20, 30)), r"shape must be a pair"),
        (dict(n_test=-2), "n_test must be an integer >= 0"),
    ],
)
def test_bsds_bad_arguments(bsds_dir, kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_bsds_denoising(bsds_dir, **kwargs)


@pytest.mark.parametrize("labels", [[0, 1, 2], [0, -1, 1], [0.0, np.nan, 1.0]])
def test_binary_noise_needs_binary_labels(labels):
    with pytest.raises(ValueError, match="binary image of 0s and 1s"):
        binary_noise(np.array(labels), 1.5, 0)


@pytest.mark.parametrize("noise", ["a", np.inf, np.nan, True])
def test_binary_noise_level_must_be_a_positive_number(noise):
    with pytest.raises(ValueError, match="noise must be a positive number"):
        binary_noise(np.array([0, 1]), noise, 0)


@pytest.mark.parametrize("shape", [(3, 40), (30, 2.5), (30,)])
def test_make_denoising_problem_bad_shape(shape):
    with pytest.raises(ValueError, match="shape must be"):
        make_denoising_problem(1, shape=shape)
