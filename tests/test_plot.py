"""sklearn_margcrf.plot draws what it claims, on the Agg backend."""

import subprocess
import sys
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning, NotFittedError

matplotlib = pytest.importorskip("matplotlib", reason="the plots need matplotlib (the plot extra)")
matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from sklearn_margcrf.plot import plot_loss_curve, plot_marginals  # noqa: E402


def _axes(n):
    return list(Figure().subplots(1, n, squeeze=False)[0])


def _marginals(shape=(4, 5), n_states=3, seed=0):
    p = np.random.default_rng(seed).uniform(0.05, 1.0, size=shape + (n_states,))
    return p / p.sum(axis=-1, keepdims=True)


def _shown(axis):
    return np.asarray(axis.images[0].get_array())


def test_one_panel_per_class_with_the_image_and_the_truth():
    proba = _marginals()
    image = np.linspace(0, 1, 20).reshape(4, 5)
    truth = np.array([[0, 1, 2, -1, 0]] * 4)
    axes = plot_marginals(image, proba, truth=truth, class_names=["sky", "tree", "road"], ax=_axes(5), legend=False)
    assert [a.get_title() for a in axes] == ["image", "truth", "P(sky)", "P(tree)", "P(road)"]
    np.testing.assert_array_equal(_shown(axes[0]), image)
    for k in range(3):
        np.testing.assert_array_equal(_shown(axes[2 + k]), proba[..., k])
        assert axes[2 + k].images[0].get_clim() == (0.0, 1.0)
    # the truth in the default tab10 colours, unlabelled pixels black
    colours = np.array([matplotlib.colors.to_rgb(f"C{k}") for k in range(3)])
    expected = np.where((truth >= 0)[..., None], colours[np.maximum(truth, 0)], 0.0)
    np.testing.assert_allclose(_shown(axes[1]), expected)


def test_selected_states_and_binary_defaults():
    proba = _marginals(n_states=2)
    [axis] = plot_marginals(None, proba, states=[1], ax=_axes(1), titles=False)
    np.testing.assert_array_equal(_shown(axis), proba[..., 1])
    assert axis.get_title() == "" and list(axis.get_xticks()) == []
    # two classes: black and white, so the map is P(class 1) in grey
    [axis] = plot_marginals(None, proba, kind="map", ax=_axes(1), legend=False)
    np.testing.assert_allclose(_shown(axis), np.repeat(proba[..., 1:], 3, axis=-1))


def test_map_mixes_the_class_colours_and_has_a_legend():
    proba = _marginals()
    colours = ["red", "lime", "blue"]
    truth = np.zeros((4, 5), int)
    truth[0, 0] = -1
    axes = plot_marginals(None, proba, truth=truth, kind="map", colors=colours, class_names=["a", "b", "c"], ax=_axes(2))
    np.testing.assert_allclose(_shown(axes[1]), proba @ np.eye(3))
    entries = [t.get_text() for t in axes[1].get_legend().get_texts()]
    assert entries == ["a", "b", "c", "unlabelled"]
    # the legend on an axes of its own (an empty slot of a grid)
    fig_axes = _axes(2)
    plot_marginals(None, proba, kind="map", ax=fig_axes[0], legend=fig_axes[1])
    assert [t.get_text() for t in fig_axes[1].get_legend().get_texts()] == ["0", "1", "2"]
    assert fig_axes[0].get_legend() is None and not fig_axes[1].axison


def test_new_figure_without_ax():
    axes = plot_marginals(np.zeros((4, 5, 3)), _marginals(), kind="map")
    assert len(axes) == 2 and axes[0].figure is axes[1].figure
    import matplotlib.pyplot as plt

    plt.close(axes[0].figure)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((None, np.full((4, 5), 0.5)), {}, r"\(H, W, K\)"),
        ((np.zeros((3, 5)), _marginals()), {}, "image has shape"),
        ((None, _marginals()), {"truth": np.zeros((4, 4), int)}, "truth must have shape"),
        ((None, _marginals()), {"truth": np.full((4, 5), 3)}, "outside"),
        ((None, _marginals()), {"states": [3]}, "states"),
        ((None, _marginals()), {"ax": "two", "states": [0, 1]}, "2 panels"),
        ((None, _marginals()), {"class_names": ["a", "b"]}, "class_names has 2"),
        ((None, _marginals()), {"kind": "pie"}, "kind"),
        ((None, None), {}, "nothing to draw"),
    ],
)
def test_bad_inputs(args, kwargs, match):
    if kwargs.get("ax") == "two":
        kwargs["ax"] = _axes(3)
    with pytest.raises(ValueError, match=match):
        plot_marginals(*args, **kwargs)


