"""The command line: one module per verb, the only package that imports click (main.py gathers them)."""
