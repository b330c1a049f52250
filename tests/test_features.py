"""Image feature transformers: shapes, hand-checked values, resolution, Pipeline."""

import itertools
import pickle

import numpy as np
import pytest

pytest.importorskip("skimage", reason="the image transformers need scikit-image")

from sklearn.base import clone
from sklearn.utils import get_tags
from sklearn.utils.estimator_checks import (
    check_get_params_invariance,
    check_no_attributes_set_in_init,
    check_parameters_default_constructible,
    check_set_params,
)

from sklearn_margcrf._graph import grid_edges
from sklearn_margcrf.features import (
    RGB_THRESHOLDS,
    SOBEL_THRESHOLDS,
    BackgroundFeatures,
    CombinedFeatures,
    DenoisingFeatures,
    HorseFeatures,
    binary_vectors,
    combine_samples,
    dense_hog,
    edge_orientation,
    fourier_features,
    position_features,
    rgb_difference,
    sobel_magnitude,
    quantile_thresholds,
    threshold_features,
    split_by_orientation,
)
from sklearn_margcrf.sample import CRFSample, labels_to_grid, marginals_to_image

TRANSFORMERS = [DenoisingFeatures, HorseFeatures, BackgroundFeatures]


def _rng_image(shape, seed=0):
    return np.random.default_rng(seed).uniform(size=shape)


# ---------------------------------------------------------------------------
# scikit-learn citizenship


@pytest.mark.parametrize("cls", TRANSFORMERS)
def test_sklearn_data_free_checks(cls):
    name = cls.__name__
    check_no_attributes_set_in_init(name, cls())
    check_parameters_default_constructible(name, cls())
    check_get_params_invariance(name, cls())
    check_set_params(name, cls())
    assert name in repr(cls())
    tags = get_tags(cls())
    assert tags.requires_fit is False
    assert tags.input_tags.two_d_array is False


@pytest.mark.parametrize("cls", TRANSFORMERS)
def test_fit_is_a_stateless_no_op(cls):
    images = [_rng_image((6, 7, 3))]
    est = cls(scale=1.0)
    before = dict(est.__dict__)
    assert est.fit(images) is est
    assert est.__dict__ == before
    a = est.fit_transform(images)[0]
    b = cls(scale=1.0).transform(images)[0]  # no fit needed
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    clone(est)
    pickle.loads(pickle.dumps(est))


def test_invalid_parameters_and_images():
    with pytest.raises(ValueError, match="scale"):
        HorseFeatures(scale=0).transform([np.zeros((4, 4, 3))])
    with pytest.raises(ValueError, match="scale"):
        DenoisingFeatures(scale=1.5).fit([np.zeros((4, 4))])
    with pytest.raises(ValueError, match="rgb_thresholds"):
        HorseFeatures(rgb_thresholds=[]).transform([np.zeros((4, 4, 3))])
    with pytest.raises(ValueError, match=r"image 1 must have shape"):
        HorseFeatures().transform([np.zeros((4, 4, 3)), np.zeros((4, 4, 2))])
    with pytest.raises(ValueError, match="NaN"):
        DenoisingFeatures().transform([np.full((3, 3), np.nan)])
    with pytest.raises(TypeError, match="list of images"):
        DenoisingFeatures().transform(np.zeros((3, 3)))


@pytest.mark.parametrize("transformer", [DenoisingFeatures, HorseFeatures, BackgroundFeatures])
def test_float32_dtype_rounds_the_float64_features(transformer):
    image = np.random.default_rng(3).random((12, 10) if transformer is DenoisingFeatures else (12, 10, 3))
    a = transformer().transform([image])[0]
    b = transformer(dtype=np.float32).transform([image])[0]
    for x, y in ((a.node_features, b.node_features), (a.edge_features, b.edge_features)):
        assert x.dtype == np.float64 and y.dtype == np.float32 and y.flags.c_contiguous
        np.testing.assert_array_equal(y, x.astype(np.float32))
    with pytest.raises(ValueError, match="dtype must be numpy.float64 or numpy.float32"):
        transformer(dtype=np.int32).transform([image])
    with pytest.raises(ValueError, match="dtype"):
        transformer(dtype="not a type").transform([image])


