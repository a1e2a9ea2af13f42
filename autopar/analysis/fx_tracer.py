"""The tracer of ``analysis/tracing.py``: torch.fx's ``Tracer`` with the op registry's leaves,
and two of fx's costs paid once instead of at every use (a MoE's parameter reads, a shape's
unpacking); ``tests/unit/analysis/test_propagate.py`` holds its graphs to fx's own."""

from __future__ import annotations

import bisect
import dis
import functools
import inspect
import sys
import types
from collections.abc import Iterator

import torch
import torch.fx
from torch import nn

from autopar.analysis.ops import OP_NAMES


class RegistryLeaves(torch.fx.Tracer):
    """``symbolic_trace``'s tracer, with a ``torch.nn`` module kept as one node only where the op
    registry knows its class (``nn.Linear``, ``nn.LayerNorm``, ``nn.Embedding``...). Any other
    (``nn.TransformerEncoderLayer``, ``nn.MultiheadAttention``) is traced into, as fx traces
    the user's own modules, so that its GEMMs and attention are seen and priced; where fx cannot
    follow its Python (the fast-path checks on tensor values), the trace falls back to
    torch.export, which sees every module down to ATen."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return (super().is_leaf_module(m, module_qualified_name)
                and type(m).__name__ in OP_NAMES)

    def proxy(self, node: torch.fx.Node) -> torch.fx.Proxy:
        return _UnpackingProxy(node, self)

    def getattr(self, attr: str, attr_val: object, parameter_proxy_cache: dict) -> object:
        """fx's, a parameter found by a map of the root's parameters made once per trace:
        fx's walks ``named_parameters()`` at each read of one (a MoE reading its experts' weights
        in forward: 160,000 steps for DeepSeek-V3's 232 reads)."""
        if isinstance(attr_val, nn.Parameter) and not self.param_shapes_constant:
            root = self.root
            if getattr(self, "_names_of", (None,))[0] is not root:
                self._names_of = (root, {id(p): n for n, p in root.named_parameters()})
            name = self._names_of[1].get(id(attr_val))
            if name is not None:
                if name not in parameter_proxy_cache:
                    parameter_proxy_cache[name] = self.create_proxy("get_attr", name, (), {})
                return parameter_proxy_cache[name]
        return super().getattr(attr, attr_val, parameter_proxy_cache)


class _UnpackingProxy(torch.fx.Proxy):
    """fx's ``Proxy``, whose unpacking (``b, s, _ = x.shape``) reads the calling code's
    instructions once per code object: fx's own disassembles the whole calling function at
    every unpacking (~0.7 ms each; a 126-block Llama unpacks 505 times)."""

    def __iter__(self) -> Iterator[torch.fx.Proxy]:
        frame = inspect.currentframe()
        calling = frame.f_back if frame is not None else None
        if calling is None:
            return self.tracer.iter(self)
        offsets, instructions = _instructions(calling.f_code)
        at = (bisect.bisect_left(offsets, calling.f_lasti) if sys.version_info >= (3, 11)
              else calling.f_lasti // 2)  # as fx finds the instruction
        opname, argval = instructions[at]
        if opname == "UNPACK_SEQUENCE":
            return (self[i] for i in range(argval))  # type: ignore[index]
        return self.tracer.iter(self)

    def __getattr__(self, k: str) -> torch.fx.proxy.Attribute:
        return _UnpackingAttribute(self, k)  # ``x.shape`` is one: it is what is unpacked


class _UnpackingAttribute(_UnpackingProxy, torch.fx.proxy.Attribute):
    """fx's ``Attribute`` (``x.shape`` before it is used), unpacked as ``_UnpackingProxy``."""


@functools.lru_cache(maxsize=4096)
def _instructions(code: types.CodeType) -> tuple[list[int], list[tuple[str, object]]]:
    found = list(dis.get_instructions(code))
    return [i.offset for i in found], [(i.opname, i.argval) for i in found]
