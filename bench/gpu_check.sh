#!/usr/bin/env bash
# The GPU check (issue 35): one command for a lent GPU, about 5 minutes on one H100, at most
# 510 s of part budgets. Everything it finds goes under $OUT (or --out DIR): gpu-<kind>.md,
# gpu-<kind>.json, gpu-<kind>.log and profile-<kind>.json, kind h100 or h200.
#
# A session that is lent a GPU runs it before anything else:
#   1. here, on the CPU machine, in the checkout's root (the one the session started in: the
#      device tool sends that one):
#        bash bench/gpu_check.sh --fetch      # the pinned wheels into .whl/ (PyPI; seconds)
#        bash bench/gpu_check.sh --dry        # the whole check without a GPU (about a minute)
#   2. the device call, once:
#        run(command="bash bench/gpu_check.sh", carry=[".whl"], timeout_s=570)
#      then copy gpu-<kind>.md and profile-<kind>.json from files_at into bench/results/,
#      commit them, and compare them in the session's note with the predictions
#      (bench/results/gpu-check-dry.md has them at the same shapes, made on the CPU).
#   3. a part that failed for a reason fixed here can run again alone on a warm machine:
#        run(command="bash bench/gpu_check.sh --only 4", carry=[".whl"], timeout_s=300)
#      (part 1's install always runs first; its tests/gpu only when 1 is named).
#
# Parts and budgets (bench/gpu_check.py's PARTS; a part may use what earlier parts left):
#   1 environment, wheels, autopar's wheel, pytest tests/gpu    70 s
#   2 bench/fused_kernels.py and bench/fp8_linear.py (vs copy, eager) 150 s
#   3 autopar profile --nproc 1 --device cuda                    60 s
#   4 bench/gpu_step.py (1B Llama step vs estimate, dry run)    150 s
#   5 autopar verify --device cuda, three dp = 1 plans           80 s
# A failing part is a result: the next part runs and the results are rewritten after each.
# Exit status: 0 when no part failed, 1 when one did, 2 when it could not start.
#
#   bash bench/gpu_check.sh [--out DIR] [--only N,M]   on a machine with a CUDA GPU
#   bash bench/gpu_check.sh --dry [--out DIR]          on a CPU machine (CI runs this)
#   bash bench/gpu_check.sh --fetch                    the wheels, before a GPU session
# PYTHON picks the interpreter (default python3: on the device machine, the one with torch).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" bench/gpu_check.py "$@"