def test_integer_images_are_scaled_to_unit_range():
    image = np.random.default_rng(1).integers(0, 256, size=(5, 6, 3)).astype(np.uint8)
    a = HorseFeatures().transform([image])[0]
    b = HorseFeatures().transform([image / 255.0])[0]
    np.testing.assert_allclose(a.node_features, b.node_features)
    np.testing.assert_array_equal(a.edge_features, b.edge_features)


# ---------------------------------------------------------------------------
# Denoising features


def test_denoising_features_values():
    image = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    [sample] = DenoisingFeatures().transform([image])
    assert isinstance(sample, CRFSample)
    assert sample.grid_shape == (2, 3) and sample.image_shape == (2, 3)
    np.testing.assert_array_equal(sample.edges, grid_edges(2, 3))
    np.testing.assert_allclose(sample.node_features, np.c_[np.ones(6), image.ravel()])
    # 2 rows x 2 horizontal edges, then 3 vertical edges
    expected = np.array([[1, 0]] * 4 + [[0, 1]] * 3, dtype=float)
    np.testing.assert_array_equal(sample.edge_features, expected)


def test_denoising_colour_input_is_grey():
    from skimage.color import rgb2gray

    image = _rng_image((4, 5, 3))
    [sample] = DenoisingFeatures().transform([image])
    np.testing.assert_allclose(sample.node_features[:, 1], rgb2gray(image).ravel())


# ---------------------------------------------------------------------------
# Horse / background features


@pytest.mark.parametrize(
    "cls, n_edge", [(HorseFeatures, 42), (BackgroundFeatures, 22), (DenoisingFeatures, 2)]
)
def test_feature_shapes(cls, n_edge):
    images = [_rng_image((9, 13, 3)), _rng_image((20, 11))]
    samples = cls(scale=1.0).transform(images)
    n_unary = 2 if cls is DenoisingFeatures else 100
    for image, sample in zip(images, samples):
        h, w = image.shape[:2]
        assert sample.node_features.shape == (h * w, n_unary)
        assert sample.edges.shape == (h * (w - 1) + (h - 1) * w, 2)
        assert sample.edge_features.shape == (sample.edges.shape[0], n_edge)
        assert sample.grid_shape == (h, w) and sample.image_shape == (h, w)
        assert np.all(np.isfinite(sample.node_features))


def test_default_thresholds_are_the_toolbox_values():
    np.testing.assert_allclose(RGB_THRESHOLDS, 0.05 * np.arange(1, 11))
    np.testing.assert_allclose(SOBEL_THRESHOLDS, 0.02 * np.arange(1, 11))
    assert HorseFeatures().hog_orientations * HorseFeatures().hog_block_size**2 == 36
    assert BackgroundFeatures().scale == 0.2 and HorseFeatures().scale == 1.0


def test_fourier_expansion_against_direct_formula():
    image = _rng_image((3, 4, 3), seed=3)
    [sample] = HorseFeatures().transform([image])
    h, w = 3, 4
    for r, c in itertools.product(range(h), range(w)):
        s = np.array([*image[r, c], (r + 0.5) / h, (c + 0.5) / w])
        expected_cos, expected_sin = [], []
        for bits in itertools.product((0, 1), repeat=5):
            dot = sum(b * v for b, v in zip(bits, s))
            expected_cos.append(np.cos(np.pi * dot))
            expected_sin.append(np.sin(np.pi * dot))
        np.testing.assert_allclose(sample.node_features[r * w + c, :64], expected_cos + expected_sin, atol=1e-12)
    # fourier_scale is honoured; column 0 is the constant, column 32 is zero
    s = np.random.default_rng(0).uniform(size=(7, 5))
    np.testing.assert_allclose(fourier_features(s, 1.0)[:, 3], np.cos(s @ binary_vectors(5)[3]))
    np.testing.assert_allclose(fourier_features(s)[:, 0], 1.0)
    np.testing.assert_allclose(fourier_features(s)[:, 32], 0.0)


