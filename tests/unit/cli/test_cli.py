"""The command line: reports print, and bad input exits with status 2 and one clear paragraph."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autopar.cli.main import main

UNTRACEABLE = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 16)

        def forward(self, x):
            if x.sum() > 0:          # data-dependent control flow
                return self.proj(x)
            return x

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(32, 16)
            self.gate = Gate()
            self.head = nn.Linear(16, 32)

        def forward(self, tokens, targets=None):
            logits = self.head(self.gate(self.emb(tokens)))
            return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def make():
        return Net()
''')


def test_estimate_prints_the_breakdowns(capsys) -> None:
    code = main(["estimate", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80g", "--nodes", "4",
                 "--global-batch", "512", "--tp", "2", "--checkpoint", "selective"])
    out = capsys.readouterr().out
    assert code == 0
    for needle in ("Memory per GPU", "Time per step", "optimizer", "comm_tp", "MFU"):
        assert needle in out


def test_models_and_clusters_list(capsys) -> None:
    assert main(["models"]) == 0
    assert "llama3-405b" in capsys.readouterr().out
    assert main(["clusters"]) == 0
    assert "hgx-h100-80g" in capsys.readouterr().out


def _error(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    return err


def test_world_size_mismatch_exits_2(capsys) -> None:
    err = _error(capsys, ["estimate", "--model", "tiny-gpt", "--cluster", "dgx-a100-80g",
                          "--global-batch", "8", "--dp", "2", "--tp", "2"])
    assert "dp*tp*pp*cp" in err and "the cluster has 8" in err


def test_ep_must_divide_dp_cp(capsys) -> None:
    err = _error(capsys, ["estimate", "--model", "tiny-moe", "--cluster", "dgx-a100-80g",
                          "--global-batch", "8", "--ep", "3"])
    assert "ep=3" in err


@pytest.mark.parametrize(("flags", "dp", "read_as_replicas"), [
    ({"dp": 2, "ep": 2}, 4, True),            # ep x dp = 4 GPUs: dp counts the expert replicas
    ({"dp": 4, "ep": 2}, 4, False),           # dp x tp x pp x cp = 4: as given
    ({"dp": 2, "ep": 2, "tp": 2}, 2, False),  # fills the 4 GPUs as given
])
def test_dp_beside_ep_counts_expert_replicas_only_when_that_fills_the_gpus(
        flags: dict, dp: int, read_as_replicas: bool) -> None:
    from autopar.cli.args import config_from_fields, expert_dp_note

    config = config_from_fields(flags, 4, "--nproc")
    assert config.dp == dp and config.ep == 2
    note = expert_dp_note(flags, config)
    assert (note is not None) == read_as_replicas
    if read_as_replicas:
        assert "dp 4 with ep 2" in note


def test_dp_beside_ep_that_does_not_fill_the_gpus_is_taken_as_given(capsys) -> None:
    """dp 1 x ep 2 is not 8 GPUs either way: the ep-in-dp error, not a silent doubling."""
    err = _error(capsys, ["estimate", "--model", "tiny-moe", "--cluster", "dgx-a100-80g",
                          "--global-batch", "8", "--dp", "1", "--ep", "2"])
    assert "ep=2" in err


def test_unknown_model_and_cluster_exit_2(capsys) -> None:
    assert "gpt-17b" in _error(capsys, ["estimate", "--model", "gpt-17b", "--cluster",
                                        "dgx-a100-80g", "--global-batch", "8"])
    assert "dgx-z100" in _error(capsys, ["estimate", "--model", "tiny-gpt", "--cluster",
                                         "dgx-z100", "--global-batch", "8"])


@pytest.mark.parametrize(("body", "field"), [
    ("name: x\nnodes: 1\ngpus_per_node: 8\ngpu: A100-SXM4-80GB\nintra_node: NVLink3\n"
     "inter_node: IB-HDR-200G\nhost_memory_bytes: 1e12\n", "host_link"),
    ("base: dgx-a100-80g\ninter_node: {bytes_per_s: -25e9, latency_s: 4e-6}\n",
     "inter_node.bytes_per_s"),
])
def test_bad_cluster_file_names_the_field(capsys, tmp_path: Path, body: str, field: str) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(body)
    err = _error(capsys, ["estimate", "--model", "tiny-gpt", "--cluster-file", str(path),
                          "--global-batch", "8"])
    assert field in err


def test_untraceable_model_names_module_and_line(tmp_path: Path) -> None:
    path = tmp_path / "net.py"
    path.write_text(UNTRACEABLE)
    proc = subprocess.run(
        [sys.executable, "-m", "autopar", "estimate", "--model", f"{path}:make",
         "--cluster", "dgx-a100-80g", "--global-batch", "8", "--seq-len", "16"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "gate" in proc.stderr and "net.py:11" in proc.stderr
