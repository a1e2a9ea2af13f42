"""The layers hold at runtime: who may import whom (``docs/architecture.md``, "Layers").

Two checks of one table (``ALLOWED``): every import statement in the source, at module level or
inside a function (the lazy ones), read with ``ast``; and fresh interpreters that import a layer
(and run a plan through report, explanation and export) with ``builtins.__import__`` wrapped, so
that every import that really happens is recorded with the module that asked for it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"autopar": "autopar", "costmodel": "autopar.costmodel", "passes": "autopar.passes"}
"""Source folder -> the package it installs as (pyproject's ``package-dir``)."""

LAYERS: dict[str, tuple[str, ...]] = {
    "core": ("autopar.core",),
    "models": ("autopar.models",),
    "kernels": ("autopar.kernels",),
    "costmodel": ("autopar.costmodel",),
    "analysis": ("autopar.analysis",),
    "search": ("autopar.search",),
    "passes": ("autopar.passes",),
    "api": ("autopar.api",),
    "report": ("autopar.report",),
    "dryrun": ("autopar.dryrun",),
    "exports": ("autopar.exports",),
    "verify": ("autopar.verify",),
    "measure": ("autopar.measure",),
    "cli": ("autopar.cli", "autopar.__main__"),
    "package": ("autopar._moved",),
}
"""Module prefixes of each layer, one package each (``autopar`` itself is ``package``: its
``__init__`` and the old import paths, ``_moved``). Every ``autopar`` module is in one."""

_BELOW_API = frozenset({"core", "models", "costmodel", "analysis", "search"})
ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset({"core"}),
    "models": frozenset({"core", "models"}),
    "kernels": frozenset({"core", "kernels"}),
    "costmodel": frozenset({"core", "costmodel"}),
    "analysis": frozenset({"core", "models", "costmodel", "analysis"}),
    "search": frozenset({"core", "models", "costmodel", "analysis", "search"}),
    "passes": frozenset({"core", "models", "kernels", "analysis", "passes"}),
    "api": _BELOW_API | {"api"},
    "report": frozenset({"core", "costmodel", "report"}),
    "dryrun": frozenset({"core", "models", "kernels", "costmodel", "analysis", "passes",
                        "dryrun"}),
    "exports": frozenset({"core", "models", "costmodel", "analysis", "passes", "report",
                         "exports"}),
    "verify": frozenset({"core", "models", "costmodel", "analysis", "passes", "report", "api",
                        "verify"}),
    "measure": _BELOW_API | {"api", "verify", "measure"},
    "cli": frozenset(LAYERS) - {"package"} | {"cli"},
    "package": frozenset({"core", "package"}),
}
"""Who may import whom: each layer the layers below it. The public names the package root
binds lazily (``autopar.__getattr__``, ``Plan.report``, ``ModelSpec.build``) go through
``importlib`` by name, not an import statement, and are checked where they run (the fresh
interpreters below)."""


def layer_of(module: str) -> str:
    if module == "autopar":
        return "package"
    for layer, prefixes in LAYERS.items():
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return layer
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS (and to "
                         "docs/architecture.md)")


def violation(importer: str, imported: str) -> str | None:
    """Why ``importer`` may not import ``imported`` (both ``autopar`` modules), or None."""
    own, imported_layer = layer_of(importer), layer_of(imported)
    if imported_layer in ALLOWED[own]:
        return None
    return f"{importer} ({own}) imports {imported} ({imported_layer})"


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in SOURCES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((package, *parts))] = path
    return out


def _is_type_checking(node: ast.AST) -> bool:
    """An ``if TYPE_CHECKING:`` block: its imports are for annotations and never run."""
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING"))


def _imports(module: str, path: Path) -> list[str]:
    """Every ``autopar`` module ``path`` imports, anywhere in it (but for annotations only),
    relative imports resolved."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if _is_type_checking(block)
                   for stmt in block.body for n in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + is_package]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            # ``from autopar import passes`` imports a module, not a name of the package
            subs = [f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in _MODULES]
            found += subs if name == "autopar" and subs else [name, *subs]
    return [m for m in found if m == "autopar" or m.startswith("autopar.")]


_MODULES = _modules()


def test_the_table_covers_every_layer_named_in_the_architecture() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    for layer, prefixes in LAYERS.items():
        assert f"| {layer} " in text, f"docs/architecture.md has no row for the layer {layer}"
        for prefix in prefixes:
            assert prefix.removeprefix("autopar.") in text, (layer, prefix)


def test_every_module_is_in_a_layer_and_the_package_top_is_small() -> None:
    for module in _MODULES:
        layer_of(module)
    top = sorted(p.name for p in (ROOT / "autopar").glob("*.py"))
    assert len(top) <= 6, f"autopar/ holds {len(top)} modules, {top}: put each in its package"


def test_every_import_in_the_source_goes_down() -> None:
    bad = [v for module, path in _MODULES.items() for imported in _imports(module, path)
           if (v := violation(module, imported))]
    assert not bad, "\n".join(bad)


def test_a_wrong_import_is_caught() -> None:
    """The check is not vacuous: the imports the re-layering removed are violations."""
    assert violation("autopar.costmodel.topology", "autopar.search.strategies")
    assert violation("autopar.analysis.workload", "autopar.search.tp_solve")
    assert violation("autopar.analysis.ops.rules", "autopar.costmodel.step") is None  # analysis may
    assert violation("autopar.passes.fuse", "autopar.costmodel.workload")
    assert violation("autopar.core.plan", "autopar.exports.folder")
    assert violation("autopar.core.plan", "autopar.report.text")
    assert violation("autopar.exports.train_template", "autopar.api")
    assert violation("autopar.passes.mesh", "autopar.costmodel.errors")
    assert violation("autopar.passes.model_parts", "autopar.search.space")
    assert violation("autopar.core.plan", "autopar")
    assert violation("autopar.api", "autopar.search.planner") is None
    assert violation("autopar.core.model_spec", "autopar.models.spec")  # no exception remains
    assert violation("autopar.report.text", "autopar.dryrun.run")
    assert violation("autopar.dryrun.run", "autopar.verify.launcher")
    assert violation("autopar.verify.run", "autopar.measure.profiling")
    assert violation("autopar.measure.profiling", "autopar.verify.launcher") is None
    assert violation("autopar.exports.megatron", "autopar.cli.args")


_RECORD = """
import builtins, json, sys
seen = set()
real = builtins.__import__
def record(name, globals=None, locals=None, fromlist=(), level=0):
    module = real(name, globals, locals, fromlist, level)
    importer = (globals or {}).get("__name__", "")
    if importer.startswith("autopar"):
        if level:
            package = (globals or {}).get("__package__") or ""
            base = package.rsplit(".", level - 1)[0] if level > 1 else package
            name = f"{base}.{name}" if name else base
        subs = [f"{name}.{item}" for item in fromlist or () if f"{name}.{item}" in sys.modules]
        if name.startswith("autopar") and not (name == "autopar" and subs):
            seen.add((importer, name))
        seen.update((importer, sub) for sub in subs if sub.startswith("autopar"))
    return module
