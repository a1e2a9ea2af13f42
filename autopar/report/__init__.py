"""Every table and text a person reads: ``plan.report()``, ``plan.explain()``, ``autopar.diff``,
``autopar.compare``, the HTML report and its charts, the dry-run and verify tables.

``text`` (the plan report, explanation, diff and comparison), ``html`` and ``charts`` (the HTML
report), ``dryrun`` (dry-run and plan-check tables), ``verify`` (the verify result table),
``execution`` (what the execution passes run, in words). The names of the old module
``autopar.report`` (``plan_report``, ``diff``, ...) are still read from here.
"""

from importlib import import_module


def __getattr__(name: str) -> object:
    if name.startswith("_"):
        raise AttributeError(f"module 'autopar.report' has no attribute {name!r}")
    text = import_module("autopar.report.text")
    try:
        return getattr(text, name)
    except AttributeError:
        raise AttributeError(f"module 'autopar.report' has no attribute {name!r}") from None
