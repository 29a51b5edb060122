"""What a record's schema is made of (launcher.runtime.schema declares every record with it): a field's name, type,
unit and meaning, and the check that a value read back from a run directory has the declared shape.

A run directory is shared and written by user code's processes: a reader trusts nothing it reads back until a
Record has checked it (types, finite numbers, sizes; undeclared keys left out). Stdlib only, and no module of the
project: a worker executes this file and schema.py into a namespace of their own (launcher.worker.bootstrap).
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

LIMIT = 1 << 53  # an integer past this is no count
MAX_KEY = 128  # a key of a dict of values
MAX_ITEMS = 1 << 16  # items of a list, entries of a dict
MAX_TEXT = 4000  # a string, unless its field says less
ACROSS_RANKS = ("", "max", "sum", "rank0")  # how a row combines a step-record field's values of every rank
OVER_RUN = ("", "max", "sum", "last")  # how summary.json combines them over all the launch's records


class Field:
    """One field of a record.

    type: int, float, str, bool, list, dict, an Enum (one of its values), a Record (a nested object), or a tuple of
    these (any one). Numbers are finite and not negative unless `signed`; `null`: it may be null; `required`: a
    record without it is no record. `size`: the most characters of a string, or entries of a dict. `items`: the
    type of a list's items or a dict's values (null allowed there).

    A step record's field (launcher.runtime.schema.STEP) also says how the launcher uses it: `sample`, a function of
    no arguments the worker calls at every record (its value, or None to leave the field out); `rows`, how a
    metrics.jsonl row combines every rank's value (ACROSS_RANKS; "" leaves it out) and `per_rank`, whether the row
    lists each rank's as <name>_per_rank; `summary`, how summary.json combines all the launch's records (OVER_RUN:
    "last" is the newest); `chart`, whether the board draws it.
    """

    __slots__ = ("name", "type", "unit", "meaning", "required", "null", "signed", "size", "items", "item", "sample",
                 "rows", "per_rank", "summary", "chart")

    def __init__(self, name: str, type: Any, unit: str = "", meaning: str = "", *, required: bool = False,
                 null: bool = False, signed: bool = False, size: int = 0, items: Any = None,
                 sample: Optional[Callable[[], Any]] = None, rows: str = "", per_rank: bool = False, summary: str = "",
                 chart: bool = True) -> None:
        if rows not in ACROSS_RANKS or summary not in OVER_RUN:
            raise ValueError(f"{name}: rows is one of {ACROSS_RANKS}, summary one of {OVER_RUN}")
        self.name, self.type, self.unit, self.meaning = name, type, unit, meaning
        self.required, self.null, self.signed, self.size, self.items = required, null, signed, size, items
        self.item = Field(f"{name}[]", items, null=True, signed=signed, size=size) if items is not None else None
        self.sample, self.rows, self.per_rank, self.summary, self.chart = sample, rows, per_rank, summary, chart

    def __repr__(self) -> str:
        return f"Field({self.name!r}, {type_name(self.type)}, {self.unit!r})"

    def check(self, value: Any) -> Any:
        """The value as declared (an int as float for a float field, a string cut to size); ValueError otherwise."""
        if value is None:
            if self.null:
                return None
            raise ValueError(f"{self.name} is null")
        kinds = self.type if isinstance(self.type, tuple) else (self.type,)
        for kind in kinds:
            try:
                return self._as(kind, value)
            except ValueError:
                if len(kinds) == 1:
                    raise
        raise ValueError(f"{self.name}: expected {type_name(self.type)}, got {type(value).__name__}")

    def _as(self, kind: Any, value: Any) -> Any:
        if isinstance(kind, Record):
            return kind.check(value)
        if kind is bool and isinstance(value, bool):
            return value
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is int and number and isinstance(value, int):
            if (-LIMIT if self.signed else 0) <= value < LIMIT:
                return value
            raise ValueError(f"{self.name}: out of range")
        if kind is float and number:
            if math.isfinite(value) and (self.signed or value >= 0):
                return float(value)
            raise ValueError(f"{self.name}: out of range")
        if kind is str and isinstance(value, str):
            return value[:self.size or MAX_TEXT]
        if isinstance(kind, type) and issubclass(kind, Enum) and isinstance(value, str):
            try:
                return kind(value)
            except ValueError:
                pass
        if kind is list and isinstance(value, list) and len(value) <= MAX_ITEMS:
            return value if self.item is None else [self.item.check(v) for v in value]
        if kind is dict and isinstance(value, dict) and len(value) <= MAX_ITEMS:
            return value if self.item is None else self._entries(value)
        raise ValueError(f"{self.name}: expected {type_name(kind)}, got {type(value).__name__}")

    def _entries(self, values: Dict[Any, Any]) -> Dict[str, Any]:
        """A dict of values (launcher.log's): string keys to values of the items' type; other entries left out."""
        out: Dict[str, Any] = {}
        item = self.item
        assert item is not None
        for key, value in list(values.items())[:self.size or MAX_ITEMS]:
            if isinstance(key, str) and 0 < len(key) <= MAX_KEY:
                try:
                    out[key] = item.check(value)
                except ValueError:
                    continue
        return out


class Record:
    """The fields of one kind of record, in the order its writer writes them. `derived`, where given, returns more
    fields made from another record's (a metrics.jsonl row's from the step record's)."""

    added = 0  # fields added to any record so far: derived fields are made again after one

    def __init__(self, name: str, fields: Iterable[Field],
                 derived: Optional[Callable[[], List[Field]]] = None) -> None:
        self.name = name
        self.declared: Dict[str, Field] = {}
        self.derived = derived
        self.made: Tuple[int, Dict[str, Field], Tuple[str, ...]] = (-1, {}, ())  # (Record.added, fields, required)
        self.add(*fields)

    def add(self, *fields: Field) -> None:
        """Declare more fields (each name once)."""
        for field in fields:
            if field.name in self.declared:
                raise ValueError(f"{self.name}: {field.name} is declared twice")
            self.declared[field.name] = field
            Record.added += 1

    @property
    def fields(self) -> Dict[str, Field]:
        """Every field, by name: the declared ones, then the derived ones."""
        return self._made()[1]

    def _made(self) -> Tuple[int, Dict[str, Field], Tuple[str, ...]]:
        if self.made[0] != Record.added:  # made again after any record gained a field (a derived one may come of it)
            made = {**self.declared, **{f.name: f for f in (self.derived() if self.derived else [])
                                        if f.name not in self.declared}}
            self.made = (Record.added, made, tuple(name for name, f in made.items() if f.required))
        return self.made

    def check(self, data: Any, strict: bool = True) -> Dict[str, Any]:
        """data as declared, undeclared keys left out (and a null where its field may not be null). ValueError (naming
        the field) where data is not an object or a required field is missing or bad; a bad optional field too when
        strict, otherwise it is left out."""
        if not isinstance(data, dict):
            raise ValueError(f"{self.name}: expected an object, got {type(data).__name__}")
        _, fields, required = self._made()
        out: Dict[str, Any] = {}
        for name, value in data.items():  # a record's own keys: a summary holds a few of a hundred fields
            field = fields.get(name)
            if field is None or (value is None and not field.null):  # an optional field's null: not there
                continue
            try:
                out[name] = field.check(value)
            except ValueError as e:
                if strict or field.required:
                    raise ValueError(f"{self.name}: {e}") from None
        for name in required:
            if name not in out:
                raise ValueError(f"{self.name}: {name} is missing")
        return out

    def read(self, data: Any) -> Dict[str, Any]:
        """check(data, strict=False), or {} where data is no such record at all: what a lenient reader takes."""
        try:
            return self.check(data, strict=False)
        except ValueError:
            return {}

    def undeclared(self, data: Dict[str, Any]) -> List[str]:
        """Keys of data this record does not declare (a writer's mistake: readers leave them out)."""
        return sorted(set(data) - set(self.fields))


def type_name(kind: Any) -> str:
    if isinstance(kind, tuple):
        return " or ".join(type_name(k) for k in kind)
    if isinstance(kind, Record):
        return f"an object ({kind.name})"
    if isinstance(kind, type) and issubclass(kind, Enum):
        return "one of " + ", ".join(m.value for m in kind)
    return getattr(kind, "__name__", str(kind))
