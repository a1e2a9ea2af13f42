"""What the fusion pass must know of transformers' own module classes in a Llama-style model.

transformers writes its norms and activations as its own classes, not torch's: ``LlamaRMSNorm``
(and its copies ``Qwen2RMSNorm``, ``MistralRMSNorm``...: a ``weight`` and a float
``variance_epsilon``) and ``SiLUActivation`` (``ACT2FN["silu"]`` in some versions). They are
recognised here by their class name, so the copies in other architectures are found too.
"""

from __future__ import annotations

from torch import nn


def rms_norm(module: nn.Module) -> tuple[nn.Parameter, float] | None:
    """(weight, eps) of a transformers RMSNorm over the last dim; ``None`` for another module."""
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", None)
    if type(module).__name__.endswith("RMSNorm") and isinstance(weight, nn.Parameter) \
            and weight.dim() == 1 and isinstance(eps, float) and not list(module.children()):
        return weight, eps
    return None


def is_silu(module: nn.Module) -> bool:
    """Whether ``module`` is transformers' parameter-free ``SiLUActivation``."""
    return type(module).__name__ == "SiLUActivation" and not list(module.parameters())
