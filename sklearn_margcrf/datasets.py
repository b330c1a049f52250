"""Data-set loaders for the paper's experiments, and a built-in problem.

Loaders (no network access, ever: each reads a local copy of the data set in
its original format):

- :func:`load_horses` -- Weizmann horses (paper Sec. "Horses");
- :func:`load_stanford_background` -- Stanford Background, iccv09Data (paper
  Sec. "Stanford Backgrounds Data");
- :func:`load_bsds_denoising` -- the binary denoising problem made from the
  BSDS300 images (paper Sec. "Binary Denoising Data");
- :func:`make_denoising_problem` -- a seeded synthetic denoising problem that
  needs no download (the README's demo and the tests use it).

Each ``load_*`` function returns a :class:`sklearn.utils.Bunch` with
``images`` (list of arrays), ``labels`` (list of int64 arrays, -1 = hidden)
and the split, or ``(images, labels)`` with ``return_X_y=True``;
:func:`make_denoising_problem` always returns ``(images, labels)``.

Where the data are looked for
-----------------------------
``path`` may name the data set's own folder (e.g. ``.../horses`` holding
``rgb/`` and ``figure_ground/``) or a folder containing it under one of its
usual names. With ``path=None`` the loaders look, in order, in

1. :func:`get_data_home` (``data_home`` argument, else the environment
   variable ``SKLEARN_MARGCRF_DATA``, else ``~/sklearn_margcrf_data``);
2. ``shared/data`` next to the current directory (``../shared/data``) and
   next to the source checkout of this package.

A missing data set raises :class:`FileNotFoundError` saying where it was
looked for and where to download it.
"""

import numbers
import os
import zlib
from pathlib import Path

import numpy as np
from sklearn.utils import Bunch, check_random_state

from ._graph import check_shape

__all__ = [
    "get_data_home",
    "load_horses",
    "load_stanford_background",
    "load_bsds_denoising",
    "make_denoising_problem",
    "binary_noise",
    "binarize_bsds_image",
    "read_horse",
    "read_regions",
    "STANFORD_BACKGROUND_CLASSES",
    "HORSES_URL",
    "BSDS300_URL",
    "STANFORD_BACKGROUND_URL",
]

#: Weizmann Horse Database (Borenstein and Ullman, ECCV 2002). The original
#: page, http://www.msri.org/people/members/eranb/, is gone; a mirror of the
#: original files is in the GitHub repository shenshutao/image_segmentation,
#: folder ``weizmann_horse_db/`` (``rgb/horseNNN.jpg``, ``figure_ground/horseNNN.jpg``).
HORSES_URL = "https://github.com/shenshutao/image_segmentation/tree/master/weizmann_horse_db"

#: BSDS300 images (Martin, Fowlkes, Tal, Malik, ICCV 2001; non-commercial
#: research and educational use).
BSDS300_URL = "https://www2.eecs.berkeley.edu/Research/Projects/CS/vision/bsds/BSDS300-images.tgz"

#: Stanford Background Dataset (Gould, Fulton, Koller, ICCV 2009).
STANFORD_BACKGROUND_URL = "http://dags.stanford.edu/data/iccv09Data.tar.gz"

#: Class names of the Stanford Background ``regions.txt`` labels 0..7.
STANFORD_BACKGROUND_CLASSES = (
    "sky",
    "tree",
    "road",
    "grass",
    "water",
    "building",
    "mountain",
    "foreground object",
)


def get_data_home(data_home=None):
    """Folder where the data sets are looked for first.

    ``data_home`` if given, else the environment variable
    ``SKLEARN_MARGCRF_DATA``, else ``~/sklearn_margcrf_data`` (like
    :func:`sklearn.datasets.get_data_home`, but nothing is downloaded into it,
    so it is not created).

    Returns
    -------
    pathlib.Path
    """
    if data_home is None:
        data_home = os.environ.get("SKLEARN_MARGCRF_DATA", os.path.join("~", "sklearn_margcrf_data"))
    return Path(data_home).expanduser()


