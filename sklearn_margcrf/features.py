"""Image feature transformers: images -> :class:`~sklearn_margcrf.sample.CRFSample`.

Each transformer maps a list of images, (H, W) grey or (H, W, 3) colour, to a
list of samples on the 4-connected pixel grid of :func:`~sklearn_margcrf.grid_edges`
(pixels in row-major order, horizontal edges first, then vertical ones). They
follow the paper's Sec. "Experiments" (Domke, TPAMI 2013):

- :class:`DenoisingFeatures` (Sec. "Binary Denoising Data"): unary features
  ``[1, y_i]``, edge features ``[horizontal, vertical]`` indicators.
- :class:`HorseFeatures` (Sec. "Horses"): 100 unary features (a sinusoidal
  expansion of RGB and position, plus a 36-component HOG) and 42 edge features
  (constant, thresholded RGB difference, thresholded Sobel response, doubled
  into horizontal and vertical halves).
- :class:`BackgroundFeatures` (Sec. "Stanford Backgrounds Data"): the same 100
  unary features, 22 edge features from the RGB difference only, on a grid
  reduced to 20% of the image.
- :class:`CombinedFeatures`: unary features from some transformers, edge
  features from others.
- :class:`ClassifierFeatures`: a per-pixel scikit-learn classifier's
  log-probabilities as the node features of samples (stacking under the CRF).

Image values
------------
uint8 and uint16 images are converted with :func:`skimage.util.img_as_float`
(to [0, 1]), boolean images to 0 / 1; other integer dtypes raise TypeError,
since their scale is unknown. Float images are used as they are and are
expected in [0, 1] (the default thresholds assume this scale). Grey images given to the colour
transformers are replicated into three channels
(:func:`skimage.color.gray2rgb`); colour images given to
:class:`DenoisingFeatures` are converted with :func:`skimage.color.rgb2gray`.

Resolution (``scale``)
----------------------
Unary features are always computed on the full-resolution image. With
``scale < 1`` the CRF grid is ``(max(1, round(H * scale)), max(1, round(W * scale)))``
and

- the unary feature maps are reduced to the grid by
  :func:`skimage.transform.resize` with ``anti_aliasing=True`` (a Gaussian
  pre-filter followed by bilinear interpolation, i.e. a local average, like the
  MATLAB ``imresize(..., 'bilinear')`` of Domke's toolbox);
- the image itself is reduced the same way and the edge features are
  recomputed on the reduced grid from the reduced image (its RGB differences
  and the Sobel response of its grey version), as Domke's toolbox does.

Every sample carries ``grid_shape`` (the CRF grid) and ``image_shape`` (the
input's size), so ``MarginalCRF.predict_proba`` answers at the image's own
size (:func:`~sklearn_margcrf.sample.marginals_to_image` upsamples the
marginals bilinearly) and labels may be given at image size
(:func:`~sklearn_margcrf.sample.labels_to_grid` reduces them by nearest
neighbour).

Feature names
-------------
``get_feature_names_out()`` names the node feature columns and
``get_edge_feature_names_out()`` the edge feature columns, one name per column
in column order, so that the learned weights can be read (column ``f`` of
``MarginalCRF.unary_coef_`` and ``pairwise_coef_[:, :, f]``): ``"1"``
(constant), ``"noisy"``, ``"cos(0)"``, ``"sin(r+g+x)"`` (the sinusoid of
``fourier_scale * (R + G + horizontal position)``; r, g, b, then y and x for
the vertical and horizontal position), ``"hog[3]"``; edge features
``"horizontal:1"``, ``"vertical:rgb_diff>0.1"``, ``"horizontal:sobel>0.04"``
(set on edges of that orientation only).

Combining transformers
----------------------
Unary features from one transformer and edge features from another::

    CombinedFeatures(unary=HorseFeatures(), edge=DenoisingFeatures())

gives the horse unary features with plain horizontal/vertical edge
indicators. Either side may be a list, whose features are concatenated::

    CombinedFeatures(unary=[DenoisingFeatures(), HorseFeatures()],
                     edge=BackgroundFeatures(scale=1.0))

All parts must produce the same grid (use the same ``scale``). The functional
form is :func:`combine_samples`.
"""

import itertools
import numbers

import numpy as np
from scipy import ndimage
from sklearn.base import BaseEstimator, TransformerMixin, clone
from sklearn.model_selection import check_cv
from sklearn.utils import get_tags
from sklearn.utils._param_validation import HasMethods, Interval, StrOptions
from sklearn.utils.parallel import Parallel, delayed
from sklearn.utils.validation import check_is_fitted

from ._graph import grid_edges, split_labels
from .sample import CRFSample, as_sample, labels_to_grid

__all__ = [
    "DenoisingFeatures",
    "HorseFeatures",
    "BackgroundFeatures",
    "CombinedFeatures",
    "ClassifierFeatures",
    "combine_samples",
    "fourier_features",
    "fourier_feature_names",
    "binary_vectors",
    "dense_hog",
    "position_features",
    "sobel_magnitude",
    "rgb_difference",
    "threshold_features",
    "quantile_thresholds",
    "edge_orientation",
    "split_by_orientation",
    "reduced_shape",
    "RGB_THRESHOLDS",
    "SOBEL_THRESHOLDS",
    "MIN_PROBABILITY",
]

#: Default thresholds on the L2 norm of the RGB difference of neighbours
#: (images in [0, 1]): 0.05, 0.10, ..., 0.50, as in Domke's toolbox
#: (``edgeify_im.m``: ``thresh = .5*n/nthresh``, n = 1..10).
RGB_THRESHOLDS = tuple(round(0.05 * k, 2) for k in range(1, 11))

#: Default thresholds on the Sobel gradient magnitude (intensity per pixel,
#: see :func:`sobel_magnitude`): 0.02, 0.04, ..., 0.20, as in Domke's toolbox
#: (``thresh = n*.2/nthresh`` on MATLAB's ``edge(I, 'sobel')`` gradients).
SOBEL_THRESHOLDS = tuple(round(0.02 * k, 2) for k in range(1, 11))


# ---------------------------------------------------------------------------
# Image validation and resolution