def test_hand_made_rgb_thresholds_and_halves():
    # 2 x 2 image: top row differs by 0.12 in red, left column by 0.32 in green
    image = np.zeros((2, 2, 3))
    image[0, 1, 0] = 0.12
    image[1, 0, 1] = 0.32
    image[1, 1, 1] = 0.32
    [sample] = BackgroundFeatures(scale=1.0).transform([image])
    ef = sample.edge_features
    assert ef.shape == (4, 22)
    # edges: horizontal (0,1), (2,3); vertical (0,2), (1,3)
    np.testing.assert_array_equal(sample.edges, [[0, 1], [2, 3], [0, 2], [1, 3]])
    diff_01 = np.array(RGB_THRESHOLDS) < 0.12
    diff_13 = np.array(RGB_THRESHOLDS) < np.hypot(0.12, 0.32)
    diff_02 = np.array(RGB_THRESHOLDS) < 0.32
    np.testing.assert_array_equal(ef[0, :11], np.r_[1, diff_01])  # horizontal (0,1)
    np.testing.assert_array_equal(ef[1, :11], np.r_[1, np.zeros(10)])  # horizontal (2,3): equal pixels
    np.testing.assert_array_equal(ef[2, 11:], np.r_[1, diff_02])  # vertical (0,2)
    np.testing.assert_array_equal(ef[3, 11:], np.r_[1, diff_13])  # vertical (1,3)
    assert not ef[:2, 11:].any() and not ef[2:, :11].any()
    assert diff_01.sum() == 2 and diff_02.sum() == 6


def test_sobel_magnitude_scale_and_thresholds():
    # A horizontal ramp of slope 0.03 per pixel: |grad I| = 0.03 in the interior.
    ramp = np.tile(0.03 * np.arange(12.0), (10, 1))
    g = sobel_magnitude(ramp)
    np.testing.assert_allclose(g[2:-2, 2:-2], 0.03)
    np.testing.assert_allclose(sobel_magnitude(np.dstack([ramp] * 3))[2:-2, 2:-2], 0.03)

    image = np.dstack([ramp] * 3)
    [sample] = HorseFeatures().transform([image])
    ef = sample.edge_features
    edges = sample.edges
    horizontal = edge_orientation((10, 12)) == 0
    strongest = np.maximum(g.ravel()[edges[:, 0]], g.ravel()[edges[:, 1]])
    expected = strongest[:, None] > np.array(SOBEL_THRESHOLDS)[None, :]
    np.testing.assert_array_equal(ef[horizontal, 11:21], expected[horizontal])
    np.testing.assert_array_equal(ef[~horizontal, 32:42], expected[~horizontal])
    # interior edges: 0.03 exceeds only the first threshold (0.02)
    interior = (strongest > 0.0299) & (strongest < 0.0301)
    assert interior.any()
    np.testing.assert_array_equal(ef[interior & horizontal, 11:21], np.r_[1, np.zeros(9)][None].repeat((interior & horizontal).sum(), 0))
    # rgb difference of neighbours along a row: sqrt(3) * 0.03 ~ 0.052 > 0.05 only
    np.testing.assert_array_equal(ef[horizontal, 1:11].sum(axis=1), 1)
    assert not ef[~horizontal, 22:32].any()  # rows are equal: no vertical difference



def test_position_threshold_and_rgb_difference_columns_by_hand():
    positions = position_features((2, 4))
    np.testing.assert_array_equal(positions[1, 2], [0.75, 0.625])  # ((1 + .5) / 2, (2 + .5) / 4)
    np.testing.assert_array_equal(positions[..., 0], [[0.25] * 4, [0.75] * 4])
    np.testing.assert_array_equal(threshold_features([0.1, 0.3, 0.2], [0.2, 0.05]), [[0, 1], [1, 1], [0, 1]])
    image = np.zeros((1, 3, 3))
    image[0, 1] = [0.3, 0.4, 0.0]  # 0.5 from both neighbours
    image[0, 2] = [0.3, 0.4, 1.0]
    np.testing.assert_allclose(rgb_difference(image, np.array([[0, 1], [1, 2], [2, 0]])), [0.5, 1.0, np.sqrt(1.25)])

