"""sklearn_margcrf: CRFs learned with marginal-based losses under approximate inference."""

__version__ = "0.1.0"