def _check_images(X, *, colour):
    """Validate a list of images; return them as float arrays.

    ``colour=True`` returns (H, W, 3) arrays (grey images replicated),
    ``colour=False`` returns (H, W) grey arrays.
    """
    from skimage.color import gray2rgb, rgb2gray
    from skimage.util import img_as_float

    if isinstance(X, np.ndarray) and X.ndim in (2, 3) and X.dtype != object:
        if X.ndim == 2 or X.shape[-1] == 3:
            raise TypeError(
                "X must be a list of images, got a single array of shape "
                f"{X.shape}; wrap one image in a list: transform([image])"
            )
    try:
        images = list(X)
    except TypeError:
        raise TypeError(
            f"X must be a list of images ((H, W) or (H, W, 3) arrays), got {type(X).__name__}"
        ) from None
    out = []
    for index, image in enumerate(images):
        image = np.asarray(image)
        if image.ndim == 3 and image.shape[-1] == 1:
            image = image[..., 0]
        if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[-1] != 3):
            raise ValueError(
                f"image {index} must have shape (H, W) or (H, W, 3), got {image.shape}"
            )
        if image.shape[0] < 1 or image.shape[1] < 1:
            raise ValueError(f"image {index} is empty: shape {image.shape}")
        if image.dtype == bool:
            image = image.astype(np.float64)
        elif image.dtype in (np.uint8, np.uint16):
            image = img_as_float(image)
        elif np.issubdtype(image.dtype, np.floating):
            image = image.astype(np.float64, copy=False)
        elif np.issubdtype(image.dtype, np.integer):
            raise TypeError(
                f"image {index} has dtype {image.dtype}: give uint8 / uint16 images (scaled by their "
                "maximum) or floats in [0, 1]; convert other integer images to float in [0, 1]"
            )
        else:
            raise TypeError(f"image {index} must hold numbers, got dtype {image.dtype}")
        if not np.all(np.isfinite(image)):
            raise ValueError(f"image {index} contains NaN or infinite values")
        if image.min() < 0.0 or image.max() > 1.0:
            raise ValueError(
                f"image {index} has values in [{image.min():.3g}, {image.max():.3g}]: float images must lie "
                "in [0, 1] (the feature thresholds assume that scale)"
            )
        if colour and image.ndim == 2:
            image = gray2rgb(image)
        elif not colour and image.ndim == 3:
            image = rgb2gray(image)
        out.append(image)
    return out


def reduced_shape(shape, scale):
    """Grid shape ``(max(1, round(H * scale)), max(1, round(W * scale)))``."""
    return tuple(max(1, int(round(s * scale))) for s in shape[:2])


def _resize(array, grid_shape):
    """Reduce an (H, W[, C]) array to ``grid_shape`` (anti-aliased bilinear)."""
    from skimage.transform import resize

    if tuple(array.shape[:2]) == tuple(grid_shape):
        return array
    return resize(
        array,
        tuple(grid_shape) + array.shape[2:],
        order=1,
        mode="edge",
        anti_aliasing=True,
        preserve_range=True,
    )


# ---------------------------------------------------------------------------
# Unary feature building blocks


def binary_vectors(n_dims):
    """All ``2**n_dims`` binary vectors c, as rows, in ``itertools.product`` order.

    Row ``k`` is the binary expansion of ``k`` with the first coordinate as the
    most significant bit; row 0 is the zero vector.
    """
    return np.array(list(itertools.product((0, 1), repeat=n_dims)), dtype=np.float64).reshape(
        2**n_dims, n_dims
    )


_MAX_FOURIER_DIMS = 16  # 2 * 2**16 features per row already


def fourier_features(s, scale=np.pi):
    """Sinusoidal expansion: ``[cos(scale * c.s) for all c] + [sin(scale * c.s) for all c]``.

    Parameters
    ----------
    s : array of shape (n, d)
        Base features (the paper: RGB and normalised vertical and horizontal
        position, d = 5, each in [0, 1]).
    scale : float, default=pi
        Frequency multiplier. The paper writes ``sin(c.s)``, ``cos(c.s)``;
        Domke's toolbox (``featurize_im.m``, ``'fourier'``) uses
        ``cos(pi c.s)``, ``sin(pi c.s)``, so that each base feature in [0, 1]
        spans half a period; pi is the default.

    Returns
    -------
    features : array of shape (n, 2 * 2**d)
        Columns ``0 .. 2**d - 1`` are the cosines, then the sines, both in the
        order of :func:`binary_vectors` (column 0 is the constant cos(0) = 1,
        column ``2**d`` the constant sin(0) = 0).
    """
    s = np.asarray(s, dtype=np.float64)
    if s.ndim != 2:
        raise ValueError(f"s must be a 2-D array (n, d), got shape {s.shape}")
    if s.shape[1] > _MAX_FOURIER_DIMS:
        raise ValueError(
            f"s has d = {s.shape[1]} base features, which would give 2 * 2**{s.shape[1]} features per row; "
            f"at most d = {_MAX_FOURIER_DIMS} is supported (was s given transposed, as (d, n)?)"
        )
    angles = scale * (s @ binary_vectors(s.shape[1]).T)
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1)


#: Letters of the colour transformers' base values in feature names: R, G, B,
#: vertical (y) and horizontal (x) position.
_COLOUR_BASE_NAMES = ("r", "g", "b", "y", "x")


def fourier_feature_names(base_names):
    """Names of the columns of :func:`fourier_features` for base features
    called ``base_names``: ``"cos(<c.s>)"`` then ``"sin(<c.s>)"``, where
    ``<c.s>`` joins the names of the base features with ``c = 1`` by ``+``
    (``"0"`` for c = 0), e.g. ``"sin(r+g+x)"``. The frequency multiplier
    (``scale``) is not written.
    """
    base_names = [str(name) for name in base_names]
    sums = ["+".join(n for n, on in zip(base_names, c) if on) or "0" for c in binary_vectors(len(base_names))]
    return [f"cos({s})" for s in sums] + [f"sin({s})" for s in sums]


def _threshold_names(name, thresholds, coding="cumulative"):
    """Names of the columns of :func:`threshold_features`: ``"<name>><t>"``
    (cumulative) or ``"<name> in (<t>, <t'>]"`` (one-hot); for
    ``thresholds="quantiles"`` the thresholds are written ``q<k>/11``."""
    if isinstance(thresholds, str):
        labels = [f"q{k}/{N_QUANTILE_THRESHOLDS + 1}" for k in range(1, N_QUANTILE_THRESHOLDS + 1)]
    else:
        values = np.asarray(thresholds, dtype=np.float64).ravel()
        labels = [f"{float(t):g}" for t in (values if coding == "cumulative" else np.sort(values))]
    if coding == "cumulative":
        return [f"{name}>{t}" for t in labels]
    return [f"{name} in ({low}, {high}]" for low, high in zip(labels, labels[1:])] + [f"{name}>{labels[-1]}"]


