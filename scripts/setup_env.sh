#!/usr/bin/env bash
# Create .venv (if needed) with the CPU build of torch 2.13.0 and diffmj installed editable, with the
# extras the tests need (dev: pytest; envs: torchrl and gymnasium, which tests/test_envs.py imports;
# examples: tqdm, matplotlib, imageio, whose plots tests/test_examples.py writes).
# A GPU user installs a CUDA build of torch first; diffmj accepts any recent torch.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -c "import torch" 2>/dev/null || python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[dev,envs,examples]"
