"""What may enter a Profile, and the one check of it.

Counts reach a Profile from three places: a formula's ``Cost``
(``engine.counting.records.unit_of``), a file (``Profile.from_json`` / ``from_dict``) and another
rank (``distributed.gather``, whose payloads are read as files are). Each meets the bounds here;
docs/limits.md says what is trusted and what is checked, and why these bounds.

* a count (calls, flops, MACs, bytes, parameters, runs) is an ``int``, never a bool or a
  float, with ``0 <= n < COUNT_LIMIT``;
* a time is finite and ``>= 0``: ns an ``int`` below ``NS_LIMIT``, seconds a number below
  ``SECONDS_LIMIT`` (the same span);
* a dtype is a name in ``DTYPES`` (this torch's dtypes, never an attribute looked up on
  ``torch``), a phase one of ``PHASES``, a category one of ``CATEGORIES``.

A check answers the problem as the tail of a sentence (``"is -1, below 0"``), or None when
the value is good; the caller says where (``"run.json: records[3].stats.flops"``).
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional

import torch

from dispatch_flops.results.stats import CATEGORIES, PHASES

# 2**100 (about 1.3e30): 10,000 times the flops of the largest training runs to date, yet
# ~10**278 below where a float overflows, so every view's ratios and sums stay finite. Not
# 2**63: one step of a large model (a GPT-3 step at a batch of 3.2 M tokens is 3.4e21 flops)
# already passes it, and a file must read back whatever a run counted.
COUNT_LIMIT = 2**100
# ns in an int64, as torch and time.perf_counter_ns keep them: 292 years
NS_LIMIT = 2**63
SECONDS_LIMIT = NS_LIMIT / 1e9

# every dtype this torch has, by the name runs write ("bfloat16": str(dtype) less "torch.")
DTYPES: Mapping[str, torch.dtype] = MappingProxyType({
    str(d).replace("torch.", ""): d for d in vars(torch).values() if isinstance(d, torch.dtype)})
# name -> the one string object rows keep (a loaded file's strings are shared, not copied)
PHASE_NAMES: Mapping[Any, str] = MappingProxyType({str(p.value): str(p.value) for p in PHASES})
CATEGORY_NAMES: Mapping[Any, str] = MappingProxyType({str(c.value): str(c.value)
                                                      for c in CATEGORIES})
DTYPE_NAMES: Mapping[Any, str] = MappingProxyType({n: n for n in DTYPES})

Check = Callable[[Any], Optional[str]]


def shown(value: Any) -> str:
    """``value`` as an error message shows it: short, whatever it is (a 10**400 or a 1 MB
    string would drown the message; an int past 4,300 digits cannot even be printed)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return f"an object of {len(value)} keys"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# A check returns None for a good value, else the rest of the sentence that names it: a
# problem (" is -1, below 0") or the path down to one ("[2].stack is missing").


def _integer(value: Any) -> Optional[str]:
    if not isinstance(value, int) or isinstance(value, bool):
        return f" is {shown(value)}, not an integer"
    return None


def count(value: Any) -> Optional[str]:
    """A count: an int (not a bool), ``0 <= value < COUNT_LIMIT``."""
    problem = _integer(value)
    if problem is None:
        if value < 0:
            problem = f" is {value}, below 0"
        elif value >= COUNT_LIMIT:
            problem = f" is {shown(value)}, not below 2**100 (the bound on counts)"
    return problem


def positive(value: Any) -> Optional[str]:
    """A count of at least 1 (steps, repeats, a world size)."""
    problem = count(value)
    if problem is None and value < 1:
        problem = f" is {value}, below 1"
    return problem


def ns(value: Any) -> Optional[str]:
    """A time in ns: an int, ``0 <= value < NS_LIMIT``."""
    problem = _integer(value)
    if problem is None and not 0 <= value < NS_LIMIT:
        problem = f" is {shown(value)} ns, not from 0 to 2**63 - 1"
    return problem


def seconds(value: Any) -> Optional[str]:
    """A time in seconds: a finite number (not a bool), ``0 <= value < SECONDS_LIMIT``."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return f" is {shown(value)}, not a number of seconds"
    # an int is compared as it is: math.isfinite on an int past a float's range overflows
    if not ((isinstance(value, int) or math.isfinite(value)) and 0 <= value < SECONDS_LIMIT):
        return f" is {shown(value)}, not a finite number of seconds from 0 to 2**63 ns"
    return None


def text(value: Any) -> Optional[str]:
    return None if isinstance(value, str) else f" is {shown(value)}, not a string"


def flag(value: Any) -> Optional[str]:
    return None if isinstance(value, bool) else f" is {shown(value)}, not true or false"


def one_of(names: Mapping[Any, str], what: str) -> Check:
    """A name from a closed vocabulary: ``names``' keys."""
    def checked(value: Any) -> Optional[str]:
        if isinstance(value, str) and value in names:
            return None
        return f" is {shown(value)}, not {what}"
    return checked


phase = one_of(PHASE_NAMES, f"a phase ({', '.join(PHASE_NAMES)})")
category = one_of(CATEGORY_NAMES, f"a category ({', '.join(CATEGORY_NAMES)})")
dtype = one_of(DTYPE_NAMES, "the name of a dtype of this torch (float32, bfloat16, ...)")


def optional(check: Check) -> Check:
    """``check``, or None (JSON's null)."""
    return lambda value: None if value is None else check(value)


def list_of(check: Check, what: str, *, nonempty: bool = False) -> Check:
    """A list whose every item passes ``check``."""
    def checked(value: Any) -> Optional[str]:
        if not isinstance(value, list):
            return f" is {shown(value)}, not a list of {what}"
        if nonempty and not value:
            return f" is empty, not a list of {what}"
        for i, item in enumerate(value):
            problem = check(item)
            if problem is not None:
                return f"[{i}]{problem}"
        return None
    return checked


Fields = Mapping[str, tuple[Check, bool]]  # {name: (its check, whether it is required)}


def obj(fields: Fields) -> Check:
    """A JSON object with ``fields``; keys it does not name are left alone (a reader ignores
    keys it does not know: docs/schema.md)."""
    def checked(value: Any) -> Optional[str]:
        if not isinstance(value, dict):
            return f" is {shown(value)}, not a JSON object"
        for name, (check, required) in fields.items():
            if name not in value:
                if required:
                    return f".{name} is missing"
                continue
            problem = check(value[name])
            if problem is not None:
                return f".{name}{problem}"
        return None
    return checked


# a module stack: the running modules' names, root first (never empty: the root runs)
stack = list_of(text, "module names", nonempty=True)
names = list_of(text, "strings")
shape = list_of(count, "sizes")


def require(value: Any, check: Check, source: str, path: str = "") -> None:
    """``ValueError`` naming what in ``value`` fails ``check``: ``source`` (a file, a rank),
    then the field (``records[3].stats.flops``) and what is wrong with it."""
    problem = check(value)
    if problem is not None:
        where = (path + problem).lstrip(".")
        raise ValueError(f"{source}: {where}" if where[:1] != " " else f"{source}{where}")


def torch_dtype(name: str, default: torch.dtype = torch.float32) -> torch.dtype:
    """The torch dtype a run's dtype name names (``DTYPES``), ``default`` for any other."""
    return DTYPES.get(name, default)
