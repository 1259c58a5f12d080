"""The pieces of tests/deploy/lws_schema.py: Kubernetes' name patterns, resource quantities, and
schema nodes that list what is wrong with a value, each error naming its path."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

INT32_MAX = 2**31 - 1
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
IANA_SVC_NAME = re.compile(r"^(?=.{1,15}$)(?=.*[a-z])[a-z0-9]+(-[a-z0-9]+)*$")
# The Downward API fields an env var may select (the CRD's fieldRef description).
FIELD_PATH = re.compile(
    r"^(metadata\.(name|namespace)|metadata\.(labels|annotations)\['[^']+'\]"
    r"|spec\.(nodeName|serviceAccountName)|status\.(hostIP|podIP|podIPs))$"
)
QUANTITY = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: dict[str, Fraction] = {
    suffix: Fraction(10) ** power
    for suffix, power in zip("numkMGTPE", (-9, -6, -3, 3, 6, 9, 12, 15, 18), strict=True)
}
_DECIMAL[""] = Fraction(1)


def quantity(value: object) -> Fraction:
    """A resource quantity's value ("1600Gi" -> 1600 * 2**30, "96" -> 96, "500m" -> 1/2).

    Raises:
        ValueError: not a Kubernetes quantity.
    """
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not QUANTITY.match(text):
        raise ValueError(f"{value!r} is not a quantity")
    number = re.match(r"^[+-]?(\d+\.?\d*|\.\d+)", text)
    assert number is not None
    base, suffix = Fraction(number.group(0)), text[number.end() :]
    if suffix in _BINARY:
        return base * _BINARY[suffix]
    if suffix[:1] in ("e", "E"):
        return base * Fraction(10) ** int(suffix[1:])
    return base * _DECIMAL[suffix]


class Node:
    """A schema node: `errors(value, path)` lists what is wrong, each naming its path."""

    def errors(self, value: Any, path: str) -> list[str]:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Anything(Node):
    def errors(self, value: Any, path: str) -> list[str]:
        return []


@dataclasses.dataclass(frozen=True)
class Str(Node):
    enum: tuple[str, ...] = ()
    pattern: re.Pattern[str] | None = None

    def errors(self, value: Any, path: str) -> list[str]:
        if not isinstance(value, str):
            return [f"{path}: expected a string, got {type(value).__name__} {value!r}"]
        if self.enum and value not in self.enum:
            return [f"{path}: {value!r} is not one of {', '.join(self.enum)}"]
        if self.pattern is not None and not self.pattern.match(value):
            return [f"{path}: {value!r} does not match {self.pattern.pattern}"]
        return []


@dataclasses.dataclass(frozen=True)
class Int(Node):
    minimum: int | None = None
    maximum: int | None = INT32_MAX

    def errors(self, value: Any, path: str) -> list[str]:
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{path}: expected an integer, got {type(value).__name__} {value!r}"]
        if self.minimum is not None and value < self.minimum:
            return [f"{path}: {value} is below the minimum {self.minimum}"]
        if self.maximum is not None and value > self.maximum:
            return [f"{path}: {value} is above the maximum {self.maximum}"]
        return []


@dataclasses.dataclass(frozen=True)
class Bool(Node):
    def errors(self, value: Any, path: str) -> list[str]:
        if isinstance(value, bool):
            return []
        return [f"{path}: expected true or false, got {type(value).__name__} {value!r}"]


@dataclasses.dataclass(frozen=True)
class Port(Node):
    """IntOrString as a port: a number 1..65535 or a port name (IANA_SVC_NAME)."""

    def errors(self, value: Any, path: str) -> list[str]:
        if isinstance(value, str):
            return Str(pattern=IANA_SVC_NAME).errors(value, path)
        return Int(1, 65535).errors(value, path)


@dataclasses.dataclass(frozen=True)
class IntOrPercent(Node):
    def errors(self, value: Any, path: str) -> list[str]:
        if isinstance(value, str):
            return Str(pattern=re.compile(r"^\d+%$")).errors(value, path)
        return Int(0).errors(value, path)


@dataclasses.dataclass(frozen=True)
class Quantity(Node):
    def errors(self, value: Any, path: str) -> list[str]:
        try:
            quantity(value)
        except ValueError as exc:
            return [f"{path}: {exc}"]
        return []


@dataclasses.dataclass(frozen=True)
class Arr(Node):
    item: Node
    min_items: int = 0

    def errors(self, value: Any, path: str) -> list[str]:
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        if len(value) < self.min_items:
            return [f"{path}: needs at least {self.min_items} item(s)"]
        return [e for i, item in enumerate(value) for e in self.item.errors(item, f"{path}[{i}]")]


@dataclasses.dataclass(frozen=True)
class Map(Node):
    """An object of arbitrary keys (labels, nodeSelector, resource lists)."""

    value: Node

    def errors(self, value: Any, path: str) -> list[str]:
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping, got {type(value).__name__}"]
        return [e for k, v in value.items() for e in self.value.errors(v, f"{path}.{k}")]


@dataclasses.dataclass(frozen=True)
class Obj(Node):
    """A typed object: `fields` typed, `untyped` names accepted as they are, others refused.
    `one_of`: exactly one of these fields must be set (`at_most_one`: at most one)."""

    fields: Mapping[str, Node]
    required: tuple[str, ...] = ()
    untyped: tuple[str, ...] = ()
    one_of: tuple[str, ...] = ()
    at_most_one: tuple[str, ...] = ()

    def errors(self, value: Any, path: str) -> list[str]:
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {type(value).__name__}"]
        out = [f"{path}.{name}: required" for name in self.required if name not in value]
        for key, item in value.items():
            if key in self.fields:
                out += self.fields[key].errors(item, f"{path}.{key}")
            elif key not in self.untyped:
                out.append(f"{path}.{key}: unknown field")
        if self.one_of and sum(k in value for k in self.one_of) != 1:
            out.append(f"{path}: exactly one of {', '.join(self.one_of)}")
        if sum(k in value for k in self.at_most_one) > 1:
            out.append(f"{path}: at most one of {', '.join(self.at_most_one)}")
        return out
