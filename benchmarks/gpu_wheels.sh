#!/usr/bin/env bash
# Fill .whl/ (git-ignored) with what the GPU image lacks for benchmarks/gpu_suite.sh, and this package as a wheel.
#
#   bash benchmarks/gpu_wheels.sh     # in the repository, after every change to the tree (~10 s once cached)
#
# The GPU image (Python 3.12, torch 2.11, transformers 5.17, huggingface_hub 1.33, pillow, httpx, anyio, h11,
# click, zipp, ...: benchmarks/gpu_image_packages.txt) reaches no registry, so the missing packages travel as
# wheels, fetched here with --no-deps for CPython 3.12 on x86-64 Linux; each dependency the image lacks is named.
# silero-vad travels as its Python files and the one model file the server's VAD loads (silero_vad.jit), unpacked
# into .whl/site/ (the whole wheel is 11 MB of models in five formats). Smart Turn (semantic_vad) travels as the one
# file it needs from pipecat-ai's wheel, .whl/site/pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx, with
# pipecat's licence (no pipecat code: the model file is found, never imported; the image has onnxruntime).
# .whl/COMMIT records the tree's commit.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .whl

# serving (starlette, uvicorn, websockets, python-multipart), codecs (soundfile + cffi + pycparser, av, lameenc),
# settings paths (platformdirs), image and video models (diffusers; on Python 3.12 it reads the standard library's
# importlib.metadata, so its importlib_metadata requirement stays behind; Helios' prompt cleaning: ftfy + wcwidth;
# greenlet: an image or video request's pipeline call runs a model call at a time on the device worker),
# remote text models (httpx-sse: the text families' module imports it), constrained decoding (llguidance: one
# abi3 wheel for glibc 2.31 and later, hence that platform tag), and for the `-m gpu` tests the plugin
# that runs their `async def` tests (pytest-asyncio: the image has pytest but not it, and pytest fails an async
# test it cannot run).
# httptools: uvicorn's C HTTP parser (serve --http auto picks it when installed; tts_load.py --arm compares it with
# h11). The peers of benchmarks/peers (run_peers.py: faster-qwen3-tts, the reference qwen-tts-hf, and what they
# import beyond the image: benchmarks/peers/README.md).
wheels=(
  starlette==1.10.0 uvicorn==0.54.0 websockets==17.4 python-multipart==0.0.34 platformdirs==4.14.8
  soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 av==18.1.0 lameenc==1.9.0
  diffusers==0.42.1 ftfy==6.3.1 wcwidth==0.9.4 greenlet==3.5.6 httpx-sse==0.4.3 pytest-asyncio==1.5.0
  llguidance==1.9.1 httptools==0.9.0
  faster-qwen3-tts==0.5.4 qwen-tts-hf==0.1.1.post1 sox==1.4.1 librosa==0.11.0 audioread==3.1.0 decorator==5.3.1
  pooch==1.9.0 soxr==1.1.0
)
SILERO=silero-vad==6.2.3
PIPECAT=pipecat-ai==1.14.0
SMART_TURN=pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx

download() {  # download DIR SPEC...
  local dir=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_31_x86_64 \
    -d "$dir" "$@" 2>&1 | grep -v "is ignored" || true
}

need=()
for w in "${wheels[@]}"; do
  stem=$(echo "${w%%==*}" | tr '-' '_'); version=${w##*==}
  compgen -G ".whl/${stem}-${version}-*.whl" >/dev/null || need+=("$w")
done
((${#need[@]} == 0)) || download .whl "${need[@]}"
for w in "${wheels[@]}"; do
  stem=$(echo "${w%%==*}" | tr '-' '_')
  compgen -G ".whl/${stem}-${w##*==}-*.whl" >/dev/null || { echo "missing wheel: $w" >&2; exit 1; }
  n=$(compgen -G ".whl/${stem}-*.whl" | wc -l)
  ((n == 1)) || { echo "several versions of $stem in .whl/: keep one" >&2; exit 1; }
done

if [[ ! -f .whl/site/silero_vad/data/silero_vad.jit ]]; then
  tmp=$(mktemp -d)
  download "$tmp" "$SILERO"
  rm -rf .whl/site/silero_vad && mkdir -p .whl/site
  python3 - "$tmp"/silero_vad-*.whl .whl/site <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    keep = [n for n in z.namelist()
            if n.startswith("silero_vad/") and (n.endswith(".py") or n == "silero_vad/data/silero_vad.jit")]
    z.extractall(dest, keep)
    licence = next(n for n in z.namelist() if n.endswith("/licenses/LICENSE"))
    with open(f"{dest}/silero_vad/LICENSE", "wb") as f:  # MIT: the notice travels with the files
        f.write(z.read(licence))
PY
  rm -rf "$tmp"
fi

if [[ ! -f .whl/site/$SMART_TURN ]]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$tmp" "$PIPECAT" 2>&1 | grep -v "is ignored" || true
  python3 - "$tmp"/pipecat_ai-*.whl .whl/site "$SMART_TURN" <<'PY'
import sys, zipfile
wheel, dest, model = sys.argv[1], sys.argv[2], sys.argv[3]
with zipfile.ZipFile(wheel) as z:
    z.extract(model, dest)
    licence = next(n for n in z.namelist() if n.endswith("licenses/LICENSE"))
    with open(f"{dest}/pipecat/LICENSE", "wb") as f:  # BSD-2-Clause: the notice travels with the file
        f.write(z.read(licence))
PY
  rm -rf "$tmp"
fi

rm -f .whl/omni_stream-*.whl
# setuptools >= 77 builds it (PEP 639 license); with an older one in the venv it builds in an isolated environment
python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl . 2>/dev/null || python3 -m pip wheel -q --no-deps -w .whl .
commit=$(git rev-parse HEAD)
[[ -z "$(git status --porcelain)" ]] || commit+="+uncommitted"
echo "$commit" > .whl/COMMIT

echo ".whl/: $(du -sh .whl | cut -f1) ($(ls .whl/*.whl | wc -l) wheels); commit $commit"
echo "tracked tree: $(git ls-files -z | du -ch --files0-from=- | tail -1 | cut -f1); untracked, not ignored:" \
  "$(git ls-files -z --others --exclude-standard | du -ch --files0-from=- 2>/dev/null | tail -1 | cut -f1)"
