#!/usr/bin/env bash
# Install what the tests need into .venv, then run the default suite (slow tests excluded).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
python -m pytest -q -p no:cacheprovider "$@"