def _shared_roots():
    here = Path(__file__).resolve()
    roots = [Path.cwd().parent / "shared" / "data", Path.cwd() / "shared" / "data"]
    roots += [parent / "shared" / "data" for parent in here.parents[1:3]]
    seen, out = set(), []
    for root in roots:
        key = os.path.abspath(root)
        if key not in seen:
            seen.add(key)
            out.append(root)
    return out


def _find_dataset(path, data_home, names, is_dataset, what, url, layout):
    """Return the folder of a data set, or raise FileNotFoundError."""
    if path is not None:
        bases = [Path(path).expanduser()]
    else:
        bases = [get_data_home(data_home)] + _shared_roots()
    tried = []
    for base in bases:
        for candidate in [base] + [base / name for name in names]:
            tried.append(str(candidate))
            if candidate.is_dir() and is_dataset(candidate):
                return candidate
    where = f"at {path}" if path is not None else "in any of: " + ", ".join(tried)
    raise FileNotFoundError(
        f"The {what} data set was not found {where}. Download it from {url} "
        f"and pass its folder as path= (or put it in {get_data_home(data_home)} under "
        f"one of the names {list(names)}, or set SKLEARN_MARGCRF_DATA). Expected layout: {layout}."
    )


def _check_subset(subset):
    if subset not in ("all", "train", "test"):
        raise ValueError(f"subset must be 'all', 'train' or 'test', got {subset!r}")


def _check_count(value, name, minimum=0):
    """``value`` as an int >= ``minimum`` (whole floats pass), else ValueError."""
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, numbers.Real)
        or not float(value).is_integer()
        or value < minimum
    ):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_max_images(max_images):
    if max_images is not None:
        _check_count(max_images, "max_images")


def _select(all_ids, ids, max_images):
    """Keep ``ids`` (in the order of ``all_ids``) then the first ``max_images``."""
    if ids is not None:
        wanted = {str(i) for i in ids}
        missing = wanted - set(all_ids)
        if missing:
            raise ValueError(f"unknown ids: {sorted(missing)[:5]}")
        all_ids = [i for i in all_ids if i in wanted]
    _check_max_images(max_images)
    if max_images is not None:
        all_ids = all_ids[: int(max_images)]
    return all_ids


def _imread(path):
    from skimage.io import imread

    return imread(str(path))


# ---------------------------------------------------------------------------
# Weizmann horses


def _is_horses(folder):
    return (folder / "rgb").is_dir() and (folder / "figure_ground").is_dir()


def _check_threshold(threshold):
    # the masks are 8-bit: outside (0, 255] every pixel gets the same label
    if isinstance(threshold, (bool, np.bool_)) or not isinstance(threshold, numbers.Real) or not 0 < threshold <= 255:
        raise ValueError(f"threshold must be a number in (0, 255] (the masks are 8-bit), got {threshold!r}")


HORSE_RESOLUTIONS = ("mask", "image")


def _check_resolution(resolution):
    if not isinstance(resolution, str) or resolution not in HORSE_RESOLUTIONS:
        raise ValueError(f"resolution must be one of {HORSE_RESOLUTIONS}, got {resolution!r}")


def read_horse(rgb_path, mask_path, threshold=128, resolution="mask"):
    """One horse: the colour image and its mask, at one resolution.

    ``resolution="mask"`` (the default) resizes the colour image to its
    mask's size; ``"image"`` keeps the colour image as it is and resizes the
    grey mask to it (bilinear, before the threshold), for a grid at the
    colour image's own resolution (3.6 times the pixels, at the median).

    Returns
    -------
    image : uint8 array (h, w, 3)
        Resized with :func:`skimage.transform.resize` (anti-aliased,
        bilinear) for ``"mask"``; grey JPEGs are replicated into three
        channels.
    labels : int64 array (h, w)
        1 where the mask is ``>= threshold`` (horse), else 0.
    """
    from skimage.color import gray2rgb
    from skimage.transform import resize
    from skimage.util import img_as_ubyte

    _check_threshold(threshold)
    _check_resolution(resolution)
    mask = _imread(mask_path)
    if mask.ndim == 3:
        mask = mask[..., 0]
    image = _imread(rgb_path)
    if image.ndim == 2:
        image = gray2rgb(image)
    image = image[..., :3]
    if image.shape[:2] != mask.shape and resolution == "mask":
        image = img_as_ubyte(resize(image, mask.shape + (3,), order=1, anti_aliasing=True))
    elif image.shape[:2] != mask.shape:
        mask = resize(mask.astype(np.float64), image.shape[:2], order=1, anti_aliasing=True, preserve_range=True)
    return image, (mask >= threshold).astype(np.int64)


