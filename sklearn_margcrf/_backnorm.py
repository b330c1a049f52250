"""The paper's ``backnorm`` operator (Sec. "Truncated Fitting", Appendix C).

If ``c = b / sum(b)`` is a normalised product and ``g = dL/dc``, then
``nu = backnorm(g, c) = c * (g - g . c)`` gives ``dL/da = nu / a`` for every
factor ``a`` of ``b`` (and ``dL/df = nu`` when ``a = exp(f)``). Back TRW and
back mean field both call this one function.
"""

from numba import njit


@njit(cache=True, inline="always")
def backnorm(g, c, out):
    """Write ``c * (g - g . c)`` into ``out`` (1-D arrays of equal length)."""
    dot = 0.0
    for k in range(c.shape[0]):
        dot += g[k] * c[k]
    for k in range(c.shape[0]):
        out[k] = c[k] * (g[k] - dot)
