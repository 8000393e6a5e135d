"""One declared setting: its name, kind, default, bounds and help, and how a value is parsed and checked.

The tables of declarations live apart: method options in options.py, sampling and run settings in
settings.py. Every front end (CLI flags, the library, the bench, the server's schema) reads them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quickdraft.errors import QuickdraftError


def parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


@dataclass(frozen=True)
class Option:
    """One setting. default None means another rule decides (the method's or the device's default).
    methods: the methods that read it (empty: every speculative method); model: it chooses how the
    target runs (backend, precision, device) rather than how drafting runs."""

    name: str
    help: str
    kind: type = int  # int, float, str or bool
    default: Any = None
    low: float | None = None
    high: float | None = None
    open_ends: tuple[bool, bool] | None = None  # whether low and high themselves are refused; None: a float's are
    choices: tuple[str, ...] | None = None
    methods: tuple[str, ...] = ()
    model: bool = False
    parser: Callable[[str], Any] | None = None  # text -> value, where the kind's own parse is not enough
    validate: Callable[[Any], Any] | None = None  # value -> allowed value, where kind and bounds are not enough
    sweeps: bool = True  # a bench spec's 'a/b/c' sweeps it (False for paths, whose '/' is their own)
    repeat: bool = False  # a list of values (a repeatable flag, e.g. stop strings)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, text: str) -> Any:
        """A value from text (a CLI flag, a spec), then checked."""
        if self.parser is not None:
            return self.check(self.parser(text))
        try:
            value = parse_bool(text) if self.kind is bool else self.kind(text)
        except ValueError:
            raise QuickdraftError(f"{self.name} must be {self._kind_name()}, got {text!r}", self.name) from None
        return self.check(value)

    def check(self, value: Any) -> Any:
        """The value if it is allowed (each item, for a repeatable one), else a QuickdraftError naming the
        option and its bounds."""
        if self.repeat and isinstance(value, (list, tuple)):
            return [self._check_one(item) for item in value]
        return self._check_one(value)

    def _check_one(self, value: Any) -> Any:
        if value is None:
            return None
        if self.validate is not None:
            return self.validate(value)
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if self.kind is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, self.kind) or (self.kind is int and isinstance(value, bool)):
            raise QuickdraftError(f"{self.name} must be {self._kind_name()}, got {value!r}", self.name)
        if self.choices is not None and value not in self.choices:
            raise QuickdraftError(f"unknown {self.name} {value!r}; choose one of: {', '.join(self.choices)}", self.name)
        if self.kind is float and not math.isfinite(value):
            raise QuickdraftError(f"{self.name} must be a finite number, got {value}", self.name)
        low_open, high_open = self._open()
        too_low = self.low is not None and not (value > self.low if low_open else value >= self.low)
        too_high = self.high is not None and not (value < self.high if high_open else value <= self.high)
        if too_low or too_high:
            raise QuickdraftError(f"{self.name} must be {self._range()}, got {value}", self.name)
        return value

    def limits(self) -> dict[str, float]:
        """The bounds as gt/ge/lt/le (the names pydantic's Field and annotated-types use)."""
        low_open, high_open = self._open()
        limits = {}
        if self.low is not None:
            limits["gt" if low_open else "ge"] = self.low
        if self.high is not None:
            limits["lt" if high_open else "le"] = self.high
        return limits

    def _open(self) -> tuple[bool, bool]:
        # A float bound is probability-like unless declared otherwise: its ends themselves are not allowed.
        if self.open_ends is not None:
            return self.open_ends
        return (True, True) if self.kind is float else (False, False)

    def _kind_name(self) -> str:
        return {int: "an integer", float: "a number", str: "text", bool: "true or false"}[self.kind]

    def _range(self) -> str:
        low_open, high_open = self._open()
        low, high = (f"{b:g}" if self.kind is float and b is not None else str(b) for b in (self.low, self.high))
        if self.low is not None and self.high is not None:
            if self.kind is float:
                return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
            return f"in {low}..{high}"
        if self.high is None:
            return f"{'>' if low_open else '>='} {low}"
        return f"{'<' if high_open else '<='} {high}"
