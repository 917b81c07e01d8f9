"""Untrusted text made visible: every character that could hide, reorder or take over what a reader sees.

A report shows strings graphwatch does not control: variable, attribute and
file names, source lines, and whole traces someone else recorded.  Some
characters in them act instead of showing: ESC and BEL drive a terminal (set
its title, clear it, recolour what follows), bidirectional controls (U+202E,
U+2066 ...) reorder a line so that code reads differently from what it does
("Trojan Source"), NUL and most C0 characters make an SVG file ill-formed, and
lone surrogates (a file name the operating system gave in a locale that could
not decode it) cannot be written as UTF-8 at all.  :func:`visible` replaces each
of them by its code point written as rustc writes it, ``\\u{202e}``;
:func:`html_text` does the same for HTML element content and marks each one so
that it stands out; :func:`html_attr` is for attribute values (and is the safe
default: no markup at all).

Example::

    >>> visible("loss\\x1b]0;pwned\\x07 = 1")
    'loss\\\\u{1b}]0;pwned\\\\u{7} = 1'
    >>> hidden_characters("x = 1 #\\u202e } \\u2066")
    ['U+202E RIGHT-TO-LEFT OVERRIDE', 'U+2066 LEFT-TO-RIGHT ISOLATE']
    >>> html_attr('"><script>')
    '&quot;&gt;&lt;script&gt;'
"""

from __future__ import annotations

import html
import re
import unicodedata

# C0 controls but tab and newline; DEL and C1; the bidirectional controls (Unicode's Bidi_Control: ALM, LRM, RLM,
# LRE..RLO, LRI..PDI); zero-width space, line and paragraph separators, the byte order mark; the two
# noncharacters XML refuses; lone surrogates.
_HIDDEN = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028-\u202e\u2066-\u2069\ufeff\ufffe\uffff\ud800-\udfff]"
)
_UNNAMED = {"Cc": "CONTROL CHARACTER", "Cs": "LONE SURROGATE (a byte of a name that could not be decoded)"}
_BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


_ESCAPED_BYTES = re.compile("[\udc80-\udcff]+")


def _marker(match: re.Match[str]) -> str:
    return f"\\u{{{ord(match[0]):x}}}"


def _decoded(match: re.Match[str]) -> str:
    """A run of bytes Python could not decode in the locale it ran in (``surrogateescape``: byte ``b`` as
    U+DC00 + ``b``), decoded as UTF-8; bytes that are not UTF-8 as ``\\x{ff}``."""
    raw = bytes(ord(c) - 0xDC00 for c in match[0])
    text = raw.decode("utf-8", "backslashreplace")
    return re.sub(r"\\x([0-9a-f]{2})", r"\\x{\1}", text)


def visible(text: str) -> str:
    """``text`` with each control, bidirectional, invisible or unencodable character written as ``\\u{hex}``.

    Tab and newline stay as they are; so does every printable character, right-to-left letters included.
    A file name Python read in a locale that could not decode it (``LANG=C``: ``tr\\udcc3\\udca4in.py``)
    shows as the UTF-8 name it is; a byte that is not UTF-8 as ``\\x{ff}``.

    >>> visible("tr\\udcc3\\udca4in.py"), visible("x\\udcff.py"), visible("שלום")
    ('träin.py', 'x\\\\x{ff}.py', 'שלום')
    """
    return _HIDDEN.sub(_marker, _readable(text))


def one_line(text: str) -> str:
    """``text`` as :func:`visible` shows it, on one line: a newline written as ``\\n`` and a tab as ``\\t``.

    For a name the user's code spells (a module attribute set with ``setattr`` can be any string) where the
    lines are graphwatch's own: a box of a drawing is the name over its shape, and its first line is the name.

    >>> one_line('a"b\\n]c\\\\\\t')
    'a"b\\\\n]c\\\\\\\\t'
    """
    return visible(text).replace("\n", "\\n").replace("\t", "\\t")


def _readable(text: str) -> str:
    return text if text.isascii() else _ESCAPED_BYTES.sub(_decoded, text)  # (isascii: a flag, not a scan)


def hidden_characters(text: str) -> list[str]:
    """Each distinct character :func:`visible` would replace, as ``U+202E RIGHT-TO-LEFT OVERRIDE``, in order."""
    found = dict.fromkeys(match[0] for match in _HIDDEN.finditer(_readable(text)))
    return [f"U+{ord(c):04X} {unicodedata.name(c, _UNNAMED.get(unicodedata.category(c), 'CHARACTER'))}" for c in found]


def has_bidi(text: str) -> bool:
    """Whether ``text`` holds a bidirectional control character (what makes code read unlike what it does)."""
    return _BIDI.search(text) is not None


def patch_warning(patch: str) -> str | None:
    """Why ``patch`` must not be offered for copying (it holds characters that hide or reorder what it shows,
    so it applies something other than what it reads), or None when it may be.

    >>> patch_warning("+x = 1  #\u202e")  # doctest: +ELLIPSIS
    'this patch holds characters that hide or reorder text (U+202E RIGHT-TO-LEFT OVERRIDE): it applies ...'
    """
    hidden = hidden_characters(patch)
    if not hidden:
        return None
    return f"this patch holds characters that hide or reorder text ({', '.join(hidden)}): it applies something " \
        "other than what it shows"


def html_attr(text: str) -> str:
    """``text`` for an HTML attribute value (or any place where markup is not allowed): :func:`visible`, then escaped."""
    return html.escape(visible(text), quote=True)


def html_text(text: str) -> str:
    """``text`` for HTML element content: escaped, each hidden character shown as a marked ``\\u{hex}``.

    >>> html_text("a\\u202eb<")
    'a<span class="hidden-char" title="U+202E RIGHT-TO-LEFT OVERRIDE">\\\\u{202e}</span>b&lt;'
    """
    parts, start, text = [], 0, _readable(text)
    for match in _HIDDEN.finditer(text):
        parts.append(html.escape(text[start : match.start()], quote=True))
        name = hidden_characters(match[0])[0]
        parts.append(f'<span class="hidden-char" title="{name}">{_marker(match)}</span>')
        start = match.end()
    parts.append(html.escape(text[start:], quote=True))
    return "".join(parts)
