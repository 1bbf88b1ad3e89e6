"""`python -m imgtool` (and `python3 imgtool.pyz`) run the CLI."""

from .cli import main

main()
