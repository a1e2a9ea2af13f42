"""Errors a person can act on when ``autopar.trace`` cannot trace a model.

When neither ``torch.fx.symbolic_trace`` nor ``torch.export.export(strict=False)`` can trace a
model, the message names the module that was running (qualified name and class), the line of
user code at fault, and what to do. Non-strict export runs the real Python forward on fake
tensors, so forward pre-hooks and hooks on every submodule (``ModuleStack``) keep the stack of
modules being executed; when an exception escapes, the innermost module still on the stack is
the one at fault. The line is the innermost traceback frame in a file outside torch,
transformers and the standard library (the innermost frame if there is none).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import sysconfig
import traceback
from collections.abc import Iterator
from types import TracebackType

import torch
from torch import nn

from autopar.core.errors import AutoparError

_STDLIB = os.path.join(sysconfig.get_paths()["stdlib"], "")
_SITE = tuple(os.path.join(sysconfig.get_paths()[k], "") for k in ("purelib", "platlib"))


def _is_library_file(filename: str) -> bool:
    """True for frames that are never "the user's line": torch, transformers, the stdlib."""
    if filename.startswith("<"):
        return True  # generated code (fx's "<eval_with_key>", "<string>")
    name = os.path.abspath(filename)
    libs = [os.path.join(os.path.dirname(torch.__file__), "")]
    tf = sys.modules.get("transformers")
    if tf is not None and getattr(tf, "__file__", None):
        libs.append(os.path.join(os.path.dirname(tf.__file__), ""))
    if name.startswith(tuple(libs)):
        return True
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.dirname(name) == here and os.path.basename(name).startswith("tracing"):
        return True  # autopar/tracing*.py: the tracer, not the model
    return name.startswith(_STDLIB) and not name.startswith(_SITE)


class ModuleStack:
    """Forward pre-hooks/hooks on every submodule that keep the stack of running modules.

    Use as a context manager around one forward (or export); the hooks are removed on exit.
    After an exception, ``innermost`` is the module that was running when it was raised (the
    post-hook of a module whose forward raised never runs, so it stays on the stack).
    """

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        self._names = {id(m): name for name, m in model.named_modules()}
        self.stack: list[tuple[str, str]] = []
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> ModuleStack:
        for module in self._model.modules():
            self._handles.append(module.register_forward_pre_hook(self._push))
            self._handles.append(module.register_forward_hook(self._pop))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _push(self, module: nn.Module, args: object) -> None:
        self.stack.append((self._names.get(id(module), "?"), type(module).__name__))

    def _pop(self, module: nn.Module, args: object, output: object) -> None:
        if self.stack:
            self.stack.pop()

    @property
    def innermost(self) -> tuple[str, str] | None:
        """(qualified name, class name) of the innermost running module, or None."""
        return self.stack[-1] if self.stack else None


@contextlib.contextmanager
def quiet_torch_logs() -> Iterator[None]:
    """Silence what a failing export writes (a data-dependent-guard warning, the partial graph).

    torch.export prints the partial fx graph of a failed trace to stderr (torch/export/_trace.py,
    ``print(e.partial_fx_graph, file=sys.stderr)``); our ``AutoparError`` replaces it. Output of
    a successful export is passed through.
    """
    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    old = logger.level
    logger.setLevel(logging.ERROR)
    captured = io.StringIO()
    ok = False
    try:
        with contextlib.redirect_stderr(captured):
            yield
        ok = True
    finally:
        logger.setLevel(old)
        if ok and captured.getvalue():
            sys.stderr.write(captured.getvalue())


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from, outermost first."""
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """Innermost frame of ``exc``'s traceback (and its causes) in user code, else the innermost."""
    innermost: traceback.FrameSummary | None = None
    for err in _chain(exc):
        for fs in reversed(traceback.extract_tb(err.__traceback__)):
            if innermost is None:
                innermost = fs
            if not _is_library_file(fs.filename):
                return fs
    return innermost


def _module_from_frames(exc: BaseException, model: nn.Module) -> tuple[str, str] | None:
    """The innermost traceback frame whose ``self`` is a submodule of ``model``."""
    names = {id(m): name for name, m in model.named_modules()}
    for err in _chain(exc):
        tb = err.__traceback__
        found: tuple[str, str] | None = None
        while tb is not None:
            owner = tb.tb_frame.f_locals.get("self")
            if owner is not None and id(owner) in names:
                found = (names[id(owner)], type(owner).__name__)
            tb = tb.tb_next
        if found is not None:
            return found
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def _is_data_dependent(exc: BaseException) -> bool:
    text = " ".join(f"{type(e).__name__} {e}" for e in _chain(exc)).lower()
    return any(k in text for k in ("data-dependent", "datadependent", "guardondatadependent",
                                   "control flow", "unbacked"))