def position_features(shape):
    """Normalised (vertical, horizontal) pixel-centre positions, (H, W, 2).

    ``(row + 0.5) / H`` and ``(col + 0.5) / W``, both in (0, 1).
    """
    height, width = shape[:2]
    rows = (np.arange(height) + 0.5) / height
    cols = (np.arange(width) + 0.5) / width
    return np.stack(np.meshgrid(rows, cols, indexing="ij"), axis=-1)


def dense_hog(image, orientations=9, cell_size=8, block_size=2):
    """A HOG descriptor at every pixel, (H, W, orientations * block_size**2).

    :func:`skimage.feature.hog` (Dalal-Triggs, ``block_norm='L2-Hys'``; for a
    colour image the channel of largest gradient at each pixel) is computed on
    the image padded by one cell on every side (symmetric padding, as Domke's
    toolbox pads with ``reflectim`` before Piotr Dollar's ``hog``), so that
    even an image smaller than a block has a descriptor. Each block of
    ``block_size x block_size`` cells gives ``block_size**2 * orientations``
    values (36 for the defaults); the block descriptors, which sit on a grid
    of spacing ``cell_size`` pixels, are interpolated bilinearly
    (:func:`scipy.ndimage.map_coordinates`, edge values repeated) to every
    pixel from the block centres.
    """
    from skimage.feature import hog

    image = np.asarray(image, dtype=np.float64)
    height, width = image.shape[:2]
    cell, block = int(cell_size), int(block_size)
    pad = [(cell, cell), (cell, cell)] + [(0, 0)] * (image.ndim - 2)
    padded = np.pad(image, pad, mode="symmetric")
    blocks = hog(
        padded,
        orientations=orientations,
        pixels_per_cell=(cell, cell),
        cells_per_block=(block, block),
        block_norm="L2-Hys",
        feature_vector=False,
        channel_axis=-1 if image.ndim == 3 else None,
    )
    n_rows, n_cols = blocks.shape[:2]
    descriptors = blocks.reshape(n_rows, n_cols, -1)
    # Block r covers padded pixels r*cell .. (r+block)*cell - 1: its centre is
    # at padded coordinate (r + block/2)*cell - 0.5, i.e. at image coordinate
    # (r + block/2 - 1)*cell - 0.5. Invert for the pixel centres.
    rows = (np.arange(height) + 0.5) / cell - block / 2 + 1
    cols = (np.arange(width) + 0.5) / cell - block / 2 + 1
    coords = np.stack(np.meshgrid(rows, cols, indexing="ij"))
    out = np.empty((height, width, descriptors.shape[2]))
    for k in range(descriptors.shape[2]):
        out[..., k] = ndimage.map_coordinates(descriptors[..., k], coords, order=1, mode="nearest")
    return out


# ---------------------------------------------------------------------------
# Edge feature building blocks


def edge_orientation(grid_shape):
    """0 for horizontal and 1 for vertical edges of :func:`~sklearn_margcrf.grid_edges` (E,)."""
    height, width = grid_shape
    n_horizontal = height * (width - 1)
    n_vertical = (height - 1) * width
    return np.concatenate([np.zeros(n_horizontal, np.int64), np.ones(n_vertical, np.int64)])


def split_by_orientation(base, grid_shape):
    """Double (E, F) base edge features into (E, 2F) horizontal / vertical halves.

    A horizontal edge has its base features in columns ``0 .. F-1`` and zeros
    in ``F .. 2F-1``; a vertical edge the opposite (the paper's Sec. "Horses").
    """
    base = np.asarray(base, dtype=np.float64)
    vertical = edge_orientation(grid_shape).astype(bool)
    if base.shape[0] != vertical.shape[0]:
        raise ValueError(
            f"base features have {base.shape[0]} rows but the {grid_shape} grid has "
            f"{vertical.shape[0]} edges"
        )
    out = np.zeros((base.shape[0], 2 * base.shape[1]))
    out[~vertical, : base.shape[1]] = base[~vertical]
    out[vertical, base.shape[1] :] = base[vertical]
    return out


#: How many thresholds ``"quantiles"`` places (as many as the fixed defaults).
N_QUANTILE_THRESHOLDS = 10


def quantile_thresholds(values, n_thresholds=N_QUANTILE_THRESHOLDS):
    """Thresholds at the quantiles ``k / (n_thresholds + 1)`` of ``values``.

    The sorted values at the 1-based positions ``round(E k / (n + 1))``,
    k = 1..n (E values; rounding half up): the adaptive strategy that a
    comment in Domke's toolbox (``edgeify_im.m``) gives as "similar in
    practice" to its fixed thresholds. Each image then gets its own
    thresholds, so that about ``k / (n + 1)`` of its edges lie at or below
    the k-th.
    """
    values = np.asarray(values, dtype=np.float64).ravel()
    if values.size == 0:
        raise ValueError("quantile thresholds need at least one value")
    if isinstance(n_thresholds, (bool, np.bool_)) or not isinstance(n_thresholds, numbers.Integral) or n_thresholds < 1:
        raise ValueError(f"n_thresholds must be an integer >= 1, got {n_thresholds!r}")
    positions = np.floor(values.size * np.arange(1, n_thresholds + 1) / (n_thresholds + 1) + 0.5).astype(np.int64)
    return np.sort(values)[np.clip(positions - 1, 0, values.size - 1)]


def threshold_features(values, thresholds, coding="cumulative"):
    """Discretise ``values`` (E,) at ``thresholds``: (E, n_thresholds) floats.

    ``coding="cumulative"``: the indicators ``values > t`` for each threshold
    t, in the given order (what the paper and Domke's toolbox use).
    ``coding="one_hot"``: with the thresholds sorted, t_1 <= ... <= t_n, the
    indicators of ``t_k < value <= t_{k+1}`` for k < n and of ``value > t_n``;
    a value at or below t_1 gets no 1. The two span the same space together
    with a constant feature; they differ under a ridge penalty.
    ``thresholds="quantiles"``: :func:`quantile_thresholds` of ``values``.
    """
    values = np.asarray(values, dtype=np.float64)
    if isinstance(thresholds, str):
        if thresholds != "quantiles":
            raise ValueError(f"thresholds must be a sequence of numbers or 'quantiles', got {thresholds!r}")
        thresholds = quantile_thresholds(values)
    thresholds = np.asarray(thresholds, dtype=np.float64).ravel()
    if coding == "cumulative":
        return (values[:, None] > thresholds[None, :]).astype(np.float64)
    if coding != "one_hot":
        raise ValueError(f"coding must be 'cumulative' or 'one_hot', got {coding!r}")
    above = values[:, None] > np.sort(thresholds)[None, :]
    above[:, :-1] &= ~above[:, 1:]  # above t_k and not above t_{k+1}
    return above.astype(np.float64)


