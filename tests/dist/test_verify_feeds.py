"""``autopar verify --dp 2`` of the transformers models issue 28 found fed wrongly or not at
all: the one-process reference and the ranks call them through one ``autopar.feed`` (a T5's
decoder fed the tokens shifted right, GraniteMoE's cache off through ``**kwargs``, a ViT fed
images and class labels), and the sharded run matches the reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from autopar.cli import main

pytest.importorskip("transformers")

TINY = Path(__file__).resolve().parents[1] / "data" / "hf_tiny"


@pytest.mark.parametrize("name", ["t5", "granitemoe", "vit"])
def test_verify_of_a_transformers_config_passes_at_dp2(name: str, capsys) -> None:
    assert main(["verify", "--model", str(TINY / name), "--dp", "2", "--steps", "2"]) == 0
    assert "PASSED" in capsys.readouterr().out