def _split_bunch(images, labels, ids, subsets, **fields):
    """The Bunch of a data set with a train / test split: ``subset`` names
    each image's part, ``train_index`` / ``test_index`` list them."""
    subsets = np.array(subsets, dtype=object)
    return Bunch(
        images=images,
        labels=labels,
        ids=ids,
        subset=subsets,
        train_index=np.flatnonzero(subsets == "train"),
        test_index=np.flatnonzero(subsets == "test"),
        **fields,
    )


def load_horses(
    path=None,
    *,
    subset="all",
    ids=None,
    max_images=None,
    n_train=200,
    threshold=128,
    resolution="mask",
    data_home=None,
    return_X_y=False,
):
    """Load the Weizmann horses: colour images and binary figure/ground masks.

    Original data: E. Borenstein and S. Ullman, "Class-specific, top-down
    segmentation", ECCV 2002, once at http://www.msri.org/people/members/eranb/;
    a mirror of the original files: ``HORSES_URL``. Layout: ``rgb/horseNNN.jpg``
    (colour, at their original resolution) and ``figure_ground/horseNNN.jpg``
    (8-bit grey masks, smaller than the colour images), 328 images.

    Parameters
    ----------
    path : str or Path, default=None
        The data set's folder (holding ``rgb/`` and ``figure_ground/``) or a
        folder containing it as ``horses/`` or ``weizmann_horse_db/``. None
        looks in :func:`get_data_home` and ``../shared/data`` (module
        docstring).
    subset : {"all", "train", "test"}, default="all"
        The paper's split, 200 training and 128 test images: the first
        ``n_train`` ids in sorted order (``horse001`` .. ``horse200``) train,
        the rest (``horse201`` .. ``horse328``) test. (The paper does not say
        which images it used for which; this is our choice.)
    ids : list of str, default=None
        Keep only these ids (e.g. ``["horse001"]``), in sorted order.
    max_images : int, default=None
        Keep only the first ``max_images`` of the selection (for quick runs).
    n_train : int, default=200
    threshold : int, default=128
        Mask pixels ``>= threshold`` are horse (label 1); JPEG ringing leaves
        fewer than 0.1% of pixels ambiguous.
    resolution : {"mask", "image"}, default="mask"
        ``"mask"``: each colour image resized to its mask's size (the masks
        are 0.22-3.2 times the colour images' width, 0.53 at the median);
        ``"image"``: the colour images as they are, each mask resized to its
        image (:func:`read_horse`). The paper does not say which it used.
    data_home : str or Path, default=None
    return_X_y : bool, default=False

    Returns
    -------
    data : Bunch
        ``images`` (list of uint8 (h, w, 3) arrays, at the ``resolution``
        chosen), ``labels`` (list of int64 (h, w) arrays, 1 = horse, 0 =
        background), ``ids``, ``subset`` (array of "train"/"test" per image),
        ``train_index`` and ``test_index`` (positions in ``images``),
        ``target_names`` and ``DESCR``.
    (images, labels) : tuple if ``return_X_y``

    Raises
    ------
    FileNotFoundError
        If the data set is not found; the message says where to get it.
    """
    _check_subset(subset)
    n_train = _check_count(n_train, "n_train")
    _check_threshold(threshold)
    _check_resolution(resolution)
    folder = _find_dataset(
        path,
        data_home,
        ("horses", "weizmann_horse_db"),
        _is_horses,
        "Weizmann horses",
        HORSES_URL,
        "rgb/horseNNN.jpg and figure_ground/horseNNN.jpg",
    )
    all_ids = sorted(p.stem for p in (folder / "figure_ground").glob("*.jpg"))
    if not all_ids:
        raise FileNotFoundError(f"no figure_ground/*.jpg in {folder}; download {HORSES_URL}")
    split = {i: ("train" if k < n_train else "test") for k, i in enumerate(all_ids)}
    chosen = [i for i in all_ids if subset == "all" or split[i] == subset]
    chosen = _select(chosen, ids, max_images)
    images, labels = [], []
    for i in chosen:
        image, mask = read_horse(folder / "rgb" / f"{i}.jpg", folder / "figure_ground" / f"{i}.jpg", threshold, resolution)
        images.append(image)
        labels.append(mask)
    if return_X_y:
        return images, labels
    return _split_bunch(
        images, labels, chosen, [split[i] for i in chosen],
        target_names=np.array(["background", "horse"]),
        path=str(folder),
        DESCR=(
            "Weizmann horses (Borenstein and Ullman, ECCV 2002): "
            + ("colour images resized to their figure/ground masks' size" if resolution == "mask"
               else "masks resized to their colour images' size")
            + "; labels 1 = horse. "
            f"Split: first {n_train} sorted ids train, the rest test."
        ),
    )


