#!/usr/bin/env bash
# Install what the example needs into .venv, then optimise a trajectory through contact.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
python optim_examples/push_box.py "$@"
