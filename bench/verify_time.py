"""Time ``autopar verify`` end to end on the done-when plans of the execution issues.

    python bench/verify_time.py                                   # rich table
    python bench/verify_time.py --markdown > bench/results/verify.md

Each case runs the command line ``autopar verify --model MODEL ...`` in a fresh interpreter, as
a user would, and reports its wall time (interpreter start, tracing and planning, the ranks'
start-up, the training steps on both sides, comparison), its exit status and the largest
differences it printed. The models: the zoo's tiny presets, a transformers Qwen2-MoE-style
``config.json`` (written to a temporary folder), and ``FILE.py`` decoders of tests/data
(nanoGPT, and nanoMoE's hand-written ``torch.where`` experts). Target: each under 90 s on a
2-core CPU machine.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from machine import machine_lines

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
QWEN2_MOE = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
             "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts_per_tok": 2,
             "max_position_embeddings": 64, "num_experts": 4, "moe_intermediate_size": 32,
             "intermediate_size": 128, "shared_expert_intermediate_size": 128}
"""The Qwen2-MoE shape of ``tests/dist/test_hf_moe_parity.py``."""
CASES = (
    ("tiny-llama", "--dp 2 --tp 2 --nproc 4 --steps 3"),
    ("tiny-llama", "--tp 2 --pp 2 --schedule 1f1b"),
    ("tiny-llama", "--dp 2 --pp 2 --schedule interleaved"),
    ("tiny-llama", "--dp 2 --tp 2 --pp 2 --sequence-parallel --zero 2 --steps 3"),
    ("tiny-moe", "--ep 2 --dp 2 --nproc 4"),
    ("tiny-llama", "--cp 2 --tp 2 --sequence-parallel --nproc 4"),
    ("tiny-llama", "--cp 2 --pp 2"),
    ("qwen2-moe", "--ep 2 --dp 2 --nproc 4 --seq-len 32"),
    ("qwen2-moe", "--cp 2 --tp 2 --sequence-parallel --nproc 4 --seq-len 32"),
    ("qwen2-moe", "--cp 2 --pp 2 --seq-len 32"),
    ("nanomoe.py:make", "--ep 2 --dp 2 --nproc 4"),
    ("nanogpt.py:make", "--cp 2 --tp 2 --sequence-parallel --nproc 4"),
    ("nanogpt.py:make", "--cp 2 --pp 2"),
)
TARGET_S = 90.0


def model_argument(name: str, folder: Path) -> str:
    """What ``--model`` is given for the case's model name."""
    if name == "qwen2-moe":
        (folder / "qwen2-moe").mkdir(exist_ok=True)
        (folder / "qwen2-moe" / "config.json").write_text(json.dumps(QWEN2_MOE))
        return str(folder / "qwen2-moe")
    return str(DATA / name) if ".py:" in name else name


def run(model: str, args: str) -> tuple[float, int, list[str]]:
    cmd = [sys.executable, "-m", "autopar", "verify", "--model", model, *args.split()]
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    values = re.findall(r"│ (loss per step|gradients|parameters)[^│]*│[^│]*│[^│]*│\s*([0-9.e+-]+)",
                        out.stdout)
    return wall, out.returncode, [v for _, v in values]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, case in CASES:
            wall, code, values = run(model_argument(name, Path(folder)), case)
            rows.append((name, case, wall, code, values))
    if args.markdown:
        print("# `autopar verify` wall time\n")
        print("\n".join(machine_lines("python bench/verify_time.py --markdown",
                                      f"torch {torch.__version__}")))
        print(f"\nTarget: under {TARGET_S:.0f} s each. Differences: the loss (relative), the "
              "gradients (over each tensor's largest entry), the parameters (in optimizer "
              "moves), as `autopar verify` prints them. `qwen2-moe`: a transformers "
              "Qwen2-MoE-style config.json (bench/verify_time.py's `QWEN2_MOE`); `*.py:make`: "
              "tests/data.\n")
        print("| model | autopar verify --model MODEL ... | wall s | exit | loss | grads | params |")
        print("|---|---|---|---|---|---|---|")
        for name, case, wall, code, values in rows:
            v = values + ["-"] * (3 - len(values))
            print(f"| {name} | `{case}` | {wall:.1f} | {code} | {v[0]} | {v[1]} | {v[2]} |")
        return
    table = Table(title="autopar verify --model MODEL ...")
    for col in ("model", "flags", "wall s", "exit", "loss", "grads", "params"):
        table.add_column(col)
    for name, case, wall, code, values in rows:
        v = values + ["-"] * (3 - len(values))
        table.add_row(name, case, f"{wall:.1f}", str(code), *v)
    Console().print(table)


if __name__ == "__main__":
    main()
