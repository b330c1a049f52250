import os
import sys

# tests/reference.py and the example scripts (examples/*.py, tested by
# tests/test_example_*.py) are importable by name.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