def rgb_difference(image, edges):
    """L2 norm of the colour difference between the two ends of every edge, (E,)."""
    image = np.asarray(image, dtype=np.float64)
    flat = image.reshape(image.shape[0] * image.shape[1], -1)
    return np.linalg.norm(flat[edges[:, 0]] - flat[edges[:, 1]], axis=1)


def sobel_magnitude(image):
    """Sobel estimate of the intensity gradient magnitude, (H, W).

    The grey image (:func:`skimage.color.rgb2gray` for colour) is filtered
    with :func:`skimage.filters.sobel_h` and :func:`skimage.filters.sobel_v`;
    each of these is twice the derivative (kernel ``[1, 2, 1]/4`` smoothing
    times ``[1, 0, -1]``), so the magnitude is ``hypot(sobel_h, sobel_v) / 2``,
    the scale of MATLAB's ``edge(I, 'sobel')`` gradients that Domke's
    thresholds (``SOBEL_THRESHOLDS``) refer to.
    """
    from skimage.color import rgb2gray
    from skimage.filters import sobel_h, sobel_v

    image = np.asarray(image, dtype=np.float64)
    grey = rgb2gray(image) if image.ndim == 3 else image
    return np.hypot(sobel_h(grey), sobel_v(grey)) / 2.0


# ---------------------------------------------------------------------------
# Transformers


class _GridFeatures(TransformerMixin, BaseEstimator):
    """Common machinery: validation, stateless fit, per-image map, resolution."""

    _colour = True

    _parameter_constraints = {
        "scale": [Interval(numbers.Real, 0, 1, closed="right")],
        "n_jobs": [None, Interval(numbers.Integral, None, -1, closed="right"), Interval(numbers.Integral, 1, None, closed="left")],
        "dtype": "no_validation",  # checked in _check_params
    }

    def fit(self, X, y=None):
        """Validate the parameters and the images; nothing is learned.

        Parameters
        ----------
        X : list of arrays (H, W) or (H, W, 3)
        y : ignored

        Returns
        -------
        self
        """
        self._check_params()
        _check_images(X, colour=self._colour)
        return self

    def transform(self, X):
        """Compute one :class:`~sklearn_margcrf.sample.CRFSample` per image.

        Parameters
        ----------
        X : list of arrays (H, W) or (H, W, 3)

        Returns
        -------
        samples : list of CRFSample
            ``grid_shape`` is the CRF grid (reduced by ``scale``) and
            ``image_shape`` the image's (H, W).
        """
        self._check_params()
        images = _check_images(X, colour=self._colour)
        if len(images) < 2:
            return [self._transform_one(image) for image in images]
        # joblib decides what n_jobs=None means (1, or the active parallel_config)
        return Parallel(n_jobs=self.n_jobs)(delayed(self._transform_one)(image) for image in images)

    def _check_params(self):
        self._validate_params()
        try:
            dtype = np.dtype(self.dtype) if self.dtype is not None else None
        except TypeError:
            dtype = None
        if dtype is None or dtype.name not in ("float64", "float32"):
            raise ValueError(f"dtype must be numpy.float64 or numpy.float32, got {self.dtype!r}")
        for name in ("rgb_thresholds", "sobel_thresholds"):
            if name in self.get_params(deep=False) and not isinstance(getattr(self, name), str):
                value = np.asarray(getattr(self, name), dtype=np.float64)
                if value.ndim != 1 or value.size == 0 or not np.all(np.isfinite(value)):
                    raise ValueError(
                        f"{name} must be a non-empty 1-D sequence of finite numbers, "
                        f"got {getattr(self, name)!r}"
                    )

    def _transform_one(self, image):
        image_shape = image.shape[:2]
        grid_shape = reduced_shape(image_shape, self.scale)
        unary = _resize(self._unary_map(image), grid_shape)
        reduced = _resize(image, grid_shape)
        edges = grid_edges(*grid_shape)
        edge_features = self._edge_features(reduced, edges, grid_shape)
        node_features = np.ascontiguousarray(unary.reshape(-1, unary.shape[-1]), dtype=self.dtype)
        return CRFSample(
            node_features,
            edges,
            np.ascontiguousarray(edge_features, dtype=self.dtype),
            grid_shape=grid_shape,
            image_shape=image_shape,
        )

    def get_feature_names_out(self, input_features=None):
        """Names of the node feature columns (``node_features`` of the samples).

        Parameters
        ----------
        input_features : None
            Ignored: images have no named input columns (kept for
            scikit-learn's signature, so that ``Pipeline.get_feature_names_out``
            works).

        Returns
        -------
        names : ndarray of str objects, shape (n_node_features,)
        """
        self._check_params()
        return np.asarray(self._unary_names(), dtype=object)

    def get_edge_feature_names_out(self):
        """Names of the edge feature columns (``edge_features`` of the samples).

        Every base edge feature appears twice, ``"horizontal:<name>"`` (set on
        horizontal edges only) and then ``"vertical:<name>"``, in the column
        order of :func:`split_by_orientation`.

        Returns
        -------
        names : ndarray of str objects, shape (n_edge_features,)
        """
        self._check_params()
        base = self._base_edge_names()
        return np.asarray([f"{side}:{name}" for side in ("horizontal", "vertical") for name in base], dtype=object)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.requires_fit = False
        tags.input_tags.two_d_array = False
        tags.input_tags.three_d_array = True
        tags.transformer_tags.preserves_dtype = []
        return tags


#: The parameters every image transformer ends with, in numpydoc form.
_COMMON_PARAMETERS_DOC = """    n_jobs : int, default=None
        Images processed in parallel (joblib); None means 1 unless a
        ``joblib.parallel_config`` context says otherwise.
    dtype : {numpy.float64, numpy.float32}, default=numpy.float64
        Type of the feature arrays. float32 halves their memory for large
        data sets; :class:`~sklearn_margcrf.MarginalCRF` keeps them in float32
        and computes in float64.
"""


