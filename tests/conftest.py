"""Shared test settings: a non-interactive matplotlib backend for every test (and its subprocesses)."""

import os

# Must be set before anything imports matplotlib.pyplot; subprocesses inherit it.
os.environ["MPLBACKEND"] = "Agg"
