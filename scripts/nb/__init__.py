"""The modules of scripts/nbtools.py, one per job (see its docstring)."""
