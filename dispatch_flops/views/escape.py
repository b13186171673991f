"""What a text view prints of names it did not choose (a model's module names, class names,
op names, a loaded JSON's strings): never a character a terminal acts on.

A module name is any string (``nn.Module.add_module`` refuses only "." and ""), and a saved
profile's names are whatever its file says, so a name may carry terminal escapes (cursor up,
erase line: ``ESC[1A ESC[2K``), C0 / C1 controls, a line break, or a bidirectional override
(U+202E RLO) that makes the rows around it read backwards. Printed raw, such a name rewrites
what the reader sees. Each one is shown as its Python escape instead (``\\x1b``, ``\\u202e``):
visible, and telling which character it was. JSON keeps names as they are (it is data).

Escaped: Unicode's controls (Cc: C0, DEL, C1), format characters (Cf: the bidi embeddings,
overrides and isolates, zero-width joiners), lone surrogates (Cs: a terminal's encoder cannot
write them), the line and paragraph separators (Zl, Zp) and spaces other than " " (Zs).
``printable`` escapes a name's line breaks and tabs too (the layout's columns and rows are the
view's); ``safe_lines`` keeps the text's own line breaks and escapes the rest, the last step
of every text view.
"""

from __future__ import annotations

import unicodedata

_ESCAPED = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}  # as Python's repr writes them


def _escape(c: str) -> str:
    if c in _SHORT:
        return _SHORT[c]
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _acted_on(c: str) -> bool:
    # a space other than " " (no-break, ideographic, ...) too: invisible, and a table's
    # layout strips it, so a name of one would print as nothing
    category = unicodedata.category(c)
    return category in _ESCAPED or (category == "Zs" and c != " ")


def printable(name: str) -> str:
    """``name`` with every character a terminal would act on (a line break and a tab
    included) written as its escape; a plain name is returned as it is."""
    name = str(name)
    if name.isprintable():  # the common case: one C-level scan
        return name
    return "".join(_escape(c) if _acted_on(c) else c for c in name)


def safe_lines(text: str) -> str:
    """``text`` with its line breaks kept and every other character a terminal would act on
    written as its escape."""
    if text.isprintable():
        return text
    return "\n".join(printable(line) for line in text.split("\n"))


def cell(name: str) -> str:
    """``printable(name)`` for a table cell: a space it starts or ends with is escaped too
    (a table strips it: " a" and "a" would print alike)."""
    name = printable(name)
    stripped = name.strip(" ")
    if stripped == name:
        return name
    head = len(name) - len(name.lstrip(" "))
    tail = len(name) - head - len(stripped) if stripped else 0
    return "\\x20" * head + stripped + "\\x20" * tail