def test_split_by_orientation():
    base = np.arange(1.0, 1 + 7 * 2).reshape(7, 2)  # grid 2 x 3: 4 horizontal, 3 vertical
    out = split_by_orientation(base, (2, 3))
    np.testing.assert_array_equal(out[:4, :2], base[:4])
    np.testing.assert_array_equal(out[4:, 2:], base[4:])
    assert not out[:4, 2:].any() and not out[4:, :2].any()
    with pytest.raises(ValueError, match="edges"):
        split_by_orientation(base, (3, 3))


def test_dense_hog_layout():
    from skimage.feature import hog

    rng = np.random.default_rng(0)
    image = rng.uniform(size=(16, 24))
    cell = 4
    dense = dense_hog(image, orientations=9, cell_size=cell, block_size=2)
    assert dense.shape == (16, 24, 36)
    blocks = hog(
        np.pad(image, cell, mode="symmetric"),
        orientations=9,
        pixels_per_cell=(cell, cell),
        cells_per_block=(2, 2),
        feature_vector=False,
    ).reshape(16 // cell + 1, 24 // cell + 1, 36)
    # pixel (y, x) sits at block coordinates ((y + .5) / cell, (x + .5) / cell):
    # pixels (2, 6) -> (0.625, 1.625): bilinear between blocks (0..1, 1..2)
    fy, fx = 0.625, 0.625
    expected = (
        (1 - fy) * (1 - fx) * blocks[0, 1]
        + (1 - fy) * fx * blocks[0, 2]
        + fy * (1 - fx) * blocks[1, 1]
        + fy * fx * blocks[1, 2]
    )
    np.testing.assert_allclose(dense[2, 6], expected, atol=1e-12)
    # a constant image has no gradients; a tiny image still gets descriptors
    np.testing.assert_allclose(dense_hog(np.full((10, 10), 0.5)), 0.0)
    assert dense_hog(rng.uniform(size=(3, 2, 3))).shape == (3, 2, 36)
    assert dense_hog(image, orientations=6, cell_size=4, block_size=3).shape == (16, 24, 54)


# ---------------------------------------------------------------------------
# Resolution


def test_scale_reduces_the_grid_and_keeps_the_image_shape():
    image = _rng_image((25, 35, 3))
    [sample] = BackgroundFeatures().transform([image])  # scale 0.2
    assert sample.grid_shape == (5, 7) and sample.image_shape == (25, 35)
    assert sample.node_features.shape == (35, 100)
    np.testing.assert_array_equal(sample.edges, grid_edges(5, 7))
    assert sample.edge_features.shape == (len(grid_edges(5, 7)), 22)
    # the constant Fourier feature survives the averaging
    np.testing.assert_allclose(sample.node_features[:, 0], 1.0)
    # marginals come back at image size, labels at image size go to the grid
    marginals = np.full((35, 3), 1 / 3)
    assert marginals_to_image(marginals, sample).shape == (25, 35, 3)
    assert labels_to_grid(np.zeros((25, 35), int), sample).shape == (35,)

    [half] = HorseFeatures(scale=0.5).transform([image])
    assert half.grid_shape == (12, 18) and half.image_shape == (25, 35)
    assert half.edge_features.shape == (len(grid_edges(12, 18)), 42)



def test_marginals_are_upsampled_bilinearly_between_pixel_centres():
    # a 2 x 2 grid to a 4 x 4 image: image pixel centres sit at grid
    # coordinates -1/4, 1/4, 3/4, 5/4, so each axis interpolates with the
    # weights below (clamped at the border), and the states' sum stays 1
    grid = np.array([[1.0, 0.5], [0.25, 0.0]])
    sample = CRFSample(np.zeros((4, 1)), np.zeros((0, 2), np.int64), np.zeros((0, 1)), grid_shape=(2, 2), image_shape=(4, 4))
    image = marginals_to_image(np.stack([grid.ravel(), 1 - grid.ravel()], axis=1), sample)
    weights = np.array([[1.0, 0.0], [0.75, 0.25], [0.25, 0.75], [0.0, 1.0]])
    expected = weights @ grid @ weights.T
    assert expected[0, 1] == 0.875 and expected[3, 2] == 0.0625  # by hand: .75 + .25 * .5, .25 * .25
    np.testing.assert_allclose(image[..., 0], expected, atol=1e-15)
    np.testing.assert_allclose(image[..., 1], 1 - expected, atol=1e-15)
    # labels at image size go back to the grid by the nearest pixel centre
    labels = np.arange(16).reshape(4, 4)
    np.testing.assert_array_equal(labels_to_grid(labels, sample), [5, 7, 13, 15])

def test_scale_averages_unary_features():
    from skimage.transform import resize

    image = _rng_image((20, 30))
    [full] = DenoisingFeatures().transform([image])
    [reduced] = DenoisingFeatures(scale=0.5).transform([image])
    assert reduced.grid_shape == (10, 15)
    expected = resize(image, (10, 15), order=1, anti_aliasing=True, mode="edge")
    np.testing.assert_allclose(reduced.node_features[:, 1], expected.ravel())
    assert abs(reduced.node_features[:, 1].mean() - full.node_features[:, 1].mean()) < 0.02
    np.testing.assert_array_equal(reduced.edge_features, split_by_orientation(np.ones((len(reduced.edges), 1)), (10, 15)))


def test_n_jobs_gives_the_same_samples():
    images = [_rng_image((8, 9, 3), seed=s) for s in range(3)]
    a = HorseFeatures().transform(images)
    b = HorseFeatures(n_jobs=2).transform(images)
    for sa, sb in zip(a, b):
        assert sa.grid_shape == sb.grid_shape and sa.image_shape == sb.image_shape
        for x, y in zip(sa, sb):
            np.testing.assert_array_equal(x, y)


# ---------------------------------------------------------------------------
# Combining


def test_combined_features():
    images = [_rng_image((6, 8, 3)), _rng_image((5, 5, 3))]
    combined = CombinedFeatures(unary=HorseFeatures(), edge=DenoisingFeatures())
    samples = combined.transform(images)  # stateless parts: no fit needed
    horse = HorseFeatures().transform(images)
    for sample, h in zip(samples, horse):
        np.testing.assert_array_equal(sample.node_features, h.node_features)
        assert sample.edge_features.shape == (len(sample.edges), 2)
        assert sample.grid_shape == h.grid_shape and sample.image_shape == h.image_shape

    both = CombinedFeatures(unary=[DenoisingFeatures(), HorseFeatures()], edge=[BackgroundFeatures(scale=1.0), DenoisingFeatures()])
    [sample] = both.fit(images[:1]).transform(images[:1])
    assert sample.node_features.shape == (48, 102)
    assert sample.edge_features.shape == (len(grid_edges(6, 8)), 24)
    assert hasattr(both, "unary_transformers_")

    # nested parameters are reachable, as in GridSearchCV
    assert combined.get_params()["unary__hog_cell_size"] == 8
    combined.set_params(unary__hog_cell_size=4)
    assert combined.unary.hog_cell_size == 4
    assert get_tags(combined).requires_fit is False
    check_no_attributes_set_in_init("CombinedFeatures", CombinedFeatures(DenoisingFeatures(), DenoisingFeatures()))

    with pytest.raises(ValueError, match="same scale"):
        CombinedFeatures(unary=BackgroundFeatures(), edge=DenoisingFeatures()).transform(images)
    with pytest.raises(TypeError, match="transformer"):
        CombinedFeatures(unary="hog", edge=DenoisingFeatures()).transform(images)
    with pytest.raises(ValueError, match="at least one"):
        combine_samples([], [DenoisingFeatures().transform(images)])


# ---------------------------------------------------------------------------
# Pipeline with MarginalCRF


def _marginal_crf():
    try:
        from sklearn_margcrf.estimator import MarginalCRF
    except ImportError as exc:  # the estimator is written in another issue
        pytest.skip(f"sklearn_margcrf.estimator.MarginalCRF is not importable yet: {exc}")
    return MarginalCRF


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_pipeline_round_trip_denoising():
    from sklearn.pipeline import make_pipeline

    from sklearn_margcrf.datasets import make_denoising_problem

    MarginalCRF = _marginal_crf()
    images, labels = make_denoising_problem(3, shape=(10, 12), noise=5, random_state=0)
    model = make_pipeline(DenoisingFeatures(), MarginalCRF(n_iter=5, max_iter=10))
    model.fit(images[:2], labels[:2])
    proba = model.predict_proba(images[2:])
    assert proba[0].shape == (10, 12, 2)
    np.testing.assert_allclose(proba[0].sum(axis=-1), 1.0)
    predicted = model.predict(images[2:])
    assert predicted[0].shape == (10, 12)
    # noise level 5 is easy: even a short fit labels most pixels right
    assert np.mean(predicted[0] == labels[2]) > 0.8


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_pipeline_round_trip_reduced_resolution_with_hidden_labels():
    from sklearn.pipeline import make_pipeline

    MarginalCRF = _marginal_crf()
    rng = np.random.default_rng(0)
    images = [rng.uniform(size=(20, 25, 3)) for _ in range(3)]
    labels = [rng.integers(-1, 3, size=(20, 25)) for _ in range(3)]  # image size, -1 hidden
    model = make_pipeline(BackgroundFeatures(scale=0.4), MarginalCRF(n_iter=3, max_iter=3, n_states=3))
    model.fit(images, labels)
    proba = model.predict_proba(images[:1])[0]
    assert proba.shape == (20, 25, 3)  # at the image's own size
    np.testing.assert_allclose(proba.sum(axis=-1), 1.0)
    assert model.predict(images[:1])[0].shape == (20, 25)


@pytest.mark.parametrize(
    "image,error,match",
    [
        (np.array([[0, 1, 1], [1, 0, 0]]), TypeError, "int64"),
        (np.array([[0.0, 2.0], [0.5, 0.5]]), ValueError, r"\[0, 1\]"),
        (np.array([[-0.5, 0.2], [0.5, 0.5]]), ValueError, r"\[0, 1\]"),
    ],
)
def test_images_out_of_scale_are_rejected(image, error, match):
    with pytest.raises(error, match=match):
        DenoisingFeatures().transform([image])


def test_uint8_images_are_scaled_by_255():
    image = np.array([[0, 255], [51, 102]], dtype=np.uint8)
    values = DenoisingFeatures().transform([image])[0].node_features[:, 1]
    np.testing.assert_allclose(values, [0.0, 1.0, 0.2, 0.4])


def test_fourier_features_refuse_a_transposed_input_instead_of_exhausting_memory():
    # (5, 1000) read as d = 1000 base features would ask for 2 * 2**1000 columns
    with pytest.raises(ValueError, match="transposed"):
        fourier_features(np.ones((5, 17)))


class _RecordsFitLabels(DenoisingFeatures):
    """A (supervised-looking) part that keeps the labels ``fit`` was given."""

    def fit(self, X, y=None):
        self.fit_labels_ = y
        return super().fit(X, y)


def test_combined_features_fit_passes_the_labels_to_every_part():
    rng = np.random.default_rng(0)
    images = [rng.uniform(size=(6, 7)) for _ in range(2)]
    labels = [rng.integers(0, 2, size=(6, 7)) for _ in range(2)]
    combined = CombinedFeatures(unary=[_RecordsFitLabels()], edge=_RecordsFitLabels()).fit(images, labels)
    for part in combined.unary_transformers_ + combined.edge_transformers_:
        assert part.fit_labels_ is labels


def test_one_hot_coding_is_the_bins_between_sorted_thresholds():
    thresholds = [0.3, 0.1, 0.2]  # any order: one-hot bins follow the sorted thresholds
    values = np.array([0.0, 0.1, 0.15, 0.2, 0.25, 0.3, 0.31])
    one_hot = threshold_features(values, thresholds, coding="one_hot")
    np.testing.assert_array_equal(one_hot, [
        [0, 0, 0], [0, 0, 0], [1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 1, 0], [0, 0, 1],
    ])
    # the cumulative indicators of the sorted thresholds are the one-hot bins summed from the right
    cumulative = threshold_features(values, sorted(thresholds))
    np.testing.assert_array_equal(cumulative, np.cumsum(one_hot[:, ::-1], axis=1)[:, ::-1])
    with pytest.raises(ValueError, match="coding"):
        threshold_features(values, thresholds, coding="onehot")


def test_quantile_thresholds_split_each_image_at_its_own_quantiles():
    values = np.random.default_rng(3).permutation(np.linspace(0.0, 1.0, 110))
    thresholds = quantile_thresholds(values)
    assert thresholds.shape == (10,)
    # 110 distinct values: the k-th threshold is the (10 k)-th smallest
    np.testing.assert_array_equal([np.count_nonzero(values <= t) for t in thresholds], 10 * np.arange(1, 11))
    np.testing.assert_array_equal(threshold_features(values, "quantiles"), threshold_features(values, thresholds))
    np.testing.assert_array_equal(quantile_thresholds([2.0]), np.full(10, 2.0))
    with pytest.raises(ValueError, match="at least one value"):
        quantile_thresholds([])
    np.testing.assert_array_equal(quantile_thresholds(values, 1), [np.sort(values)[54]])  # the median: position 55 of 110
    with pytest.raises(ValueError, match="n_thresholds"):
        quantile_thresholds(values, 0)
    with pytest.raises(ValueError, match="quantiles"):
        threshold_features(values, "median")


@pytest.mark.parametrize("transformer", [HorseFeatures, BackgroundFeatures])
def test_threshold_options_of_the_colour_transformers(transformer):
    rng = np.random.default_rng(4)
    image = rng.uniform(0.2, 0.6, size=(12, 14, 3))
    dimmer = 0.5 * image  # every difference and Sobel response halves

    def edges(img, **params):
        model = transformer(scale=1.0, **params)
        [sample] = model.transform([img])
        names = model.get_edge_feature_names_out()
        assert len(names) == sample.edge_features.shape[1]
        return sample.edge_features, names

    fixed, _ = edges(image)
    one_hot, names = edges(image, threshold_coding="one_hot")
    assert fixed.shape == one_hot.shape and "horizontal:rgb_diff in (0.05, 0.1]" in names
    # in each thresholded group (10 columns after the constant) at most one bin is on
    # and the cumulative indicators are its bins summed from the right
    groups = fixed.shape[1] // 2 // 10
    for half in (0, fixed.shape[1] // 2):
        for g in range(groups):
            cols = slice(half + 1 + 10 * g, half + 11 + 10 * g)
            assert one_hot[:, cols].sum(axis=1).max() <= 1
            np.testing.assert_array_equal(fixed[:, cols], np.cumsum(one_hot[:, cols][:, ::-1], axis=1)[:, ::-1])
    assert not np.array_equal(fixed, one_hot)
    # per-image quantile thresholds do not see a change of contrast; fixed thresholds do
    quantiles = dict(rgb_thresholds="quantiles")
    if transformer is HorseFeatures:
        quantiles["sobel_thresholds"] = "quantiles"
    adaptive, names = edges(image, **quantiles)
    np.testing.assert_array_equal(adaptive, edges(dimmer, **quantiles)[0])
    assert not np.array_equal(fixed, edges(dimmer)[0])
    assert "horizontal:rgb_diff>q1/11" in names
    # each image's own thresholds: about k/11 of its edges at or below the k-th
    rgb = adaptive[:, 1:11] + adaptive[:, fixed.shape[1] // 2 + 1 : fixed.shape[1] // 2 + 11]
    np.testing.assert_allclose(1 - rgb.mean(axis=0), np.arange(1, 11) / 11, atol=0.01)
    for bad, match in (({"threshold_coding": "onehot"}, "threshold_coding"), ({"rgb_thresholds": "median"}, "rgb_thresholds")):
        with pytest.raises(ValueError, match=match):
            transformer(**bad).transform([image])