# ---------------------------------------------------------------------------
# Stanford Background


def _is_stanford(folder):
    return (folder / "images").is_dir() and (folder / "labels").is_dir()


def read_regions(path):
    """Read a Stanford Background ``<id>.regions.txt`` file.

    A whitespace-separated integer matrix, one row per image row: 0 sky,
    1 tree, 2 road, 3 grass, 4 water, 5 building, 6 mountain, 7 foreground
    object; negative values (unknown) become -1 (hidden).

    Returns
    -------
    labels : int64 array (H, W)
    """
    labels = np.loadtxt(str(path), dtype=np.int64, ndmin=2)
    labels[labels < 0] = -1
    return labels


def load_stanford_background(
    path=None,
    *,
    ids=None,
    max_images=None,
    n_folds=5,
    shuffle=True,
    random_state=0,
    data_home=None,
    return_X_y=False,
):
    """Load the Stanford Background Dataset (iccv09Data): images and region labels.

    Original data: S. Gould, R. Fulton, D. Koller, "Decomposing a Scene into
    Geometric and Semantically Consistent Regions", ICCV 2009; download
    ``STANFORD_BACKGROUND_URL`` (``iccv09Data/images/<id>.jpg``,
    ``iccv09Data/labels/<id>.regions.txt``), 715 images of about 320 x 240.

    Parameters
    ----------
    path : str or Path, default=None
        The data set's folder (holding ``images/`` and ``labels/``) or a
        folder containing it as ``stanford_background/`` or ``iccv09Data/``.
        None looks in :func:`get_data_home` and ``../shared/data``.
    ids : list of str, default=None
        Keep only these ids (e.g. ``["0000047"]``), in sorted order.
    max_images : int, default=None
        Keep only the first ``max_images`` of the selection.
    n_folds : int, default=5
        Number of cross-validation folds (the paper uses five-fold
        cross-validation over all 715 images).
    shuffle : bool, default=True
        Assign the images to folds at random (``True``) or in contiguous
        runs of the sorted ids (``False``: fold 0 holds the first fifth of
        the ids, and so on). The ids come in ranges by source (LabelMe,
        MSRC, PASCAL VOC, Geometric Context), so contiguous folds test on
        sources the training folds hold few of. The paper does not say how
        its folds were drawn.
    random_state : int, RandomState or None, default=0
        Seeds the fold assignment when ``shuffle``:
        ``sklearn.model_selection.KFold(n_folds, shuffle=True,
        random_state=random_state)`` over *all* images in sorted id order,
        before ``ids`` / ``max_images`` select a subset, so an image's fold
        does not depend on the selection. Unused when ``shuffle=False``.
    data_home : str or Path, default=None
    return_X_y : bool, default=False

    Returns
    -------
    data : Bunch
        ``images`` (list of uint8 (H, W, 3) arrays), ``labels`` (list of int64
        (H, W) arrays in 0..7, -1 = unknown/hidden), ``ids``, ``folds`` (int
        array, the fold 0..n_folds-1 of each image: use
        ``sklearn.model_selection.PredefinedSplit(data.folds)`` for the
        cross-validation), ``target_names`` and ``DESCR``.
    (images, labels) : tuple if ``return_X_y``
    """
    from sklearn.model_selection import KFold

    n_folds = _check_count(n_folds, "n_folds", minimum=1)
    if not isinstance(shuffle, (bool, np.bool_)):
        raise ValueError(f"shuffle must be True or False, got {shuffle!r}")
    folder = _find_dataset(
        path,
        data_home,
        ("stanford_background", "iccv09Data"),
        _is_stanford,
        "Stanford Background (iccv09Data)",
        STANFORD_BACKGROUND_URL,
        "images/<id>.jpg and labels/<id>.regions.txt",
    )
    all_ids = sorted(p.stem for p in (folder / "images").glob("*.jpg"))
    if not all_ids:
        raise FileNotFoundError(f"no images/*.jpg in {folder}; download {STANFORD_BACKGROUND_URL}")
    fold_of = np.zeros(len(all_ids), dtype=np.int64)
    if n_folds > 1:
        if n_folds > len(all_ids):
            raise ValueError(f"n_folds={n_folds} exceeds the number of images ({len(all_ids)})")
        kfold = KFold(n_splits=n_folds, shuffle=bool(shuffle), random_state=random_state if shuffle else None)
        for k, (_, test) in enumerate(kfold.split(np.zeros(len(all_ids)))):
            fold_of[test] = k
    fold_of = dict(zip(all_ids, fold_of))
    chosen = _select(all_ids, ids, max_images)
    images, labels = [], []
    for i in chosen:
        image = _imread(folder / "images" / f"{i}.jpg")
        if image.ndim == 2:
            from skimage.color import gray2rgb

            image = gray2rgb(image)
        label = read_regions(folder / "labels" / f"{i}.regions.txt")
        if label.shape != image.shape[:2]:
            raise ValueError(f"{i}: labels of shape {label.shape} do not match the image {image.shape[:2]}")
        images.append(image[..., :3])
        labels.append(label)
    if return_X_y:
        return images, labels
    return Bunch(
        images=images,
        labels=labels,
        ids=chosen,
        folds=np.array([fold_of[i] for i in chosen], dtype=np.int64),
        target_names=np.array(STANFORD_BACKGROUND_CLASSES),
        path=str(folder),
        DESCR=(
            "Stanford Background Dataset (Gould, Fulton and Koller, ICCV 2009): "
            "8 region classes, -1 = unknown (hidden). folds: "
            f"{n_folds}-fold KFold(shuffle=True, random_state={random_state!r}) over all sorted ids."
        ),
    )


