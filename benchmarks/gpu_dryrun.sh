#!/usr/bin/env bash
# CPU dry run of benchmarks/gpu_suite.sh the way the GPU call runs it: .whl/ installed with --target into a scratch
# folder, every benchmark started outside the source tree, and an interpreter that sees only the GPU image's
# distributions (benchmarks/gpu_image_packages.txt, as installed here) plus what .whl/ brings, so a wheel missing
# from benchmarks/gpu_wheels.sh fails here first. Every benchmark runs with its CPU smoke flags.
#
#   bash benchmarks/gpu_wheels.sh && bash benchmarks/gpu_dryrun.sh      # run inside the project's venv
#
# Writes suite.log, suite.json and suite.tgz under $OUT (default: a fresh folder in /tmp, printed at the end).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROOT=$(mktemp -d /tmp/omni-dryrun.XXXXXX)
ENV=$ROOT/image-env
python3 -m venv --without-pip "$ENV"
python3 - "$REPO/benchmarks/gpu_image_packages.txt" "$ENV" <<'PY'
"""Link into ENV's site-packages the installed distributions that the GPU image also has (top-level entries)."""
import importlib.metadata as md
import re
import sys
import sysconfig
from pathlib import Path

def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()

wanted = {norm(l) for l in Path(sys.argv[1]).read_text().split("\n") if l.strip() and not l.startswith("#")}
env = Path(sys.argv[2])
site = next(env.glob("lib/python3*/site-packages"))
seen, linked = set(), []
for dist in md.distributions():
    name = norm(dist.metadata["Name"] or "")
    if name not in wanted or name in seen or not dist.files:
        continue
    seen.add(name)
    base = Path(dist.locate_file(""))
    for top in {f.parts[0] for f in dist.files if f.parts and f.parts[0] != ".."}:
        src, dst = base / top, site / top
        if src.exists() and not dst.exists():
            dst.symlink_to(src)
    linked.append(name)
print(f"image env: {len(linked)} of {len(wanted)} image distributions installed here are visible;"
      f" not here: {', '.join(sorted(wanted - seen)[:12])}, ...")
PY
# .whl/ holds CPython 3.12 builds; the same versions built for this interpreter stand in for the binary ones.
WHL=$ROOT/whl
mkdir -p "$WHL"
cp -a "$REPO/.whl/." "$WHL/"
tag=cp$(python3 -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
if [[ $tag != cp312 ]]; then
  for w in "$WHL"/*-cp312-*.whl; do
    [[ -e $w ]] || continue
    spec=$(basename "$w" | cut -d- -f1,2 | sed 's/-/==/')
    rm "$w"
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$WHL" "$spec" 2>&1 | grep -v "is ignored" || true
  done
fi
export PATH=$ENV/bin:$PATH
t0=$SECONDS
SUITE_SMOKE=1 SUITE_SITE=$ROOT/site SUITE_WHEELS=$WHL OUT=${OUT:-$ROOT/out} bash "$REPO/benchmarks/gpu_suite.sh" && rc=0 || rc=$?
echo "dry run: rc $rc in $((SECONDS - t0)) s; files in ${OUT:-$ROOT/out}"
exit $rc
