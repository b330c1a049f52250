"""Draw the pictures of the user guide: ``python docs/make_figures.py [OUT]``.

They come from :mod:`sklearn_margcrf.plot`, on a small fit to the built-in
binary denoising problem (a few seconds once numba has compiled the
kernels), and are saved to ``OUT`` (default: ``docs/images``).
tests/test_plot.py runs :func:`make_figures`.
"""

import sys
import warnings
from pathlib import Path


def make_figures(out):
    """Save ``marginals.png`` and ``loss_curve.png`` to the folder ``out``; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from sklearn.exceptions import ConvergenceWarning

    from sklearn_margcrf import MarginalCRF
    from sklearn_margcrf.datasets import make_denoising_problem
    from sklearn_margcrf.features import DenoisingFeatures
    from sklearn_margcrf.plot import plot_loss_curve, plot_marginals

    images, labels = make_denoising_problem(10, shape=(48, 48), noise=1.25, random_state=0)
    X = DenoisingFeatures().transform(images)
    records = []  # every L-BFGS iteration of the fit, the initialising fit included
    crf = MarginalCRF(n_iter=20, max_iter=40, callback=records.append)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        crf.fit(X[:8], labels[:8])
    proba = crf.predict_proba(X[8:])

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figure = Figure(figsize=(9.0, 2.5), layout="constrained")
    plot_marginals(images[8], proba[0], truth=labels[8], class_names=["background", "shape"], ax=figure.subplots(1, 4))
    figure.savefig(out / "marginals.png", dpi=72)

    figure = Figure(figsize=(5.0, 3.2), layout="constrained")
    plot_loss_curve(records, ax=figure.subplots())
    figure.savefig(out / "loss_curve.png", dpi=72)
    return [out / "marginals.png", out / "loss_curve.png"]


if __name__ == "__main__":
    for path in make_figures(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "images"):
        print(f"saved {path}")
