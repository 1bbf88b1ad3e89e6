"""Strings from outside are data: the one check of printable text, the one escape for the terminal and the
one quoting for sh.

A registry, a mirror, bundle.json, an inventory or a spec says things imgtool repeats: in load.sh (which
runs as root on the offline host), in README.txt, and on the terminal. Each value is checked against its
grammar where it enters (model.py: names, tags, digests, platforms; `is_printable` for the rest), and is
still passed on only through these functions: `sh_quote` into a generated script, `for_terminal` to a
terminal. stdlib only, Python 3.7 (imgtool.pyz).
"""

import unicodedata

# Unicode categories that move the cursor, end a line or change how the terminal reads what follows:
# control characters (C0, DEL, C1: ESC starts colour, title and clear-screen sequences), format characters
# (the bidirectional overrides that reorder a line), line and paragraph separators, lone surrogates.
_UNSAFE_CATEGORIES = ("Cc", "Cf", "Zl", "Zp", "Cs")


def _unsafe(ch: str) -> bool:
    return unicodedata.category(ch) in _UNSAFE_CATEGORIES


def is_printable(text: object, limit: int = 4096) -> bool:
    """Whether `text` is a string of at most `limit` characters without a control, format or line-separator
    character (so: one line of text, however it is shown)."""
    return isinstance(text, str) and len(text) <= limit and not any(_unsafe(ch) for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch, "\\x%02x" % code)
    return "\\u%04x" % code if code < 0x10000 else "\\U%08x" % code


def for_terminal(text: object) -> str:
    """`text` as one line that a terminal shows as written: every control, format or line-separator character
    written as its escape (`\\x1b`, `\\n`, `\\u202e`), so no value from outside can colour, retitle or clear the
    screen, or forge a line of imgtool's output."""
    value = str(text)
    if not any(_unsafe(ch) for ch in value):
        return value
    return "".join(_escape(ch) if _unsafe(ch) else ch for ch in value)


def sh_quote(value: object) -> str:
    """`value` as one word of a POSIX sh script: always single-quoted, each `'` written as `'\\''`. Inside single
    quotes sh expands nothing ($, `, \\, newlines and all are data), so this is the only way a value reaches a
    script imgtool writes."""
    return "'" + str(value).replace("'", "'\\''") + "'"
