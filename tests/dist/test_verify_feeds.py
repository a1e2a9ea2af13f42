"""``autopar verify --dp 2`` of the transformers models issue 28 found fed wrongly or not at
all: the one-process reference and the ranks call them through one ``autopar.models.feed`` (a T5's
decoder fed the tokens shifted right, GraniteMoE's cache off through ``**kwargs``, a ViT fed
images and class labels), and the sharded run matches the reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from autopar.cli.main import main
from autopar.verify.run import verify
from autopar.verify.models import transformers_spec

from plans import process_plan

pytest.importorskip("transformers")

VIT = Path(__file__).resolve().parents[1] / "data" / "vit"


@pytest.mark.parametrize("model", ["t5", "granite-moe"])
def test_verify_of_a_transformers_config_passes_at_dp2(model: str) -> None:
    spec = transformers_spec(model)
    result = verify(spec, process_plan(spec, dict(dp=2, micro_batch=1), 4), steps=2)
    assert result.passed, result.table()


def test_verify_of_a_vit_folder_on_the_command_line_passes_at_dp2(capsys) -> None:
    # the sequence is the ViT's own (16 patches and the class token): no --seq-len needed
    assert main(["verify", "--model", str(VIT), "--dp", "2", "--steps", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "PASSED" in out and "x 17 tokens" in out
