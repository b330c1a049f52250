"""sklearn_margcrf: conditional random fields learned with marginal-based losses
under approximate inference (Domke, TPAMI 2013), scikit-learn compatible.

Functional core: :func:`~sklearn_margcrf.infer` (TRW, loopy BP, mean field, exact) and
:func:`loss_and_grad` (every loss of the paper, differentiated four ways).
Estimator: :class:`MarginalCRF`.
"""

from ._graph import grid_edges
from .edge_appearance import edge_appearance_probabilities
from .gradients import loss_and_grad
from .inference import InferenceResult, infer
from .sample import CRFSample

__version__ = "0.1.0"

__all__ = [
    "CRFSample",
    "InferenceResult",
    "MarginalCRF",
    "edge_appearance_probabilities",
    "grid_edges",
    "infer",
    "loss_and_grad",
]


def __getattr__(name):
    # The estimator imports scikit-learn machinery; load it on first use.
    if name == "MarginalCRF":
        from .estimator import MarginalCRF

        return MarginalCRF
    raise AttributeError(f"module 'sklearn_margcrf' has no attribute {name!r}")
