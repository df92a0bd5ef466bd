"""Make the HA test helpers importable (tests run with --import-mode=importlib)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