def untraceable_error(
    model: nn.Module, fx_error: BaseException, export_error: BaseException,
    running: tuple[str, str] | None,
) -> AutoparError:
    """The ``AutoparError`` for a model that neither torch.fx nor torch.export can trace."""
    module = running or _module_from_frames(export_error, model) or _module_from_frames(
        fx_error, model)
    frame = user_frame(export_error) or user_frame(fx_error)
    places = []
    if module is not None:
        name, cls = module
        places.append(f"module '{name or '<root>'}' ({cls})")
    if frame is not None:
        code = f" (`{frame.line.strip()}`)" if frame.line else ""
        places.append(f"{frame.filename}:{frame.lineno}{code}")
    if _is_data_dependent(export_error) or _is_data_dependent(fx_error):
        why = "its Python control flow depends on tensor values"
        fix = ("make the control flow static (no Python if/for/while on tensor values or "
               ".item()); use torch.cond for a data-dependent branch; write routing with static "
               "shapes (capacity-based dispatch, or counts.tolist() + torch._check + torch.split); "
               "or mark the module as an fx leaf and trace it separately")
    else:
        why = "torch.fx and torch.export both failed on it"
        fix = ("make the forward traceable by torch.export(strict=False): tensors in and out, "
               "no data-dependent shapes or control flow, no unsupported side effects")
    return AutoparError(
        f"cannot trace {type(model).__name__}: {why} "
        f"(torch.fx: {_first_line(fx_error)}; torch.export: {_first_line(export_error)})",
        where="; ".join(places) or type(model).__name__,
        fix=fix,
    )


def data_dependent_shape_error(module: str, op: str, line: str) -> AutoparError:
    """The error for a model that traces but whose shapes depend on its data: ``op`` (in
    ``module``, at the user's source ``line`` when known) returns a size known only with the
    data -- ``torch.where(mask)``, ``nonzero``, boolean indexing, the row counts of a
    hand-written mixture-of-experts loop -- and autopar sizes every op on the meta device."""
    where = module or "the model's forward"
    return AutoparError(
        f"the model's shapes depend on its data: {op} in {where} returns a size known only "
        "with the data, and autopar sizes every op on the meta device, without it",
        where=f"{where}{f' ({line})' if line else ''}",
        fix="a mixture of experts autopar recognises holds exactly a router nn.Linear(h, E) "
            "and an nn.ModuleList of E experts of one class, mapping h to h, and routes with "
            "torch.topk (models/generic/experts.py; a shared expert or other parameters beside "
            "them make it unrecognised); else keep the shapes static -- dense masks or a fixed "
            "capacity (scatter tokens into (experts, capacity, hidden) slots) -- or use a model "
            "family autopar knows: a zoo MoE (`autopar models`) or a transformers MoE "
            "(Mixtral, Qwen2-MoE, Qwen3-MoE) given by its config.json")


def not_a_module_error(obj: object) -> AutoparError:
    """The error for tracing something that is not an ``nn.Module``."""
    return AutoparError(
        f"autopar.trace needs a torch.nn.Module, got {type(obj).__module__}.{type(obj).__name__}",
        where="model",
        fix="pass the model object (an nn.Module), e.g. autopar.models.build('gpt-1.7b')",
    )


def opaque_op_error(op: str, target: str, module: str, line: str, params: tuple[str, ...]
                    ) -> AutoparError:
    """The error for an op that reads parameters, that no op family owns and whose FLOPs torch
    does not count: autopar cannot price it (``autopar/analysis/ops/opaque.py`` says why it is refused
    rather than priced as bytes)."""
    shown = ", ".join(params[:3]) + (f" and {len(params) - 3} more" if len(params) > 3 else "")
    return AutoparError(
        f"cannot price op {op!r} ({target}): it reads parameters ({shown}), autopar's op "
        "registry does not know it and torch's FLOP counter counts nothing for it, so its time is unknown "
        "(pricing it as memory traffic could miss a GEMM's worth of work)",
        where=f"module '{module or '<root>'}'" + (f" ({line})" if line else ""),
        fix="write that computation with ops autopar knows (nn.Linear, matmul/einsum, "
            f"the torch.nn layers `autopar.analysis.ops` lists), or register an op family for {op!r} "
            "(autopar.analysis.ops.register(OpFamily(...)) with its FLOPs, bytes and saved tensors), "
            "or register a FLOP formula for it with torch.utils.flop_counter."
            "register_flop_formula if it is a torch.library op",
    )