class DenoisingFeatures(_GridFeatures):
    __doc__ = (
        """Binary denoising features (paper Sec. "Binary Denoising Data").

    Unary features ``u(y, i) = [1, y_i]`` (a constant and the noisy value);
    edge features ``v(y, i, j) = [1, 0]`` for a horizontal and ``[0, 1]`` for a
    vertical edge, so that the two directions have their own parameters.

    Parameters
    ----------
    scale : float in (0, 1], default=1.0
        Fraction of the image resolution for the CRF grid; the noisy values
        are area-averaged to it (see the module docstring).
"""
        + _COMMON_PARAMETERS_DOC
        + """
    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_margcrf.features import DenoisingFeatures
    >>> [sample] = DenoisingFeatures().transform([np.zeros((2, 3))])
    >>> sample.node_features.shape, sample.edge_features.shape
    ((6, 2), (7, 2))
"""
    )

    _colour = False

    def __init__(self, *, scale=1.0, n_jobs=None, dtype=np.float64):
        self.scale = scale
        self.n_jobs = n_jobs
        self.dtype = dtype

    def _unary_map(self, image):
        return np.stack([np.ones_like(image), image], axis=-1)

    def _edge_features(self, reduced, edges, grid_shape):
        return split_by_orientation(np.ones((edges.shape[0], 1)), grid_shape)

    def _unary_names(self):
        return ["1", "noisy"]

    def _base_edge_names(self):
        return ["1"]


class _ColourFeatures(_GridFeatures):
    """The horses / backgrounds unary features (100 per pixel)."""

    _parameter_constraints = {
        **_GridFeatures._parameter_constraints,
        "hog_orientations": [Interval(numbers.Integral, 1, None, closed="left")],
        "hog_cell_size": [Interval(numbers.Integral, 1, None, closed="left")],
        "hog_block_size": [Interval(numbers.Integral, 1, None, closed="left")],
        "fourier_scale": [Interval(numbers.Real, 0, None, closed="neither")],
        "rgb_thresholds": ["array-like", StrOptions({"quantiles"})],
        "threshold_coding": [StrOptions({"cumulative", "one_hot"})],
    }

    def _unary_map(self, image):
        height, width = image.shape[:2]
        base = np.concatenate([image, position_features((height, width))], axis=-1)
        fourier = fourier_features(base.reshape(-1, 5), self.fourier_scale)
        hog = dense_hog(
            image,
            orientations=self.hog_orientations,
            cell_size=self.hog_cell_size,
            block_size=self.hog_block_size,
        )
        return np.concatenate([fourier.reshape(height, width, -1), hog], axis=-1)

    def _base_edge_features(self, reduced, edges):
        ones = np.ones((edges.shape[0], 1))
        diff = threshold_features(rgb_difference(reduced, edges), self.rgb_thresholds, self.threshold_coding)
        return [ones, diff]

    def _edge_features(self, reduced, edges, grid_shape):
        base = np.concatenate(self._base_edge_features(reduced, edges), axis=1)
        return split_by_orientation(base, grid_shape)

    def _unary_names(self):
        n_hog = self.hog_orientations * self.hog_block_size**2
        return fourier_feature_names(_COLOUR_BASE_NAMES) + [f"hog[{k}]" for k in range(n_hog)]

    def _base_edge_names(self):
        return ["1"] + _threshold_names("rgb_diff", self.rgb_thresholds, self.threshold_coding)


_COLOUR_DOC = """
    Unary features (100 for the defaults), computed at full resolution: the
    five base values s = (R, G, B, vertical position, horizontal position),
    each in [0, 1] (positions of pixel centres, see :func:`position_features`),
    expanded to ``cos(fourier_scale * c.s)`` and ``sin(fourier_scale * c.s)``
    for all 32 binary vectors c (64 features, :func:`fourier_features`;
    cosines first), then a HOG descriptor of ``hog_orientations x
    hog_block_size**2`` components (36 = 9 orientations x 2 x 2 cells of 8 x 8
    pixels) at every pixel (:func:`dense_hog`: skimage block descriptors
    interpolated bilinearly from the block centres to the pixels).
"""


class HorseFeatures(_ColourFeatures):
    __doc__ = (
        """Horse segmentation features (paper Sec. "Horses").
"""
        + _COLOUR_DOC
        + """
    Edge features (42 for the defaults): 21 base features -- a constant 1, the
    L2 norm of the RGB difference of i and j thresholded at
    ``rgb_thresholds`` (``norm > t``, 10 indicators; see
    ``threshold_coding``), and ``max(g_i, g_j)`` for the Sobel gradient
    magnitude g (:func:`sobel_magnitude`) thresholded at
    ``sobel_thresholds`` (10 indicators) -- placed in the first half for a
    horizontal and in the second half for a vertical edge
    (:func:`split_by_orientation`). Column layout: ``[1, rgb>t_1..t_10,
    sobel>s_1..s_10]`` for horizontal edges, then the same for vertical ones.

    Parameters
    ----------
    scale : float in (0, 1], default=1.0
        Fraction of the image resolution for the CRF grid (see the module
        docstring): unary features are computed at full resolution and
        reduced, edge features are computed on the reduced image.
    hog_orientations : int, default=9
    hog_cell_size : int, default=8
        Cell size in pixels (square cells).
    hog_block_size : int, default=2
        Cells per block side; a descriptor has ``hog_orientations *
        hog_block_size**2`` components.
    fourier_scale : float, default=pi
        Frequency multiplier of the sinusoidal expansion (the paper writes
        sin(c.s); Domke's toolbox uses sin(pi c.s)).
    rgb_thresholds : sequence of float or "quantiles", default=RGB_THRESHOLDS
        (0.05, 0.10, ..., 0.50), for images in [0, 1]. ``"quantiles"``: each
        image's own :func:`quantile_thresholds` (10) of its edges' values.
    sobel_thresholds : sequence of float or "quantiles", default=SOBEL_THRESHOLDS
        (0.02, 0.04, ..., 0.20), on the gradient magnitude per pixel.
    threshold_coding : {"cumulative", "one_hot"}, default="cumulative"
        The thresholded features as indicators ``value > t`` (the paper's
        and Domke's toolbox's) or as one-hot bins between consecutive
        thresholds (:func:`threshold_features`).
"""
        + _COMMON_PARAMETERS_DOC
    )

    _parameter_constraints = {
        **_ColourFeatures._parameter_constraints,
        "sobel_thresholds": ["array-like", StrOptions({"quantiles"})],
    }

    def __init__(
        self,
        *,
        scale=1.0,
        hog_orientations=9,
        hog_cell_size=8,
        hog_block_size=2,
        fourier_scale=np.pi,
        rgb_thresholds=RGB_THRESHOLDS,
        sobel_thresholds=SOBEL_THRESHOLDS,
        threshold_coding="cumulative",
        n_jobs=None,
        dtype=np.float64,
    ):
        self.scale = scale
        self.hog_orientations = hog_orientations
        self.hog_cell_size = hog_cell_size
        self.hog_block_size = hog_block_size
        self.fourier_scale = fourier_scale
        self.rgb_thresholds = rgb_thresholds
        self.sobel_thresholds = sobel_thresholds
        self.threshold_coding = threshold_coding
        self.n_jobs = n_jobs
        self.dtype = dtype

    def _base_edge_features(self, reduced, edges):
        sobel = sobel_magnitude(reduced).ravel()
        strongest = np.maximum(sobel[edges[:, 0]], sobel[edges[:, 1]])
        return super()._base_edge_features(reduced, edges) + [
            threshold_features(strongest, self.sobel_thresholds, self.threshold_coding)
        ]

    def _base_edge_names(self):
        return super()._base_edge_names() + _threshold_names("sobel", self.sobel_thresholds, self.threshold_coding)


