"""Create the virtual environments of the anchors that cannot share diffmj's.

MJX needs JAX and a MuJoCo 3 release (mujoco-mjx exists only for MuJoCo 3),
and mujoco_torch brings its own dependencies; neither belongs in diffmj's
environment. Each gets a venv under ``benchmarks/.venvs/<name>`` (git-ignored)
with the pinned requirements of ``harness.ANCHOR_ENVS``:

    python benchmarks/setup_anchors.py                 # all anchors
    python benchmarks/setup_anchors.py mjx             # one
    python benchmarks/setup_anchors.py --recreate mjx  # start over

It prints how long each install took and how large the venv is.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from harness import ANCHOR_ENVS, AnchorEnv


def directory_size(path: Path) -> int:
    """Bytes of the regular files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def setup(env: AnchorEnv, recreate: bool) -> None:
    """Create ``env``'s venv (unless it exists) and install its requirements."""
    if recreate and env.venv.exists():
        shutil.rmtree(env.venv)
    start = time.perf_counter()
    if not env.python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(env.venv)], check=True)
    subprocess.run([str(env.python), "-m", "pip", "install", "--quiet", *env.requirements], check=True)
    minutes = (time.perf_counter() - start) / 60
    size_mb = directory_size(env.venv) / 2**20
    print(f"{env.name}: {' '.join(env.requirements)} in {env.venv} "
          f"({minutes:.1f} min, {size_mb:.0f} MB)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("anchors", nargs="*", metavar="ANCHOR",
                        help=f"anchors to set up, of {', '.join(ANCHOR_ENVS)} (default: all)")
    parser.add_argument("--recreate", action="store_true", help="delete and rebuild the venvs")
    args = parser.parse_args()
    unknown = set(args.anchors) - set(ANCHOR_ENVS)
    if unknown:
        parser.error(f"unknown anchors {sorted(unknown)}; choose from {list(ANCHOR_ENVS)}")
    for name in args.anchors or ANCHOR_ENVS:
        setup(ANCHOR_ENVS[name], args.recreate)


if __name__ == "__main__":
    main()
