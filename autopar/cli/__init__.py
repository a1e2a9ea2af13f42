"""The command line, one module per command: ``main`` (the parser and dispatch), ``plan``
(``plan``, ``estimate``, ``models``, ``clusters``), ``verify``, ``dryrun`` (``dry-run`` and
``check``), ``export``, ``profile`` (``profile``, ``calibrate``), ``compare``; ``args`` holds
what several share (model, cluster and training flags, and reading them back).

Errors a person can act on exit with status 2 and one paragraph (``AutoparError``)."""

from autopar.cli.main import main, parser, run

__all__ = ["main", "parser", "run"]