class BackgroundFeatures(_ColourFeatures):
    __doc__ = (
        """Stanford Background features (paper Sec. "Stanford Backgrounds Data").
"""
        + _COLOUR_DOC
        + """
    Edge features (22 for the defaults): 11 base features -- a constant 1 and
    the L2 norm of the RGB difference thresholded at ``rgb_thresholds`` -- in
    the horizontal or the vertical half (:func:`split_by_orientation`).

    The paper computes the features at full resolution and reduces the grid
    to 20% (``scale=0.2``, the default); marginals are upsampled to the image
    size by ``MarginalCRF.predict_proba``.

    Parameters
    ----------
    scale : float in (0, 1], default=0.2
    hog_orientations : int, default=9
    hog_cell_size : int, default=8
    hog_block_size : int, default=2
    fourier_scale : float, default=pi
    rgb_thresholds : sequence of float or "quantiles", default=RGB_THRESHOLDS
        (0.05, 0.10, ..., 0.50), for images in [0, 1], applied on the reduced
        image. ``"quantiles"``: each image's own :func:`quantile_thresholds`
        (10) of its edges' values.
    threshold_coding : {"cumulative", "one_hot"}, default="cumulative"
        The thresholded features as indicators ``value > t`` (the paper's
        and Domke's toolbox's) or as one-hot bins between consecutive
        thresholds (:func:`threshold_features`).
"""
        + _COMMON_PARAMETERS_DOC
    )

    def __init__(
        self,
        *,
        scale=0.2,
        hog_orientations=9,
        hog_cell_size=8,
        hog_block_size=2,
        fourier_scale=np.pi,
        rgb_thresholds=RGB_THRESHOLDS,
        threshold_coding="cumulative",
        n_jobs=None,
        dtype=np.float64,
    ):
        self.scale = scale
        self.hog_orientations = hog_orientations
        self.hog_cell_size = hog_cell_size
        self.hog_block_size = hog_block_size
        self.fourier_scale = fourier_scale
        self.rgb_thresholds = rgb_thresholds
        self.threshold_coding = threshold_coding
        self.n_jobs = n_jobs
        self.dtype = dtype


# ---------------------------------------------------------------------------
# Combining


def combine_samples(unary_parts, edge_parts):
    """Samples whose node features come from ``unary_parts`` and edge features
    from ``edge_parts``.

    Parameters
    ----------
    unary_parts, edge_parts : list of lists of CRFSample
        One list of samples per transformer, all over the same images; the
        node features of the ``unary_parts`` are concatenated column-wise, and
        so are the edge features of the ``edge_parts``.

    Returns
    -------
    samples : list of CRFSample
        With the edges, ``grid_shape`` and ``image_shape`` of the parts, which
        must agree.
    """
    parts = list(unary_parts) + list(edge_parts)
    if not unary_parts or not edge_parts:
        raise ValueError("need at least one unary part and one edge part")
    n_images = {len(p) for p in parts}
    if len(n_images) != 1:
        raise ValueError(f"the parts have different numbers of samples: {sorted(n_images)}")
    out = []
    for index in range(n_images.pop()):
        samples = [p[index] for p in parts]
        first = samples[0]
        for other in samples[1:]:
            if (
                getattr(other, "grid_shape", None) != getattr(first, "grid_shape", None)
                or getattr(other, "image_shape", None) != getattr(first, "image_shape", None)
                or other[1].shape != first[1].shape
                or not np.array_equal(other[1], first[1])
            ):
                raise ValueError(
                    f"sample {index}: the parts disagree on the graph "
                    f"(grid_shape {getattr(first, 'grid_shape', None)} vs "
                    f"{getattr(other, 'grid_shape', None)}, image_shape "
                    f"{getattr(first, 'image_shape', None)} vs "
                    f"{getattr(other, 'image_shape', None)}); give every part the same scale"
                )
        node_features = np.concatenate([p[index][0] for p in unary_parts], axis=1)
        edge_features = np.concatenate([p[index][2] for p in edge_parts], axis=1)
        out.append(
            CRFSample(
                node_features,
                first[1],
                edge_features,
                grid_shape=getattr(first, "grid_shape", None),
                image_shape=getattr(first, "image_shape", None),
            )
        )
    return out


def _as_transformer_list(value, name):
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ValueError(f"{name} must be a transformer or a non-empty list of transformers, got {value!r}")
    for item in items:
        if not (hasattr(item, "fit") and hasattr(item, "transform")):
            raise TypeError(
                f"{name} must be a transformer (with fit and transform) or a list of them, "
                f"got {type(item).__name__}"
            )
    return items


def _combined_names(parts, method):
    """The parts' feature names, concatenated; prefixed by the parts' names
    (lower-case class names, numbered when repeated, as ``make_union``)
    when there are several parts."""
    names = [list(getattr(part, method)()) for part in parts]
    if len(parts) == 1:
        return np.asarray(names[0], dtype=object)
    classes = [type(part).__name__.lower() for part in parts]
    seen = {}
    out = []
    for cls, part_names in zip(classes, names):
        seen[cls] = seen.get(cls, 0) + 1
        prefix = cls if classes.count(cls) == 1 else f"{cls}-{seen[cls]}"
        out += [f"{prefix}__{name}" for name in part_names]
    return np.asarray(out, dtype=object)