builtins.__import__ = record
"""


def _run(code: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The ``autopar`` modules loaded and the (importer, imported) pairs recorded by ``code``
    run in a fresh interpreter."""
    script = _RECORD + code + """
print(json.dumps([sorted(m for m in sys.modules if m.startswith("autopar")),
                  sorted(seen)]))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded, pairs = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded, [tuple(p) for p in pairs]


@pytest.mark.parametrize("target, forbidden", [
    ("autopar", ("search", "passes", "costmodel", "analysis", "models", "kernels")),
    ("autopar.core", ("search", "passes", "costmodel", "analysis", "models", "kernels")),
    ("autopar.costmodel", ("search", "passes", "analysis", "models", "kernels")),
    ("autopar.costmodel.cluster", ("search", "passes", "analysis", "models", "kernels")),
    ("autopar.costmodel.step", ("search", "passes", "analysis", "models", "kernels")),
    ("autopar.models", ("search", "passes", "costmodel", "analysis", "kernels")),
    ("autopar.passes", ("search", "costmodel")),
    ("autopar.analysis.admissibility", ("search", "passes", "kernels", "api", "report")),
    ("autopar.report.text", ("search", "passes", "analysis", "models", "kernels", "dryrun",
                             "verify", "measure", "cli")),
    ("autopar.dryrun.run", ("search", "api", "verify", "measure", "exports", "cli")),
    ("autopar.exports", ("search", "verify", "measure", "dryrun", "cli")),
    ("autopar.verify.run", ("measure", "dryrun", "exports", "cli")),
    ("autopar.measure.calibration", ("dryrun", "exports", "cli")),
])
def test_importing_a_layer_loads_nothing_above_it(target: str, forbidden: tuple[str, ...]
                                                  ) -> None:
    loaded, pairs = _run(f"import {target}\n")
    above = [m for m in loaded if layer_of(m) in forbidden]
    assert not above, f"import {target} loaded {above}"
    bad = [v for a, b in pairs if (v := violation(a, b))]
    assert not bad, "\n".join(bad)


def test_a_plan_made_reported_explained_and_exported_imports_only_downwards(
        tmp_path: Path) -> None:
    """The lazy imports that run: plan, report, explain, export, then build the program."""
    loaded, pairs = _run(f"""
import autopar
from autopar.core.model_spec import ModelSpec
spec = ModelSpec("tiny-llama")
cluster = autopar.ClusterSpec.preset("hgx-h100-80g")
train = autopar.TrainSpec(global_batch=8, seq_len=32)
plan = autopar.optimize(spec.build("meta"), cluster, train, {{"tp": 2, "pp": 2}})
plan.report(); plan.explain(); autopar.diff(plan, plan)
est = autopar.estimate(spec.build("meta"), cluster, train, plan.config)
plan.export({str(tmp_path / "run")!r})
autopar.Plan.from_file({str(tmp_path / "run" / "plan.json")!r}).report()
import autopar.passes.program
""")
    assert any(m.startswith("autopar.search") for m in loaded)  # the workflow ran the search
    bad = [v for a, b in pairs if (v := violation(a, b))]
    assert not bad, "\n".join(bad)


def test_an_old_import_path_is_the_moved_module_and_keeps_the_public_function() -> None:
    out = subprocess.run([sys.executable, "-W", "error::DeprecationWarning:__main__", "-c", """
import warnings, autopar
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import autopar.dry_run
    from autopar.verify_worker import main
    from autopar.ops.registry import FAMILIES
import autopar.dryrun.run, autopar.verify.worker, autopar.analysis.ops.registry
assert autopar.dry_run is autopar.dryrun.run.dry_run, autopar.dry_run
assert main is autopar.verify.worker.main
assert FAMILIES is autopar.analysis.ops.registry.FAMILIES
assert sorted(str(w.message) for w in caught) == [
    "autopar.dry_run moved to autopar.dryrun.run; import it from there",
    "autopar.ops moved to autopar.analysis.ops; import it from there",
    "autopar.verify_worker moved to autopar.verify.worker; import it from there"], caught
"""], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
