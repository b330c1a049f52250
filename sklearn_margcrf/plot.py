"""Plots of predicted marginals and of learning curves (matplotlib).

matplotlib is imported when a function is called, not with this module; it
comes with the ``plot`` extra (``pip install "sklearn-margcrf[plot]"``).

- :func:`plot_marginals`: an image, its marginals (one panel per class, or
  one map whose colours mix the class colours by the marginals) and
  optionally its true labels.
- :func:`plot_loss_curve`: the objective of a fit against L-BFGS iterations
  or seconds, one line per stage of the fit.

Both draw on the axes they are given (``ax``) or on a new pyplot figure, and
return the axes they drew on, so that titles, labels and layout stay in the
caller's hands.
"""

import numbers

import numpy as np

from ._graph import encode_labels

__all__ = ["plot_marginals", "plot_loss_curve"]


def _matplotlib():
    try:
        import matplotlib  # noqa: F401
        from matplotlib.colors import to_rgb
    except ImportError as exc:
        raise ImportError(
            "sklearn_margcrf.plot needs matplotlib, which the 'plot' extra installs: "
            'pip install "sklearn-margcrf[plot]" (or pip install matplotlib)'
        ) from exc
    return to_rgb


def _axes(ax, n_panels, panel_names):
    """``n_panels`` axes: the given ones (one Axes or a sequence of them) or a
    new pyplot figure's row."""
    if ax is None:
        import matplotlib.pyplot as plt

        _, axes = plt.subplots(1, n_panels, figsize=(2.6 * n_panels, 2.6), squeeze=False)
        return list(axes[0])
    axes = list(np.ravel(np.asarray(ax, dtype=object)))
    if len(axes) != n_panels:
        raise ValueError(
            f"ax holds {len(axes)} axes but {n_panels} panels are drawn ({', '.join(panel_names)}); "
            f"pass {n_panels} axes or ax=None"
        )
    return axes


def _default_colours(n_states, to_rgb):
    """Black and white for two classes (a grey map is then P(class 1)),
    else the tab10 / tab20 colours, else evenly spaced ``turbo`` colours."""
    import matplotlib

    if n_states == 2:
        return np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    if n_states <= 20:
        cmap = matplotlib.colormaps["tab10" if n_states <= 10 else "tab20"]
        return np.array([to_rgb(cmap(k)) for k in range(n_states)])
    cmap = matplotlib.colormaps["turbo"]
    return np.array([to_rgb(c) for c in cmap(np.linspace(0.0, 1.0, n_states))])


def _hide_ticks(ax):
    ax.set_xticks([])
    ax.set_yticks([])


