"""tests/serving's end-to-end tests serve the g0-old run that tests/pipeline's tests share: its
fixtures, imported here (tests/pipeline/conftest.py makes it one run for both directories)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))  # the fixtures' helpers (g0_run.py)

from pipeline.conftest import copy_g0_run, g0_run  # noqa: E402,F401
