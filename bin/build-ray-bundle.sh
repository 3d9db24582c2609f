#!/usr/bin/env bash
# Builds Ray (the PyPI wheel pinned in constraints.txt) for the H200 GPU machines, which have
# Python 3.12 and no package registry (../shared/gpu/README.md ships vLLM the same way), into
# one xz part of at most 60 MiB: .ship_ray/ray.tar.xz at the project root (git-ignored). Unpacked there with `tar -C /tmp/raysite -xJf .ship_ray/ray.tar.xz`
# (bin/gpu-run's ray-unpack step does it) and put on PYTHONPATH.
#
# Shipped besides Ray: jsonschema and its dependencies (not in the machines' image; the vLLM
# bundle has the same versions). Ray's other dependencies (click, filelock, msgpack,
# packaging, protobuf, pyyaml, requests) are in the image. Left out of Ray: the Java jars,
# the dashboard's web client and RLlib (a campaign starts its cluster without a dashboard).
# Seen working 2026-12-01: a --ray campaign on a local cluster with Python 3.12 and only the
# image's packages besides these (tests: see the note in bench/bench_ray.py).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
W=${W:-/tmp/ray-gpu-bundle}
SHIP=${SHIP:-$root/.ship_ray}
RAY=$(grep -i '^ray==' "$root/constraints.txt")
DEPS="$RAY jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1"
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 --platform any"
for n in $(seq 17 39); do PLAT="$PLAT --platform manylinux_2_${n}_x86_64"; done
mkdir -p "$W/whl"
python3 -m pip download -q --no-deps $PLAT -d "$W/whl" $DEPS
rm -rf "$W/site"
python3 -m pip install -q --no-deps --no-compile --target "$W/site" $PLAT "$W/whl"/*.whl
rm -rf "$W/site/bin" "$W/site/ray/jars" "$W/site/ray/dashboard/client/build" "$W/site/ray/rllib"
find "$W/site" -name __pycache__ -prune -exec rm -rf {} +
du -sh "$W/site"
mkdir -p "$SHIP"; rm -f "$SHIP"/*
(cd "$W/site" && tar -cf - . | xz -T0 -9 > "$SHIP/ray.tar.xz")
[ "$(stat -c %s "$SHIP/ray.tar.xz")" -le $((60*1024*1024)) ] || { echo "part too big: $SHIP/ray.tar.xz"; exit 1; }
ls -la "$SHIP"
echo "bundle ready: $SHIP/ray.tar.xz ($RAY)"
