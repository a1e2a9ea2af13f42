"""The one error type a person can act on.

Every error that reaches a user says what was wrong, where, and what to do. The command line
prints it as one paragraph and exits with status 2; Python callers catch it as a ``ValueError``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class AutoparError(ValueError):
    """Bad input: ``what`` was wrong, ``where`` (a field, file, module or line), ``fix`` to do."""

    def __init__(self, what: str, *, where: str = "", fix: str = "") -> None:
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self.paragraph())

    def paragraph(self) -> str:
        parts = [self.what.rstrip(".") + "."]
        if self.where:
            parts.append(f"Where: {self.where}.")
        if self.fix:
            parts.append(f"What to do: {self.fix.rstrip('.')}.")
        return " ".join(parts)


def read_json(path: str | os.PathLike[str], what: str, fix: str) -> object:
    """The JSON in the file at ``path``, or an ``AutoparError`` naming ``what`` it should hold
    (a file that cannot be read: ``fix``; one that is not JSON: the line)."""
    p = Path(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except OSError as err:
        raise AutoparError(f"cannot read the {what} ({err.strerror})", where=str(p),
                           fix=fix) from None
    except json.JSONDecodeError as err:
        raise AutoparError(f"the {what} is not JSON: {err.msg}", where=f"{p}, line {err.lineno}",
                           fix="fix the syntax there, or pass a file written by autopar") from None
