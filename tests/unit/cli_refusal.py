"""The one check of a command line's refusal, for the tests of bad input: exit status 2 and one
paragraph on stderr -- what, where, what to do -- never a traceback."""

from __future__ import annotations

from autopar.cli.main import main


def refused(argv: list[str], capsys, *needles: str) -> str:
    """Run the command line; it must exit 2 with one paragraph on stderr holding ``needles``."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "Where:" in err and "What to do:" in err, err
    for needle in needles:
        assert needle in err, err
    return err
