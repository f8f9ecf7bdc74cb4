#!/usr/bin/env bash
# Gather the census's model collections into DEST (default /tmp/census/models), outside the repository:
# the MJCF files that public Python packages ship, unpacked from their wheels (pip download, no
# dependencies, nothing installed), and optionally two git checkouts:
#
#   bash benchmarks/census_models.sh [DEST] [MUJOCO_CHECKOUT] [MENAGERIE_CHECKOUT]
#
# MUJOCO_CHECKOUT: a clone of google-deepmind/mujoco (its model/ folder is used);
# MENAGERIE_CHECKOUT: a clone of google-deepmind/mujoco_menagerie (or a fork of it).
# It prints the census command for what it gathered.
set -euo pipefail
dest="${1:-/tmp/census/models}"
mujoco_checkout="${2:-}"
menagerie_checkout="${3:-}"
python="${PYTHON:-python}"

# collection name -> pinned package (the versions of the census in benchmarks/README.md)
packages=(
  "dm_control dm-control==1.0.50"
  "gymnasium gymnasium==1.4.0"
  "gymnasium_robotics gymnasium-robotics==1.4.2"
  "brax brax==0.14.2"
  "playground playground==0.2.0"
  "ogbench ogbench==1.2.2"
  "safety_gymnasium safety-gymnasium==1.0.0"
  "robosuite robosuite==1.5.2"
  "metaworld metaworld==3.1.1"
  "myo_sim myo-sim==0.2.4"
  "mjlab mjlab==1.6.0"
  "dm_robotics_panda dm-robotics-panda==0.4.8"
)

mkdir -p "$dest/wheels"
folders=()
for entry in "${packages[@]}"; do
  read -r name requirement <<<"$entry"
  wheels="$dest/wheels/$name"
  "$python" -m pip download --quiet --no-deps --only-binary=:all: -d "$wheels" "$requirement"
  rm -rf "${dest:?}/$name" && mkdir -p "$dest/$name"
  "$python" -m zipfile -e "$wheels"/*.whl "$dest/$name"
  folders+=("$name=$dest/$name")
done
if [ -n "$mujoco_checkout" ]; then
  rm -rf "$dest/mujoco_model" && cp -r "$mujoco_checkout/model" "$dest/mujoco_model"
  folders+=("mujoco_model=$dest/mujoco_model")
fi
if [ -n "$menagerie_checkout" ]; then
  rm -rf "$dest/menagerie" && cp -r "$menagerie_checkout" "$dest/menagerie"
  folders+=("menagerie=$dest/menagerie")
fi
echo "python benchmarks/census.py ${folders[*]}"
