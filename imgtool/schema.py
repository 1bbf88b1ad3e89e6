"""The shapes of the documents imgtool reads, written as data: which keys a table (TOML) or object
(JSON) may hold, of which type, which are required, and what each value must satisfy.

One checker, `Table.check`, walks a shape and reports the first problem through the caller's `fail`,
which knows how to say where the problem is (`file:line` in a TOML file, the JSON path in bundle.json):
the parsers (spec, mirrors.toml, presets.toml, bundle.json) read as a table of what they allow.
Stdlib only, Python 3.7 (the offline side runs it).
"""

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import UsageError

# (key, or None for the table itself) and the problem -> raises the caller's error; never returns
Fail = Callable[[Optional[str], str], Any]
Kind = Union[type, Tuple[type, ...]]


class Invalid(Exception):
    """Raised by a key's `check` for a value it does not take: the key's `wrong` text is reported, or
    the template given here (formatted as `wrong` is)."""

    def __init__(self, template: str = "") -> None:
        super().__init__(template)
        self.template = template


@dataclass(frozen=True)
class Key:
    """One key a table may hold.

    `kind`: the types its value may have (an int is never a bool unless bool is named). `check`: the
    value -> what the parser keeps; it raises `Invalid` (the key's `wrong` text is reported) or
    UsageError (its message is). `wrong` and `missing` are templates formatted with `key`, `where`,
    `what` and `value`; empty: the table's.
    """

    name: str
    kind: Kind = object
    required: bool = False
    what: str = ""
    check: Optional[Callable[[Any], Any]] = None
    wrong: str = ""
    missing: str = ""


def is_a(value: Any, kind: Kind) -> bool:
    """isinstance, except that a bool is not an int (TOML and JSON keep them apart; Python does not)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds and object not in kinds:
        return False
    return isinstance(value, kinds)


class Table:
    """A table's allowed keys, in the order problems are looked for (and `expected` lists them)."""

    def __init__(self, *keys: Key, wrong: str = "{key} must be {what}", missing: str = "missing key {key!r}",
                 unknown: str = "unknown key {key!r} (expected {expected})") -> None:
        self.keys: Dict[str, Key] = {k.name: k for k in keys}
        self.wrong, self.missing, self.unknown = wrong, missing, unknown

    @property
    def expected(self) -> str:
        return ", ".join(self.keys)

    @property
    def required(self) -> Tuple[str, ...]:
        return tuple(k.name for k in self.keys.values() if k.required)

    def check_unknown(self, obj: Iterable[str], fail: Fail, where: str = "") -> None:
        """Report the first key of `obj` the table does not allow."""
        for key in obj:
            if key not in self.keys:
                fail(key, self.unknown.format(key=key, where=where, expected=self.expected))

    def check(self, obj: Mapping[str, Any], fail: Fail, where: str = "", unknown: bool = True) -> Dict[str, Any]:
        """The checked values of `obj` (key -> what each key's check made of it; absent keys left out).

        Problems, first found first: an unknown key (unless `unknown` is False: the caller checked),
        a required key missing, a value of the wrong type, a value its check refuses."""
        if unknown:
            self.check_unknown(obj, fail, where)
        for key in self.required:
            if key not in obj:
                spec = self.keys[key]
                fail(None, (spec.missing or self.missing).format(key=key, where=where))
        out: Dict[str, Any] = {}
        for key, spec in self.keys.items():
            if key in obj:
                out[key] = self.value(spec, obj[key], fail, where)
        return out

    def value(self, spec: Key, value: Any, fail: Fail, where: str = "") -> Any:
        """One key's value checked: its type, then its check."""

        def wrong(template: str = "") -> Any:
            template = template or spec.wrong or self.wrong
            return fail(spec.name, template.format(key=spec.name, where=where, what=spec.what, value=value))

        if not is_a(value, spec.kind):
            return wrong()
        if spec.check is None:
            return value
        try:
            return spec.check(value)
        except Invalid as e:
            return wrong(e.template)
        except UsageError as e:
            return fail(spec.name, e.message)


def strings(values: Sequence[Any]) -> List[str]:
    """An array of strings, else Invalid."""
    if not all(isinstance(v, str) for v in values):
        raise Invalid()
    return list(values)


def one_of(choices: Sequence[str], problem: str) -> Callable[[Any], str]:
    """A check taking one of `choices`; else UsageError(problem formatted with the value as `value`)."""

    def checked(value: Any) -> str:
        if value not in choices:
            raise UsageError(problem.format(value=value, choices=", ".join(choices)))
        return str(value)

    return checked