@pytest.fixture(scope="module")
def fitted():
    from estimator_checks import make_structured_data
    from sklearn_margcrf import MarginalCRF

    X, y = make_structured_data(n_samples=3)
    records = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        crf = MarginalCRF(n_iter=3, max_iter=4, callback=records.append).fit(X, y)
    return crf, records


def test_loss_curve_of_a_fitted_estimator(fitted):
    crf, _ = fitted
    ax = plot_loss_curve(crf, ax=_axes(1)[0])
    [line] = ax.get_lines()
    np.testing.assert_array_equal(line.get_ydata(), crf.loss_curve_)
    np.testing.assert_array_equal(line.get_xdata(), np.arange(1, len(crf.loss_curve_) + 1))
    ax = plot_loss_curve(crf, x="time", ax=_axes(1)[0], color="red")
    [line] = ax.get_lines()
    np.testing.assert_array_equal(line.get_xdata(), crf.time_curve_)
    assert line.get_color() == "red" and ax.get_xlabel().startswith("seconds")


def test_loss_curve_marks_the_stages_of_the_callback_history(fitted):
    crf, records = fitted
    ax = plot_loss_curve(records, ax=_axes(1)[0])
    curves = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert [line.get_label() for line in curves] == ["independent", "fit"]  # init="independent", then the fit
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["independent", "fit"]
    np.testing.assert_array_equal(curves[-1].get_ydata(), crf.loss_curve_)
    np.testing.assert_array_equal(np.concatenate([c.get_ydata() for c in curves]), [r.objective for r in records])
    np.testing.assert_array_equal(np.concatenate([c.get_xdata() for c in curves]), np.arange(1, len(records) + 1))
    separators = [line for line in ax.get_lines() if line.get_label().startswith("_")]
    assert len(separators) == 1 and separators[0].get_xdata()[0] == len(curves[0].get_ydata())


def test_loss_curve_errors(fitted):
    from sklearn.pipeline import make_pipeline

    from sklearn_margcrf import MarginalCRF

    with pytest.raises(NotFittedError):
        plot_loss_curve(MarginalCRF(), ax=_axes(1)[0])
    with pytest.raises(NotFittedError):
        plot_loss_curve(make_pipeline(MarginalCRF()), ax=_axes(1)[0])
    with pytest.raises(ValueError, match="x must be"):
        plot_loss_curve(fitted[0], x="epochs")
    with pytest.raises(TypeError, match="progress records"):
        plot_loss_curve([1.0, 2.0], ax=_axes(1)[0])


def test_a_clear_error_without_matplotlib():
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "import numpy as np\n"
        "from sklearn_margcrf.plot import plot_marginals\n"  # the import itself works
        "try:\n"
        "    plot_marginals(None, np.full((2, 2, 2), 0.5))\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "'plot' extra" in out.stdout and "sklearn-margcrf[plot]" in out.stdout, out.stderr


def test_the_user_guide_pictures_are_drawn_by_this_module(tmp_path):
    """docs/make_figures.py makes the user guide's pictures with plot_marginals
    and plot_loss_curve; the committed pictures are its output."""
    import runpy
    from pathlib import Path

    pytest.importorskip("skimage", reason="the denoising features use scikit-image")
    docs = Path(__file__).resolve().parents[1] / "docs"
    make_figures = runpy.run_path(str(docs / "make_figures.py"))["make_figures"]
    for path in make_figures(tmp_path):
        assert path.stat().st_size > 0
        assert (docs / "images" / path.name).is_file()
        assert f"images/{path.name}" in (docs / "user_guide.rst").read_text()
