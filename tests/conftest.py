import os
import sys

# tests/reference.py and the example scripts (examples/*.py, tested by
# tests/test_example_*.py) are importable by name.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

# Property tests (tests/test_properties*.py): "ci" (the default) is bounded
# and derandomised, so the suite is reproducible and stays within a minute or
# two; "long" explores far more examples with fresh randomness:
#     HYPOTHESIS_PROFILE=long python -m pytest tests/test_properties*.py
# (no deadline: numba compiles a kernel on its first call)
# (the test extra installs hypothesis; without it the other tests still run)
try:
    from hypothesis import HealthCheck, settings
except ImportError:
    collect_ignore_glob = ["test_properties*.py"]
else:
    _COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
    settings.register_profile("ci", max_examples=100, derandomize=True, database=None, **_COMMON)
    settings.register_profile("long", max_examples=1000, **_COMMON)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
