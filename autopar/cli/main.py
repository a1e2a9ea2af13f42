"""The ``autopar`` command line (also ``python -m autopar``).

Errors a person can act on (``AutoparError``) print one paragraph and exit with status 2; pass
``--debug`` for the traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from rich.console import Console

from autopar.core.errors import AutoparError
from autopar.cli.compare import add_compare_parser, cmd_compare
from autopar.cli.dryrun import add_dryrun_parser, cmd_dryrun
from autopar.cli.export import add_export_parser, cmd_export
from autopar.cli.profile import add_profile_parsers, cmd_calibrate, cmd_profile
from autopar.cli.plan import (add_plan_parsers, cmd_clusters, cmd_estimate, cmd_models,
                              cmd_plan)
from autopar.cli.replan import add_replan_parser, cmd_replan
from autopar.cli.verify import add_verify_parser, cmd_verify

COMMANDS: dict[str, Callable[[argparse.Namespace, Console], int]] = {
    "models": cmd_models,
    "clusters": cmd_clusters,
    "estimate": cmd_estimate,
    "plan": cmd_plan,
    "verify": cmd_verify,
    "export": cmd_export,
    "compare": cmd_compare,
    "dryrun": cmd_dryrun,
    "profile": cmd_profile,
    "calibrate": cmd_calibrate,
    "replan": cmd_replan,
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autopar", description=__doc__.splitlines()[0])
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    # --debug is also accepted after the command; SUPPRESS keeps the one given before it
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)
    add_plan_parsers(sub, [debug])
    add_verify_parser(sub, [debug])
    add_export_parser(sub, [debug])
    add_compare_parser(sub, [debug])
    add_dryrun_parser(sub, [debug])
    add_replan_parser(sub, [debug])
    add_profile_parsers(sub, [debug])
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = Console()
    try:
        return COMMANDS[args.command](args, console)
    except AutoparError as err:
        if args.debug:
            raise
        print(f"autopar {args.command}: error: {err.paragraph()}", file=sys.stderr)
        return 2


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
