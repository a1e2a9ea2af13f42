"""The one error type a person can act on.

Every error that reaches a user says what was wrong, where, and what to do. The command line
prints it as one paragraph and exits with status 2; Python callers catch it as a ``ValueError``.
"""

from __future__ import annotations


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