# ---------------------------------------------------------------------------
# Binary denoising


def binary_noise(labels, noise=1.25, random_state=None):
    """The paper's noisy input ``y = x (1 - t**n) + (1 - x) t**n``, t ~ U[0, 1] per pixel.

    Parameters
    ----------
    labels : array of 0/1
        The true binary image x.
    noise : float > 0, default=1.25
        Noise level n; lower is noisier (the paper uses 1.25, 1.5 and 5).
    random_state : int, RandomState, Generator or None

    Returns
    -------
    y : float64 array shaped like ``labels``, in [0, 1]
    """
    if isinstance(noise, (bool, np.bool_)) or not isinstance(noise, numbers.Real) or not 0 < noise < np.inf:
        raise ValueError(f"noise must be a positive number (the paper's n > 1), got {noise!r}")
    x = np.asarray(labels, dtype=np.float64)
    if not np.all((x == 0) | (x == 1)):
        raise ValueError("labels must be a binary image of 0s and 1s (NaN or other values found)")
    if isinstance(random_state, np.random.Generator):
        t = random_state.uniform(size=x.shape)
    else:
        t = check_random_state(random_state).uniform(size=x.shape)
    tn = t**noise
    return x * (1.0 - tn) + (1.0 - x) * tn


def _is_bsds(folder):
    return (folder / "images").is_dir() and (
        ((folder / "train.txt").is_file() and (folder / "val.txt").is_file())
        or ((folder / "iids_train.txt").is_file() and (folder / "iids_test.txt").is_file())
    )