class CombinedFeatures(TransformerMixin, BaseEstimator):
    """Unary features from some transformers, edge features from others.

    Parameters
    ----------
    unary : transformer or list of transformers
        Their samples' node features are concatenated (in order).
    edge : transformer or list of transformers
        Their samples' edge features are concatenated (in order).

    All parts must produce samples on the same grid (the same ``scale``); the
    combined sample keeps their ``grid_shape`` and ``image_shape``. ``fit``
    fits clones of the parts (``unary_transformers_``, ``edge_transformers_``);
    when every part is stateless (like the transformers of this module),
    ``transform`` works without ``fit``.

    Examples
    --------
    Horse unary features with plain horizontal/vertical edge indicators:

    >>> from sklearn_margcrf.features import CombinedFeatures, DenoisingFeatures, HorseFeatures
    >>> features = CombinedFeatures(unary=HorseFeatures(), edge=DenoisingFeatures())
    """

    def __init__(self, unary, edge):
        self.unary = unary
        self.edge = edge

    def fit(self, X, y=None):
        """Fit clones of the parts on ``X``; returns self."""
        X = list(X)
        self.unary_transformers_ = [clone(t).fit(X, y) for t in _as_transformer_list(self.unary, "unary")]
        self.edge_transformers_ = [clone(t).fit(X, y) for t in _as_transformer_list(self.edge, "edge")]
        return self

    def transform(self, X):
        """Combined samples, one per image."""
        unary = _as_transformer_list(self.unary, "unary")
        edge = _as_transformer_list(self.edge, "edge")
        if hasattr(self, "unary_transformers_"):
            unary, edge = self.unary_transformers_, self.edge_transformers_
        elif any(get_tags(t).requires_fit for t in unary + edge):
            check_is_fitted(self)
        X = list(X)
        return combine_samples([t.transform(X) for t in unary], [t.transform(X) for t in edge])

    def get_feature_names_out(self, input_features=None):
        """Names of the node feature columns: the ``unary`` parts' names in
        order; with several parts, each prefixed by its part's name
        (``"horsefeatures__hog[3]"``; ``"-2"`` etc. after a repeated class).

        Parameters
        ----------
        input_features : None
            Ignored (images have no named input columns).

        Returns
        -------
        names : ndarray of str objects
        """
        return _combined_names(_as_transformer_list(self.unary, "unary"), "get_feature_names_out")

    def get_edge_feature_names_out(self):
        """Names of the edge feature columns: the ``edge`` parts' names, in
        order, prefixed as in :meth:`get_feature_names_out`."""
        return _combined_names(_as_transformer_list(self.edge, "edge"), "get_edge_feature_names_out")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        try:
            parts = _as_transformer_list(self.unary, "unary") + _as_transformer_list(self.edge, "edge")
            tags.requires_fit = any(get_tags(t).requires_fit for t in parts)
        except (TypeError, ValueError):
            tags.requires_fit = True
        tags.input_tags.two_d_array = False
        tags.input_tags.three_d_array = True
        tags.transformer_tags.preserves_dtype = []
        return tags


# ---------------------------------------------------------------------------
# A per-pixel classifier under the CRF

#: Probabilities are clipped below at this before the log, so that a class a
#: classifier rules out gives a finite feature (log(1e-6) = -13.8).
MIN_PROBABILITY = 1e-6


def _labelled_nodes(samples, y):
    """Stack the node features and labels of the labelled nodes of all samples."""
    if isinstance(y, (str, bytes)) or not hasattr(y, "__len__"):
        raise TypeError(f"y must be a list of label arrays (one per sample), got {type(y).__name__}")
    if len(y) != len(samples):
        raise ValueError(f"X has {len(samples)} samples but y has {len(y)} label arrays")
    features, labels = [], []
    for k, (sample, lab) in enumerate(zip(samples, y)):
        try:
            flat = labels_to_grid(np.asarray(lab), sample)
        except ValueError as exc:
            raise ValueError(f"y[{k}]: {exc}") from None
        values, observed = split_labels(flat, f"y[{k}]")
        features.append(np.asarray(sample[0])[observed])
        labels.append(values)
    return np.concatenate(features), np.concatenate(labels)


