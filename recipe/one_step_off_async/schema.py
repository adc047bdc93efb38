"""A recipe section as a dataclass that declares each field's help and range once, and what a launch check returns.

What: a field's help and range live in its metadata (``field(default=1, metadata={"help": ..., "check":
Check(at_least=0)})``; the type is the field's annotation). A section validates itself in ``__post_init__``
(``check_fields``), as verl's ``BaseConfig`` sections do; ``parse_section`` builds one from a config's mapping;
``value_problems`` and ``unknown_keys`` check a section the recipe only extends (verl's ``policy_loss``).

Why: each range is written once, next to the field it bounds; the launch, the trainer and a direct
construction all refuse a value by the same words, naming the key and the fix.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from recipe.one_step_off_async.errors import ConfigError, LaunchProblems, NotOnThisMachine


@dataclass(frozen=True)
class Check:
    """What a field accepts besides its annotated type: a range or choices, and the words its message adds."""

    at_least: int | float | None = None
    above: int | float | None = None
    choices: tuple[str, ...] = ()
    null: str | None = None  # what null means, for a field annotated ``X | None``
    unit: str | None = None  # what a number counts ("seconds")
    note: str | None = None  # what the values mean, said after the requirement

    def accepts(self, kind: type, value: object) -> bool:
        if kind is bool:
            return isinstance(value, bool)
        if isinstance(value, bool):  # a bool is an int to Python, never to a config
            return False
        if self.choices:
            return value in self.choices
        if kind is str:
            return isinstance(value, str)
        if not isinstance(value, int if kind is int else (int, float)):
            return False
        return (self.at_least is None or value >= self.at_least) and (self.above is None or value > self.above)

    def requirement(self, kind: type, nullable: bool) -> str:
        """What the value must be, as the message says it: ``an integer >= 0``, ``true or false``..."""
        if kind is bool:
            text = "true or false"
        elif self.choices:
            text = f"one of {', '.join(self.choices)}"
        else:
            noun = "integer" if kind is int else "number"
            if self.above == 0:
                text = f"a positive {noun}"
            else:
                text = f"an {noun}" if kind is int else f"a {noun}"
                text += f" >= {self.at_least}" if self.at_least is not None else ""
                text += f" > {self.above}" if self.above is not None else ""
            text += f" of {self.unit}" if self.unit else ""
        if nullable:
            text += ", or null" + (f" ({self.null})" if self.null else "")
        return text + (f" ({self.note})" if self.note else "")


@functools.cache
def _annotations(cls: type) -> dict[str, tuple[type, bool]]:
    """Each field's type and whether it may be None, from the annotations (``int | None`` -> ``(int, True)``)."""
    kinds = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = typing.get_args(hint)
        if type(None) in args:
            kinds[name] = (next(arg for arg in args if arg is not type(None)), True)
        else:
            kinds[name] = (hint, False)
    return kinds


def value_problems(cls: type, values: Mapping[str, Any], prefix: str, names: Iterable[str] | None = None) -> list[str]:
    """Every value of ``values`` (fields of ``cls``; ``names``: only these) outside its field's type and ``check``,
    named as the key ``prefix + field`` of the config."""
    problems = []
    for field in dataclasses.fields(cls):
        if field.name not in values or (names is not None and field.name not in names):
            continue
        value, (kind, nullable) = values[field.name], _annotations(cls)[field.name]
        if dataclasses.is_dataclass(kind):  # a nested section checks its own values
            if not isinstance(value, kind):
                keys = ", ".join(nested.name for nested in dataclasses.fields(kind)[:2])
                problems.append(f"{prefix}{field.name}={value!r} must be a section ({keys}, ...).")
            continue
        check = field.metadata.get("check", Check())
        if not (value is None and nullable) and not check.accepts(kind, value):
            problems.append(f"{prefix}{field.name}={value!r} must be {check.requirement(kind, nullable)}.")
    return problems


def unknown_keys(
    cls: type, values: Mapping[str, Any], prefix: str, also_known: Iterable[str] = (), known: str | None = None
) -> list[str]:
    """The keys of ``values`` that are neither fields of ``cls`` nor ``also_known`` (a misspelt key is the first thing
    to fix); ``known`` replaces the list of known keys in the message."""
    fields = [field.name for field in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(fields) - set(also_known))
    if not unknown:
        return []
    known = known or "known keys: " + ", ".join(fields) + "."
    return [f"Unknown key(s) {', '.join(prefix + key for key in unknown)}; {known}"]


def check_fields(section: object, prefix: str) -> None:
    """A section's ``__post_init__``: one ``ConfigError`` naming every field whose value its field refuses."""
    values = {field.name: getattr(section, field.name) for field in dataclasses.fields(section)}
    Problems(value_problems(type(section), values, prefix)).raise_any()


def parse_section(cls: type, values: Mapping[str, Any], prefix: str):
    """``cls`` built from the config section ``values`` (nested sections too), or one ``ConfigError`` naming every
    unknown key and every value a section refuses."""
    problems: list[str] = []
    section = _build(cls, values, prefix, problems)
    Problems(problems).raise_any()
    return section


def _build(cls: type, values: Mapping[str, Any], prefix: str, problems: list[str]):
    """``cls`` from the fields ``values`` sets; its unknown keys, then its nested sections' problems (a null section
    keeps its defaults), then what its ``__post_init__`` refuses go to ``problems`` (its defaults then stand in, so
    the enclosing section is checked too)."""
    problems += unknown_keys(cls, values, prefix)
    arguments = {field.name: values[field.name] for field in dataclasses.fields(cls) if field.name in values}
    for name, value in arguments.items():
        kind = _annotations(cls)[name][0]
        if dataclasses.is_dataclass(kind) and isinstance(value, Mapping | None):
            arguments[name] = _build(kind, value or {}, f"{prefix}{name}.", problems)
    try:
        return cls(**arguments)
    except ConfigError as error:
        problems += error.problems
        return cls()


@dataclass
class Problems:
    """What a launch check found: the config's ``problems`` (each names the key and the fix), what this machine lacks
    (``not_here``: the machine that runs the launch may have it), and the checks ``skipped`` because they need a value
    a problem refused. Each check returns one; the launch adds them up (``found += check(config)``)."""

    problems: list[str] = dataclasses.field(default_factory=list)
    not_here: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, error: ConfigError) -> Problems:
        """What a check that raises found (``NotOnThisMachine``: missing here)."""
        found = list(error.problems)
        if isinstance(error, NotOnThisMachine):
            return cls(not_here=found, skipped=list(error.skipped))
        return cls(found, skipped=list(error.skipped))

    def __add__(self, other: Problems) -> Problems:
        return Problems(self.problems + other.problems, self.not_here + other.not_here, self.skipped + other.skipped)

    def raise_any(self) -> None:
        """Raise what was found as one ``ConfigError`` (every problem, then what is missing here)."""
        if self.problems or self.not_here:
            raise ConfigError(*self.problems, *self.not_here, skipped=tuple(self.skipped))

    def error(self, *earlier: str) -> LaunchProblems | None:
        """The launch's error (``earlier`` problems first), or None when nothing is wrong."""
        problems = [*earlier, *self.problems, *self.not_here]
        return LaunchProblems(problems, self.skipped) if problems else None
