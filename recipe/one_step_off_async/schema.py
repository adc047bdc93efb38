"""Launch rules as data: what a config field accepts (``Check``) and what one key requires of another (``Rule``).

What: a recipe section is a dataclass whose fields declare their help and their range once, in the field's
metadata (``field(default=1, metadata={"help": ..., "check": Check(at_least=0)})``; the type is the field's
annotation). ``field_problems`` walks the fields of a section (nested sections too) and lists every value
outside them; ``parse_section`` builds the dataclass from a config section or raises them all at once. A
``Rule`` is one row of a table of cross-key rules ("when K1 = v, K2 must be w"): the keys it reads, by name,
and its message, which names the key and the fix; ``check_rules`` walks a table.

Why: written as code, each check was repeated (a ``__post_init__``, the launch check) and stopped at the first
problem; as data, each is written once, a launch reports every problem, and the tests read which keys the
rules cover (tests/test_support_matrix_on_cpu.py). ``async_config`` (``async_training`` and the launch's
rules) and ``losses`` (the policy-loss keys) declare theirs with it.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from recipe.one_step_off_async.errors import Problems


@dataclass(frozen=True)
class Check:
    """What a field accepts besides its annotated type: a range or choices, and the words its message adds."""

    at_least: int | float | None = None
    above: int | float | None = None
    choices: tuple[str, ...] = ()
    # What null means, for a field annotated ``X | None``.
    null: str | None = None
    # What a number counts ("seconds").
    unit: str | None = None
    # What the values mean, said after the requirement.
    note: str | None = None

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


def field_problems(
    cls: type,
    values: Mapping[str, Any],
    prefix: str,
    *,
    names: Iterable[str] | None = None,
    also_known: Iterable[str] = (),
    known: str | None = None,
) -> list[str]:
    """Every problem of ``values`` as the config section ``prefix`` (``"async_training."``) of dataclass ``cls``.

    The unknown keys come first, of the nested sections too (a misspelt key is the first thing to fix): keys
    that are neither fields nor ``also_known``; ``known`` replaces the list of known keys in that message. Then
    every value outside its field's type and ``check``, in field order (``names``: only these fields).
    """
    unknown = _unknown_keys(cls, values, prefix, set(also_known), known, names)
    return [*unknown, *_bad_values(cls, values, prefix, names)]


def _unknown_keys(
    cls: type, values: Mapping, prefix: str, also_known: set[str], known: str | None, names: Iterable[str] | None
) -> Iterator[str]:
    fields = [field.name for field in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(fields) - also_known)
    if unknown:
        known = known or f"known keys: {', '.join(fields)}."
        yield f"Unknown key(s) {', '.join(prefix + key for key in unknown)}; {known}"
    checked = set(names) if names is not None else None
    for name, value in values.items():
        if checked is not None and name not in checked:  # a section of verl's that the recipe does not check
            continue
        kind = _annotations(cls).get(name, (None, False))[0]
        if dataclasses.is_dataclass(kind) and isinstance(value, Mapping):
            yield from _unknown_keys(kind, value, f"{prefix}{name}.", set(), None, None)


def _bad_values(cls: type, values: Mapping, prefix: str, names: Iterable[str] | None) -> Iterator[str]:
    checked = set(names) if names is not None else None
    for field in dataclasses.fields(cls):
        if field.name not in values or (checked is not None and field.name not in checked):
            continue
        value, (kind, nullable) = values[field.name], _annotations(cls)[field.name]
        if dataclasses.is_dataclass(kind):  # a nested section; an empty value (null) keeps its defaults
            if isinstance(value, Mapping):
                yield from _bad_values(kind, value, f"{prefix}{field.name}.", None)
            elif value and not isinstance(value, kind):
                keys = ", ".join(nested.name for nested in dataclasses.fields(kind)[:2])
                yield f"{prefix}{field.name}={value!r} must be a section ({keys}, ...)."
            continue
        check = field.metadata.get("check", Check())
        if not (value is None and nullable) and not check.accepts(kind, value):
            yield f"{prefix}{field.name}={value!r} must be {check.requirement(kind, nullable)}."


def check_fields(section: object, prefix: str) -> None:
    """Raise one ``ConfigError`` naming every field of the dataclass instance ``section`` that its field refuses."""
    values = {field.name: getattr(section, field.name) for field in dataclasses.fields(section)}
    problems = Problems()
    for problem in field_problems(type(section), values, prefix):
        problems.add(problem)
    problems.raise_any()


def parse_section(cls: type, values: Mapping[str, Any], prefix: str):
    """``cls`` built from the config section ``values`` (nested sections too), or one ``ConfigError`` naming every
    problem (``field_problems``)."""
    problems = Problems()
    for problem in field_problems(cls, values, prefix):
        problems.add(problem)
    problems.raise_any()
    return _build(cls, values)


def _build(cls: type, values: Mapping[str, Any]):
    arguments = dict(values)
    for name, (kind, _) in _annotations(cls).items():
        if dataclasses.is_dataclass(kind) and name in arguments and not isinstance(arguments[name], kind):
            arguments[name] = _build(kind, arguments[name] or {})
    return cls(**arguments)


_ABSENT = object()


class Values:
    """A rule's view of the config: its keys by their short names, and nothing else.

    ``values.name`` reads the key (None when the config lacks it); ``values.get(name, default)`` reads it as a
    dict's ``get`` does. Reading a name the rule does not declare raises, so a rule's keys are what it reads.
    """

    def __init__(self, config: DictConfig, keys: Mapping[str, str]) -> None:
        self._config, self._keys = config, keys

    def get(self, name: str, default: Any = None) -> Any:
        if name not in self._keys:
            raise AttributeError(f"the rule reads {name!r}, which is not among its keys ({', '.join(self._keys)})")
        value = OmegaConf.select(self._config, self._keys[name], default=_ABSENT)
        return default if value is _ABSENT else value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.get(name)


def _always(values: Values) -> bool:
    return True


@dataclass(frozen=True)
class Rule:
    """One row of a table of cross-key rules: where ``when`` holds, ``require`` must, else ``message`` is a problem.

    ``keys`` maps a short name to each config key the rule reads; the first is the key its message starts with,
    the one it refuses (a later check that needs it is skipped). ``when``, ``require`` and ``message`` (a string,
    or a function for a message that shows values) read the keys from a ``Values`` view. Every message names
    the key and says the fix.
    """

    keys: Mapping[str, str]
    require: Callable[[Values], bool]
    message: str | Callable[[Values], str]
    when: Callable[[Values], bool] = _always

    @property
    def refuses(self) -> str:
        return next(iter(self.keys.values()))


def check_rules(rules: Iterable[Rule], config: DictConfig, problems: Problems, skip: Iterable[str] = ()) -> None:
    """Walk ``rules`` in order and add the message of each that ``config`` breaks to ``problems``.

    A rule that reads a key under a section of ``skip`` (one an earlier check refused) is not run.
    """
    skip = tuple(skip)
    for rule in rules:
        if any(key == section or key.startswith(f"{section}.") for key in rule.keys.values() for section in skip):
            continue
        values = Values(config, rule.keys)
        if rule.when(values) and not rule.require(values):
            problems.add(rule.message if isinstance(rule.message, str) else rule.message(values), key=rule.refuses)
