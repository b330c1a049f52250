"""Feature names: one per produced column, and each column is what its name says."""

import numpy as np
import pytest

pytest.importorskip("skimage", reason="the feature transformers use scikit-image")

from sklearn.pipeline import make_pipeline  # noqa: E402

from sklearn_margcrf.features import (  # noqa: E402
    BackgroundFeatures,
    CombinedFeatures,
    DenoisingFeatures,
    HorseFeatures,
    dense_hog,
    edge_orientation,
)


def _columns(names, array):
    """{name: column}, names unique."""
    names = list(names)
    assert len(names) == array.shape[1] == len(set(names))
    return dict(zip(names, array.T))


@pytest.mark.parametrize(
    "transformer, n_node, n_edge",
    [(DenoisingFeatures(), 2, 2), (HorseFeatures(), 100, 42), (BackgroundFeatures(scale=0.5), 100, 22),
     (HorseFeatures(hog_orientations=4, hog_block_size=1, rgb_thresholds=[0.3], sobel_thresholds=[0.1, 0.2]), 68, 8)],
)
def test_one_name_per_column(transformer, n_node, n_edge):
    [sample] = transformer.transform([np.random.default_rng(0).uniform(size=(12, 14, 3))])
    assert len(transformer.get_feature_names_out()) == sample.node_features.shape[1] == n_node
    assert len(transformer.get_edge_feature_names_out()) == sample.edge_features.shape[1] == n_edge
    # the names do not need a fit and go through a pipeline of transformers
    assert list(make_pipeline(transformer).get_feature_names_out()) == list(transformer.get_feature_names_out())


def test_colour_node_features_are_what_their_names_say():
    height, width = 16, 18
    image = np.empty((height, width, 3))
    image[...] = (0.3, 0.6, 0.15)
    image[5:11, 6:12] = np.random.default_rng(0).uniform(size=(6, 6, 3))  # a textured patch: HOG in every orientation
    [sample] = HorseFeatures().transform([image])
    node = _columns(HorseFeatures().get_feature_names_out(), sample.node_features)
    rows, cols = np.meshgrid((np.arange(height) + 0.5) / height, (np.arange(width) + 0.5) / width, indexing="ij")
    r, g, b = (image[..., c].ravel() for c in range(3))
    y, x = rows.ravel(), cols.ravel()
    np.testing.assert_allclose(node["cos(0)"], 1.0)
    np.testing.assert_allclose(node["sin(0)"], 0.0, atol=1e-12)
    np.testing.assert_allclose(node["sin(r+g+x)"], np.sin(np.pi * (r + g + x)))
    np.testing.assert_allclose(node["cos(b+y)"], np.cos(np.pi * (b + y)))
    np.testing.assert_allclose(node["sin(r+g+b+y+x)"], np.sin(np.pi * (r + g + b + y + x)))
    np.testing.assert_allclose(node["hog[3]"], dense_hog(image)[..., 3].ravel())
    assert np.ptp(node["hog[3]"]) > 0


def test_denoising_features_are_what_their_names_say():
    image = np.random.default_rng(1).uniform(size=(5, 6))
    [sample] = DenoisingFeatures().transform([image])
    node = _columns(DenoisingFeatures().get_feature_names_out(), sample.node_features)
    np.testing.assert_allclose(node["noisy"], image.ravel())
    np.testing.assert_allclose(node["1"], 1.0)
    edge = _columns(DenoisingFeatures().get_edge_feature_names_out(), sample.edge_features)
    np.testing.assert_array_equal(edge["vertical:1"], edge_orientation((5, 6)))
    np.testing.assert_array_equal(edge["horizontal:1"], 1 - edge_orientation((5, 6)))


def test_edge_features_are_what_their_names_say():
    # columns 0-4 grey 0.5, columns 5-9 grey 0.62: the RGB difference across
    # the step is 0.12 * sqrt(3) = 0.208, so "rgb_diff>0.2" holds there and
    # "rgb_diff>0.25" does not; the Sobel magnitude is 0.12 / 2 = 0.06 at the
    # pixels of columns 4 and 5, zero elsewhere, and an edge takes the larger
    # value of its ends.
    image = np.full((6, 10, 3), 0.5)
    image[:, 5:] = 0.62
    for transformer in (HorseFeatures(), BackgroundFeatures(scale=1.0)):
        [sample] = transformer.transform([image])
        edge = _columns(transformer.get_edge_feature_names_out(), sample.edge_features)
        horizontal = edge_orientation((6, 10)) == 0
        crossing = np.zeros(len(horizontal), bool)
        crossing[np.flatnonzero(horizontal)[4::9]] = True  # edge (row, 4)-(row, 5) of each row
        np.testing.assert_array_equal(edge["horizontal:1"], horizontal)
        np.testing.assert_array_equal(edge["vertical:1"], ~horizontal)
        np.testing.assert_array_equal(edge["horizontal:rgb_diff>0.2"], crossing)
        assert not edge["horizontal:rgb_diff>0.25"].any() and not edge["vertical:rgb_diff>0.05"].any()
        if isinstance(transformer, HorseFeatures):
            near = np.zeros(len(horizontal), bool)
            for start in (3, 4, 5):  # edges (row, 3)-(row, 4), (row, 4)-(row, 5), (row, 5)-(row, 6)
                near[np.flatnonzero(horizontal)[start::9]] = True
            np.testing.assert_array_equal(edge["horizontal:sobel>0.04"], near)
            assert not edge["horizontal:sobel>0.08"].any()


def test_combined_names_follow_the_parts():
    single = CombinedFeatures(unary=HorseFeatures(), edge=DenoisingFeatures())
    assert list(single.get_feature_names_out()) == list(HorseFeatures().get_feature_names_out())
    assert list(single.get_edge_feature_names_out()) == ["horizontal:1", "vertical:1"]
    several = CombinedFeatures(unary=[DenoisingFeatures(), HorseFeatures()], edge=[DenoisingFeatures(), DenoisingFeatures()])
    [sample] = several.transform([np.zeros((8, 9, 3))])
    node = _columns(several.get_feature_names_out(), sample.node_features)
    assert list(node)[:3] == ["denoisingfeatures__1", "denoisingfeatures__noisy", "horsefeatures__cos(0)"]
    np.testing.assert_allclose(node["horsefeatures__cos(0)"], 1.0)
    assert list(several.get_edge_feature_names_out()) == [
        "denoisingfeatures-1__horizontal:1", "denoisingfeatures-1__vertical:1",
        "denoisingfeatures-2__horizontal:1", "denoisingfeatures-2__vertical:1",
    ]
