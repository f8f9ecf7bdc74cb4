#!/usr/bin/env bash
# Install what the example needs into .venv, then swing up a cart-pole by iLQR on exact Jacobians.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
python optim_examples/cartpole_ilqr.py "$@"