def _read_ids(path):
    return [line.strip() for line in Path(path).read_text().split() if line.strip()]


def _bsds_files(folder):
    """(train ids, test ids, id -> image path) for either layout."""
    if (folder / "train.txt").is_file():
        train, test = _read_ids(folder / "train.txt"), _read_ids(folder / "val.txt")
        where = {i: folder / "images" / f"{i}.jpg" for i in train + test}
    else:  # the original BSDS300 layout
        train, test = _read_ids(folder / "iids_train.txt"), _read_ids(folder / "iids_test.txt")
        where = {i: folder / "images" / "train" / f"{i}.jpg" for i in train}
        where.update({i: folder / "images" / "test" / f"{i}.jpg" for i in test})
    return train, test, where


def binarize_bsds_image(image, shape=(200, 300)):
    """Grey image resized to ``shape`` (transposed for portrait images),
    binarised at its mean: the paper's clean labels x (int64)."""
    from skimage.color import rgb2gray
    from skimage.transform import resize
    from skimage.util import img_as_float

    grey = img_as_float(image)
    if grey.ndim == 3:
        grey = rgb2gray(grey[..., :3])
    target = tuple(shape) if grey.shape[0] <= grey.shape[1] else tuple(shape)[::-1]
    grey = resize(grey, target, order=1, anti_aliasing=True)
    return (grey > grey.mean()).astype(np.int64)


def load_bsds_denoising(
    path=None,
    *,
    noise=1.25,
    n_train=32,
    n_test=100,
    random_state=0,
    shape=(200, 300),
    data_home=None,
    return_X_y=False,
):
    """The paper's binary denoising problem made from BSDS300 images.

    Original data: D. Martin, C. Fowlkes, D. Tal, J. Malik, ICCV 2001
    (non-commercial research and educational use); download
    ``BSDS300_URL``. Two layouts are read: ``images/<id>.jpg`` with
    ``train.txt`` / ``val.txt`` id lists (the shared copy), or the original
    ``images/train/<id>.jpg``, ``images/test/<id>.jpg`` with
    ``iids_train.txt`` / ``iids_test.txt``.

    Each image is converted to grey, resized to ``shape`` (200 x 300, or
    300 x 200 for portrait images), binarised at its mean (the labels x), and
    the noisy input is ``y = x (1 - t**n) + (1 - x) t**n`` with t uniform per
    pixel (:func:`binary_noise`).

    Parameters
    ----------
    path : str or Path, default=None
        The data set's folder or a folder containing it as ``bsds300/`` or
        ``BSDS300/``. None looks in :func:`get_data_home` and ``../shared/data``.
    noise : float, default=1.25
        The noise level n (the paper: 1.25, 1.5, 5).
    n_train : int, default=32
        The first ``n_train`` ids of the training list (``train.txt``, BSDS300
        train) in file order.
    n_test : int, default=100
        The first ``n_test`` ids of the test list (``val.txt``, BSDS300 test).
        The paper uses 32 training and 100 test images.
    random_state : int, RandomState or None, default=0
        One base seed is drawn from ``check_random_state(random_state)``; the
        noise of image ``id`` is drawn from
        ``numpy.random.default_rng([base_seed, int(id)])``, so an image's noise
        does not depend on ``n_train`` / ``n_test``.
    shape : (int, int), default=(200, 300)
        Landscape size (height, width); portrait images get the transpose.
    data_home : str or Path, default=None
    return_X_y : bool, default=False

    Returns
    -------
    data : Bunch
        ``images`` (list of float64 noisy inputs y in [0, 1]), ``labels``
        (list of int64 clean binary images x), ``ids``, ``subset``,
        ``train_index``, ``test_index``, ``noise`` and ``DESCR``.
    (images, labels) : tuple if ``return_X_y``
    """
    n_train, n_test = _check_count(n_train, "n_train"), _check_count(n_test, "n_test")
    shape = check_shape(shape, "shape")
    folder = _find_dataset(
        path,
        data_home,
        ("bsds300", "BSDS300"),
        _is_bsds,
        "BSDS300",
        BSDS300_URL,
        "images/<id>.jpg with train.txt and val.txt, or the original BSDS300 "
        "images/{train,test}/<id>.jpg with iids_train.txt and iids_test.txt",
    )
    train, test, where = _bsds_files(folder)
    if n_train > len(train) or n_test > len(test):
        raise ValueError(
            f"asked for {n_train} training and {n_test} test images but {folder} has "
            f"{len(train)} and {len(test)}"
        )
    chosen = train[: int(n_train)] + test[: int(n_test)]
    base_seed = int(check_random_state(random_state).randint(np.iinfo(np.int32).max))
    images, labels = [], []
    for i in chosen:
        x = binarize_bsds_image(_imread(where[i]), shape)
        rng = np.random.default_rng([base_seed, int(i) if i.isdigit() else zlib.crc32(i.encode())])
        images.append(binary_noise(x, noise, rng))
        labels.append(x)
    if return_X_y:
        return images, labels
    return _split_bunch(
        images, labels, chosen, ["train"] * int(n_train) + ["test"] * int(n_test),
        noise=noise,
        path=str(folder),
        DESCR=(
            "Binary denoising from BSDS300 (paper Sec. 'Binary Denoising Data'): grey "
            f"image resized to {tuple(shape)} (transposed for portrait), binarised at its mean; "
            f"y = x(1 - t^n) + (1 - x)t^n, n = {noise}."
        ),
    )


