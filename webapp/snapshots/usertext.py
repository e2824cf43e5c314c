"""User text made safe to store and show: one line (a run name, a tag, a team's name) or many (a note).

A bottom module: the forms (``intake.forms``) and the teams (``teams.membership``) clean names alike.
"""

from __future__ import annotations

# Characters a user's text never needs and an attacker uses: bidirectional overrides and isolates
# (U+202E makes "exe.txt" read "txt.exe"), the invisible marks, and the C0/C1 controls. A line
# (run name, tag) also loses CR and LF, which forge lines in logs and exports; a note keeps its
# line breaks as LF (issue 22).
_BIDI_AND_INVISIBLE = "\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\ufeff"
_CONTROLS = "".join(chr(c) for c in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)))
_DROP_IN_LINE = str.maketrans(dict.fromkeys(_BIDI_AND_INVISIBLE + _CONTROLS.replace("\t", "")) | {"\t": " "})
_DROP_IN_TEXT = str.maketrans(dict.fromkeys(_BIDI_AND_INVISIBLE + _CONTROLS.replace("\t", "").replace("\n", "")))


def clean_line(text: str) -> str:
    """One line of user text: no controls, no line breaks, no bidi overrides."""
    return text.translate(_DROP_IN_LINE).strip()


def clean_text(text: str) -> str:
    """Multi-line user text: line breaks kept (CR LF and CR become LF), other controls and bidi dropped."""
    return text.replace("\r\n", "\n").replace("\r", "\n").translate(_DROP_IN_TEXT)
