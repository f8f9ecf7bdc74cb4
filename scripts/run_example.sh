#!/usr/bin/env bash
# Install what the example needs into .venv, then swing up a cart-pole by iLQR on exact Jacobians.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
python -m pip install --quiet -e ".[examples]"
export MUJOCO_GL="${MUJOCO_GL:-egl}"  # headless rendering; the example skips its video if no backend works
python optim_examples/cartpole_ilqr.py "$@"
