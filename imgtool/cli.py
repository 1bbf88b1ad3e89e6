"""The console entry point (`imgtool`, `python -m imgtool`, imgtool.pyz): the verbs live in imgtool/commands/."""

from .commands.main import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":  # pragma: no cover
    main()