def make_denoising_problem(
    n_images=10,
    shape=(60, 80),
    noise=1.25,
    *,
    min_shapes=3,
    max_shapes=8,
    random_state=0,
):
    """A seeded synthetic binary denoising problem that needs no download.

    Each clean image x is piecewise constant: the union of ``min_shapes`` ..
    ``max_shapes`` random rectangles, ellipses, triangles and circles drawn by
    :func:`skimage.draw.random_shapes` (sizes from a fifth to two thirds of the
    smaller side, overlaps allowed), label 1 inside a shape and 0 outside. The
    noisy input is the paper's ``y = x (1 - t**n) + (1 - x) t**n``
    (:func:`binary_noise`).

    Parameters
    ----------
    n_images : int, default=10
    shape : (int, int), default=(60, 80)
    noise : float, default=1.25
        The paper's noise level n (lower is noisier).
    min_shapes, max_shapes : int, default=3, 8
    random_state : int, RandomState or None, default=0

    Returns
    -------
    images : list of float64 (h, w) arrays
        The noisy inputs y.
    labels : list of int64 (h, w) arrays
        The clean images x.
    """
    from skimage.draw import random_shapes

    n_images = _check_count(n_images, "n_images")
    height, width = check_shape(shape, "shape", minimum=4)
    rng = check_random_state(random_state)
    smaller = min(height, width)
    min_size = max(2, smaller // 5)
    max_size = max(min_size + 1, (2 * smaller) // 3)
    images, labels = [], []
    for _ in range(int(n_images)):
        drawn, _ = random_shapes(
            (height, width),
            max_shapes=max_shapes,
            min_shapes=min_shapes,
            min_size=min_size,
            max_size=max_size,
            num_channels=1,
            intensity_range=(0, 0),
            allow_overlap=True,
            rng=int(rng.randint(np.iinfo(np.int32).max)),
        )
        x = (drawn[..., 0] < 255).astype(np.int64)
        images.append(binary_noise(x, noise, rng))
        labels.append(x)
    return images, labels