def plot_marginals(
    image,
    proba,
    *,
    truth=None,
    classes=None,
    kind="panels",
    states=None,
    class_names=None,
    colors=None,
    unlabelled_color=None,
    cmap="gray",
    titles=True,
    legend=True,
    ax=None,
):
    """Draw an image, its predicted marginals and optionally its true labels.

    Panels, in this order: the image (unless ``image`` is None), the true
    labels (when ``truth`` is given, each class in its colour), then the
    marginals: with ``kind="panels"`` one panel per class, ``P(class)`` in
    ``cmap`` on [0, 1]; with ``kind="map"`` one image whose pixel colour is
    ``sum_k P(k) * colors[k]`` (a confident pixel has its class's colour, an
    uncertain one a blend).

    Parameters
    ----------
    image : array of shape (H, W) or (H, W, 3), or None
        The input image (float images in [0, 1], or uint8); None draws no
        image panel.
    proba : array of shape (H, W, K), or None
        The marginals of one image, as one entry of
        ``MarginalCRF.predict_proba`` returns them; None draws only the image
        and the truth.
    truth : int array of shape (H, W), default=None
        True states, -1 for unlabelled pixels; with ``classes``, labels among
        them (None or -1 for unlabelled pixels, as ``MarginalCRF`` reads y).
    classes : array-like, default=None
        The labels that the last axis of ``proba`` follows (a fitted
        estimator's ``classes_``): ``truth`` is read in them, and they name
        the classes unless ``class_names`` is given. None: the states 0, 1, ...
    kind : {"panels", "map"}, default="panels"
        One panel per class, or one colour-coded map.
    states : sequence of int, default=None
        The classes (indices of the last axis of ``proba``) that get a panel
        with ``kind="panels"``; None: all. ``states=[1]`` shows ``P(x = 1)``
        of a binary problem alone.
    class_names : sequence of str, default=None
        One name per class for the titles and the legend; None: 0, 1, ...
    colors : sequence of colours, default=None
        One matplotlib colour per class, for the truth and the map. None:
        black and white for two classes, else the ``tab10`` / ``tab20``
        colours (``turbo`` beyond 20 classes).
    unlabelled_color : colour, default=None
        Colour of unlabelled (-1) pixels in the truth; None: mid grey for the
        default two-class colours, else black.
    cmap : str or Colormap, default="gray"
        Colour map of the per-class panels (and of a grey image).
    titles : bool or sequence of str, default=True
        True: "image", "truth", "P(<class>)" or "marginals"; False: none; a
        sequence: one title per panel.
    legend : bool or Axes, default=True
        A legend of the class colours (and of the unlabelled colour when the
        truth has unlabelled pixels) whenever those colours are drawn (the
        truth, the map): on the map (or truth) panel, or centred on the given
        Axes, whose frame is then hidden. False: no legend.
    ax : Axes or sequence of Axes, default=None
        Exactly one Axes per panel; None draws on a new pyplot figure.

    Returns
    -------
    axes : list of Axes
        The panels, in the order above.

    Examples
    --------
    >>> import numpy as np
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from sklearn_margcrf.plot import plot_marginals
    >>> proba = np.full((4, 5, 2), 0.5)
    >>> axes = plot_marginals(np.zeros((4, 5)), proba, truth=np.zeros((4, 5), int))
    >>> [a.get_title() for a in axes]
    ['image', 'truth', 'P(0)', 'P(1)']
    """
    to_rgb = _matplotlib()
    if kind not in ("panels", "map"):
        raise ValueError(f"kind must be 'panels' or 'map', got {kind!r}")
    if proba is not None:
        proba = np.asarray(proba, dtype=np.float64)
        if proba.ndim != 3 or proba.shape[-1] < 2:
            raise ValueError(
                f"proba must be the (H, W, K) marginals of one image with K >= 2 classes, got shape {proba.shape}; "
                "pass one entry of predict_proba's list, and reshape (n, K) node marginals to the grid"
            )
    shape = proba.shape[:2] if proba is not None else None
    n_states, source = (proba.shape[-1], "proba") if proba is not None else (None, None)
    for name, values in (("class_names", class_names), ("colors", colors)):
        if values is not None:
            if n_states is not None and len(values) != n_states:
                raise ValueError(f"{name} has {len(values)} entries but {source} has {n_states} classes")
            n_states, source = len(values), name
    if image is not None:
        image = np.asarray(image)
        if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[-1] not in (3, 4)):
            raise ValueError(f"image must have shape (H, W) or (H, W, 3), got {image.shape}")
        if shape is not None and image.shape[:2] != shape:
            raise ValueError(f"image has shape {image.shape[:2]} but proba has {shape}: they must agree")
        shape = shape or image.shape[:2]
    if classes is not None:
        classes = np.asarray(classes)
        class_names = [str(c) for c in classes.tolist()] if class_names is None else class_names
        if truth is not None:
            truth = encode_labels(truth, classes, "truth")
    if truth is not None:
        truth = np.asarray(truth)
        if truth.ndim != 2 or (shape is not None and truth.shape != shape):
            raise ValueError(f"truth must have shape {shape or '(H, W)'}, got {truth.shape}")
        if not np.issubdtype(truth.dtype, np.integer) and truth.dtype != bool:
            raise ValueError(f"truth must hold integer states (-1 = unlabelled), got dtype {truth.dtype}")
        truth = truth.astype(np.int64)
        if n_states is None:
            n_states = max(int(truth.max()) + 1, 2)
        if truth.size and (truth.min() < -1 or truth.max() >= n_states):
            raise ValueError(f"truth holds states in [{truth.min()}, {truth.max()}], outside [-1, {n_states - 1}]")
    if image is None and proba is None and truth is None:
        raise ValueError("nothing to draw: image, proba and truth are all None")
    if states is None:
        states = range(n_states) if proba is not None else []
    states = list(states)
    for k in states:
        if not isinstance(k, numbers.Integral) or not 0 <= k < (n_states or 0):
            raise ValueError(f"states must be class indices in [0, {n_states - 1}], got {k!r}")
    names = [str(c) for c in (class_names if class_names is not None else range(n_states or 0))]

    panels = (["image"] if image is not None else []) + (["truth"] if truth is not None else [])
    if proba is not None:
        panels += [f"P({names[k]})" for k in states] if kind == "panels" else ["marginals"]
    if titles is True:
        titles = panels
    elif titles is False:
        titles = [""] * len(panels)
    elif len(titles) != len(panels):
        raise ValueError(f"titles has {len(titles)} entries for {len(panels)} panels ({', '.join(panels)})")
    axes = _axes(ax, len(panels), panels)

    default_colours = colors is None
    palette = None
    if n_states is not None:
        palette = _default_colours(n_states, to_rgb) if default_colours else np.array([to_rgb(c) for c in colors])
    if unlabelled_color is None:
        unlabelled_color = (0.5, 0.5, 0.5) if default_colours and n_states == 2 else (0.0, 0.0, 0.0)
    unlabelled_rgb = np.array(to_rgb(unlabelled_color))

    drawn = iter(axes)
    coloured = None  # the panel whose colours the legend explains
    if image is not None:
        axis = next(drawn)
        if image.ndim == 2:
            top = np.iinfo(image.dtype).max if np.issubdtype(image.dtype, np.integer) else 1.0
            axis.imshow(image, cmap=cmap, vmin=0, vmax=top, interpolation="nearest")
        else:
            axis.imshow(image, interpolation="nearest")
    if truth is not None:
        axis = next(drawn)
        rgb = np.empty(truth.shape + (3,))
        rgb[truth < 0] = unlabelled_rgb
        rgb[truth >= 0] = palette[truth[truth >= 0]]
        axis.imshow(rgb, interpolation="nearest")
        coloured = axis
    if proba is not None and kind == "panels":
        for k in states:
            next(drawn).imshow(proba[..., k], cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest")
    elif proba is not None:
        axis = next(drawn)
        axis.imshow(np.clip(proba @ palette, 0.0, 1.0), interpolation="nearest")
        coloured = axis
    for axis, title in zip(axes, titles):
        _hide_ticks(axis)
        if title:
            axis.set_title(title, fontsize=9)

    if legend is not False and coloured is not None:
        from matplotlib.patches import Patch

        handles = [Patch(facecolor=c, edgecolor="0.5", label=n) for c, n in zip(palette, names)]
        if truth is not None and np.any(truth < 0):
            handles.append(Patch(facecolor=unlabelled_rgb, edgecolor="0.5", label="unlabelled"))
        if legend is True:
            coloured.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
        else:
            legend.axis("off")
            legend.legend(handles=handles, loc="center", fontsize=8, frameon=False)
    return axes


def _final_step(estimator):
    """The last step of (nested) pipelines."""
    while hasattr(estimator, "steps"):
        estimator = estimator.steps[-1][1]
    return estimator


def _stages(records):
    """Group progress records into stages: (name, [records]); a stage ends
    when the name changes or the iteration count starts again."""
    stages = []
    previous = None
    for index, record in enumerate(records):
        try:
            stage, n_iter = record.stage, int(record.n_iter)
            _ = float(record.objective) + float(record.elapsed)  # numbers, as plotted
        except (AttributeError, TypeError, ValueError):
            raise TypeError(
                f"record {index} is a {type(record).__name__}: a history must hold the progress records that "
                "MarginalCRF's callback receives (with stage, n_iter, objective and elapsed)"
            ) from None
        if previous is None or stage != previous.stage or n_iter <= int(previous.n_iter):
            stages.append((stage, []))
        stages[-1][1].append(record)
        previous = record
    return stages


def plot_loss_curve(estimator, *, x="iteration", ax=None, label=None, **line_kwargs):
    """Plot the objective of a fit against L-BFGS iterations or seconds.

    Parameters
    ----------
    estimator : MarginalCRF, Pipeline ending in one, or list of progress records
        A fitted estimator: its ``loss_curve_`` against the iterations or its
        ``time_curve_`` (the final fit, all ``incremental`` stages in one
        line; the initialising fits are not in it, but the time they took is
        the gap before the first point). Or the records its ``callback``
        received (``records = []; MarginalCRF(callback=records.append)``):
        every stage, the initialising fits (``"independent"``,
        ``"surrogate_likelihood"``) and each ``"fit[k images]"`` stage of
        ``incremental`` included, each drawn as its own line and separated by
        dotted vertical lines.
    x : {"iteration", "time"}, default="iteration"
        The horizontal axis: L-BFGS iterations (counted over all the stages
        drawn) or seconds since the start of ``fit``.
    ax : Axes, default=None
        None draws on a new pyplot figure.
    label : str, default=None
        Label of a single line (default: the stage's name, e.g. "fit"), for
        a legend the caller draws; with several stages, put before each
        stage's name in the legend drawn here.
    **line_kwargs
        Passed to matplotlib's ``Axes.plot`` (colour, line style, ...).

    Returns
    -------
    ax : Axes
    """
    _matplotlib()
    if x not in ("iteration", "time"):
        raise ValueError(f"x must be 'iteration' or 'time', got {x!r}")
    if isinstance(estimator, (list, tuple)):
        if not estimator:
            raise ValueError("the history holds no progress record: was the fit's callback records.append?")
        stages = [
            (name, [float(r.objective) for r in group], [float(r.elapsed) for r in group])
            for name, group in _stages(estimator)
        ]
    else:
        from sklearn.utils.validation import check_is_fitted

        final = _final_step(estimator)
        check_is_fitted(final, ["loss_curve_", "time_curve_"])
        if not final.loss_curve_:
            raise ValueError("the fit made no L-BFGS iteration (loss_curve_ is empty): nothing to plot")
        stages = [("fit", list(final.loss_curve_), list(final.time_curve_))]
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(5.0, 3.5))
    start, previous_end = 0, None
    for name, objective, seconds in stages:
        xs = seconds if x == "time" else list(range(start + 1, start + len(objective) + 1))
        if previous_end is not None:  # the boundary with the previous stage
            ax.axvline(previous_end, color="0.6", linestyle=":", linewidth=1.0)
        text = name if label is None else (label if len(stages) == 1 else f"{label}: {name}")
        ax.plot(xs, objective, label=text, **line_kwargs)
        start += len(objective)
        previous_end = xs[-1]
    ax.set_xlabel("L-BFGS iteration" if x == "iteration" else "seconds since the start of fit")
    ax.set_ylabel("objective")
    if len(stages) > 1:
        ax.legend(fontsize=8)
    return ax
