"""Building on meta skips the constructors' random fills (``models.init.building_on``): the
shapes, dtypes and parameter objects are those of a plain meta build, a real device still
draws its values, and a planner process that never traces (the trace cache read) does not
pay for torch._dynamo, which the first ``normal_`` on a meta tensor imports."""

from __future__ import annotations

import subprocess
import sys

import torch
from torch import nn

import autopar
from autopar.models.init import building_on


def test_a_meta_build_has_the_plain_meta_build_s_tensors():
    with torch.device("meta"):
        plain = nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 32), nn.LayerNorm(32))
    with building_on("meta"):
        skipped = nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 32), nn.LayerNorm(32))
    assert [(n, p.shape, p.dtype, p.device) for n, p in plain.named_parameters()] == \
        [(n, p.shape, p.dtype, p.device) for n, p in skipped.named_parameters()]
    with building_on("meta"):  # a fill called by hand returns its tensor, as the fill does
        t = torch.empty(3, 4)
        assert nn.init.normal_(t) is t and t.normal_() is t and t.is_meta


def test_a_real_device_still_draws():
    torch.manual_seed(0)
    with building_on("cpu"):
        layer = nn.Embedding(64, 16)
    assert layer.weight.device.type == "cpu" and layer.weight.std() > 0.5


def test_a_meta_build_of_the_zoo_imports_no_dynamo():
    code = ("import sys, autopar\n"
            "m = autopar.models.build('deepseek-v3', device='meta')\n"
            "assert next(m.parameters()).is_meta\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()
    assert out[-1] == "False", out


def test_the_zoo_builds_the_same_model_on_meta():
    model = autopar.models.build("tiny-llama", device="meta")
    real = autopar.models.build("tiny-llama", device="cpu", seed=0)
    assert [(n, p.shape, p.dtype) for n, p in model.named_parameters()] == \
        [(n, p.shape, p.dtype) for n, p in real.named_parameters()]
