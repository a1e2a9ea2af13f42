"""``Preset``: one zoo entry, a named shape of a family's config with the source of its numbers.

Each family lists its own in ``autopar/models/<family>/presets.py`` (the paper or model card
each number comes from is there); ``autopar.models.PRESETS`` holds every registered family's,
in the zoo's order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class Preset:
    """One zoo entry: a family, the config fields it sets, and where the numbers come from."""

    name: str
    """Preset name, e.g. ``"gpt-175b"``."""
    family: str
    """The registered family whose config it sets (``"gpt"``, ``"llama"``, ``"moe"``...)."""
    fields: Mapping[str, object] = field(default_factory=dict)
    """Config fields the preset sets; ``build`` overrides win over these."""
    description: str = ""
    """One line: what the model is and its source."""
    tiny: bool = False
    """A shape for tests and CPU verification (a training step on CPU takes milliseconds);
    listed after every full-size preset."""