class ClassifierFeatures(TransformerMixin, BaseEstimator):
    """A per-pixel classifier's log-probabilities as the samples' node features.

    Stacking under the CRF: any scikit-learn classifier (gradient boosting, a
    random forest, logistic regression on network embeddings, ...) is fitted
    on the labelled nodes' features, and each sample's node features are
    replaced by the classifier's ``log P(class)`` (one column per class,
    probabilities clipped below at ``MIN_PROBABILITY`` = 1e-6); the edges, edge
    features, ``grid_shape`` and ``image_shape`` are kept. The CRF after it
    then learns how far to trust the classifier and how strongly to smooth.

    ``fit_transform`` (what :class:`~sklearn.pipeline.Pipeline` calls while
    fitting) is cross-fitted: the images are split by ``cv``, and the
    features of each image come from a clone fitted on the other folds, so
    that the CRF learns from evidence as good as it will be on new images,
    not from the classifier's overfitted answers on its own training
    pixels. ``transform`` (prediction) uses ``estimator_``, fitted on all the
    labelled nodes.

    Parameters
    ----------
    estimator : classifier
        A scikit-learn classifier with ``predict_proba``; cloned, never
        fitted itself.
    cv : int, cross-validation splitter or iterable, default=5
        How ``fit_transform`` splits the **images** (not the pixels, which
        are correlated within an image): an int k is ``KFold(k)`` over the
        samples, as :func:`~sklearn.model_selection.check_cv` makes it; a
        splitter or an iterable of (train, test) index arrays must index the
        samples. Every training split must hold labelled nodes.

    Attributes
    ----------
    estimator_ : classifier
        Fitted on the labelled nodes of all samples; used by ``transform``.
    classes_ : ndarray
        ``estimator_.classes_``: the class of each output column.
    n_features_in_ : int
        Node features of the input samples.
    n_edge_features_in_ : int
        Edge features of the input samples (kept as they are).

    Notes
    -----
    ``X`` is a list of samples (``CRFSample`` or ``(node_features, edges,
    edge_features)`` triples, as the feature transformers of this module
    produce) and ``y`` a list of integer label arrays, one per sample
    ((n,), the grid shape or the image shape; -1 = unlabelled), as
    :class:`~sklearn_margcrf.MarginalCRF` takes them. Folds lacking a class
    give that class's column ``log(MIN_PROBABILITY)``.

    Examples
    --------
    >>> from sklearn.ensemble import HistGradientBoostingClassifier
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn_margcrf import MarginalCRF
    >>> from sklearn_margcrf.features import ClassifierFeatures, HorseFeatures
    >>> model = make_pipeline(HorseFeatures(scale=0.5),
    ...                       ClassifierFeatures(HistGradientBoostingClassifier(), cv=5),
    ...                       MarginalCRF(n_iter=20))
    """

    _parameter_constraints = {
        "estimator": [HasMethods(["fit", "predict_proba"])],
        "cv": ["cv_object"],
    }

    def __init__(self, estimator, *, cv=5):
        self.estimator = estimator
        self.cv = cv

    def _check_X(self, X, reset):
        if isinstance(X, np.ndarray) and X.dtype != object:
            raise TypeError(
                f"X must be a list of samples (node_features, edges, edge_features), got an array of shape {X.shape}"
            )
        samples = [as_sample(sample) for sample in X]
        if not samples:
            raise ValueError("X is empty: need at least one sample")
        widths = {np.shape(s[0])[1] if np.ndim(s[0]) == 2 else None for s in samples}
        if None in widths or len(widths) != 1:
            raise ValueError(
                f"every sample's node_features must be 2-D with the same number of columns, got {sorted(map(str, widths))}"
            )
        (width,) = widths
        if reset:
            self.n_features_in_ = width
            self.n_edge_features_in_ = next((np.shape(s[2])[1] for s in samples if np.ndim(s[2]) == 2), 0)
        elif width != self.n_features_in_:
            raise ValueError(f"X has {width} node features, but ClassifierFeatures was fitted with {self.n_features_in_}")
        return samples

    def _fit(self, samples, y):
        self._validate_params()
        features, labels = _labelled_nodes(samples, y)
        if labels.size == 0:
            raise ValueError("y has no labelled node (every label is -1): nothing to learn from")
        self.estimator_ = clone(self.estimator).fit(features, labels)
        self.classes_ = np.asarray(self.estimator_.classes_)
        return self

    def fit(self, X, y):
        """Fit ``estimator_`` on the labelled nodes of all samples.

        Parameters
        ----------
        X : list of samples
            ``CRFSample`` or ``(node_features, edges, edge_features)`` triples.
        y : list of int arrays
            One label per node ((n,), grid or image shape), -1 = unlabelled.

        Returns
        -------
        self
        """
        return self._fit(self._check_X(X, reset=True), y)

    def _replace(self, samples, estimator):
        """The samples with ``log P(class)`` of ``estimator`` as node features,
        its classes placed in the columns of ``classes_``."""
        if not samples:
            return []
        sizes = np.cumsum([np.shape(s[0])[0] for s in samples])[:-1]
        proba = estimator.predict_proba(np.concatenate([np.asarray(s[0]) for s in samples]))
        columns = np.searchsorted(self.classes_, estimator.classes_)
        full = np.zeros((proba.shape[0], len(self.classes_)))
        full[:, columns] = proba
        log_proba = np.log(np.clip(full, MIN_PROBABILITY, 1.0))
        return [
            CRFSample(
                np.ascontiguousarray(part), s[1], s[2],
                grid_shape=getattr(s, "grid_shape", None), image_shape=getattr(s, "image_shape", None),
            )
            for s, part in zip(samples, np.split(log_proba, sizes))
        ]

    def transform(self, X):
        """Replace the node features by ``estimator_``'s log-probabilities.

        Parameters
        ----------
        X : list of samples

        Returns
        -------
        samples : list of CRFSample
            Node features of shape (n, ``len(classes_)``); edges, edge features
            and shapes as in ``X``.
        """
        check_is_fitted(self)
        return self._replace(self._check_X(X, reset=False), self.estimator_)

    def fit_transform(self, X, y):
        """Fit ``estimator_`` on all samples and return cross-fitted samples:
        each sample's log-probabilities come from a clone of ``estimator``
        fitted on the samples of the other folds of ``cv``.

        Parameters
        ----------
        X, y : as in :meth:`fit`

        Returns
        -------
        samples : list of CRFSample
        """
        samples = self._check_X(X, reset=True)
        self._fit(samples, y)
        cv = check_cv(self.cv)
        index = np.arange(len(samples)).reshape(-1, 1)
        n_splits = cv.get_n_splits(index)
        if n_splits > len(samples):
            raise ValueError(
                f"cv={self.cv!r} splits the samples (images) into {n_splits} folds but X has {len(samples)}: "
                "give a smaller cv"
            )
        out = [None] * len(samples)
        for train, test in cv.split(index):
            fold = clone(self.estimator).fit(*_labelled_nodes([samples[k] for k in train], [y[k] for k in train]))
            for k, sample in zip(test, self._replace([samples[k] for k in test], fold)):
                out[k] = sample
        missing = [k for k, sample in enumerate(out) if sample is None]
        if missing:
            raise ValueError(f"cv left samples {missing} out of every test fold; give a partition of the samples")
        return out

    def get_feature_names_out(self, input_features=None):
        """``"log_proba(<class>)"`` for each class of ``classes_``.

        Parameters
        ----------
        input_features : ignored
            The output does not depend on the input's names.

        Returns
        -------
        names : ndarray of str objects
        """
        check_is_fitted(self)
        return np.asarray([f"log_proba({c})" for c in self.classes_], dtype=object)

    def get_edge_feature_names_out(self, input_features=None):
        """The edge features pass through unchanged: ``input_features`` if
        given (for example the previous transformer's
        ``get_edge_feature_names_out()``), else ``"edge[k]"``."""
        check_is_fitted(self)
        if input_features is None:
            return np.asarray([f"edge[{k}]" for k in range(self.n_edge_features_in_)], dtype=object)
        if len(input_features) != self.n_edge_features_in_:
            raise ValueError(
                f"input_features has {len(input_features)} names but the samples had {self.n_edge_features_in_} "
                "edge features"
            )
        return np.asarray(input_features, dtype=object)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.target_tags.required = True
        tags.transformer_tags.preserves_dtype = []
        return tags
