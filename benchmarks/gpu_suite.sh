#!/usr/bin/env bash
# Every GPU benchmark in one call of a few minutes, each with a time cap, results packed under $OUT.
#
# Device command (nvidia-h200; carry [".whl"]; timeout_s 600), after `bash benchmarks/gpu_wheels.sh` here:
#
#   bash benchmarks/gpu_suite.sh
#
# It installs .whl/ into /tmp/site (the package too: the source tree's omni_stream/ lacks realtime/ and codecs/,
# so every benchmark runs from a scratch folder outside it), then runs, cheapest and most important first
# (expected seconds on one H200, mostly model build, graph capture and server start; cap):
#
#   tts    ~65 / 150  tts_bench.py --size 1.7b --transport http --levels 1,32 (150 frames a request, as run 8)
#   text   ~45 / 110  text_bench.py: Qwen3-0.6B, TTFT and tok/s at c = 1, 4, 16, 32, 64, 256 tokens
#   grammar ~40 / 90  constrained_bench.py --gpu: Qwen3-0.6B decode step, grammar-constrained rows against free
#                     rows at batch 1 and 64 (64 steps each)
#   asr    ~40 / 100  asr_bench.py --from-config whisper-large-v3-turbo --device cuda, c = 1, 4, 16, 32
#   chat   ~75 / 130  chat_bench.py: /v1/chat/completions, Qwen3-0.6B -> Qwen3-TTS 0.6B, c = 1, 4, 16
#   voice  ~80 / 170  voice_bench.py --build dummy: WS /v1/realtime, semantic_vad (Silero + Smart Turn), Whisper
#                     turbo, Qwen3-0.6B, Qwen3-TTS 0.6B, 1, 16, 32 sessions at once, cold and warm, engine batch 32
#                     (the whole matrix: voice_bench.py's docstring, one call per turn detection)
#   image  ~45 / 120  image_bench.py --device cuda: InstructPix2Pix 512 px, 20 steps, c = 1, 4, 16
#   video  ~95 / 180  video_bench.py --gpu: Helios-Base (~38 GB), 320x192, 2 chunks, c = 1, 2, 4, 8
#
# Each gets min(its cap, what is left of SUITE_BUDGET_S) and is skipped when less than it needs is left; `timeout`
# signals its whole process group (the benchmark and any server it started). What comes back ($OUT, 3 files):
# suite.log (this output), suite.json (status of each benchmark and every result JSON inside), suite.tgz
# (results/*.json and logs/*.log), repacked after every benchmark so a cut-off call still returns what finished.
#
# Environment: SUITE_SMOKE=1 (every benchmark's CPU smoke flags: the dry run, benchmarks/gpu_dryrun.sh),
# SUITE_ONLY=tts,chat (a subset, in suite order), SUITE_BUDGET_S (default 550 on the GPU: the call's 600 s less
# a margin), SUITE_SITE (default /tmp/site), SUITE_WHEELS (default .whl), GIT_COMMIT (default: .whl/COMMIT,
# written by gpu_wheels.sh).
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=$REPO/benchmarks
SMOKE=${SUITE_SMOKE:-0}
SITE=${SUITE_SITE:-/tmp/site}
OUT=${OUT:-/tmp/omni-stream-suite}
BUDGET=${SUITE_BUDGET_S:-$([[ $SMOKE == 1 ]] && echo 1500 || echo 550)}
ONLY=${SUITE_ONLY:-}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/omni-suite.XXXXXX)
mkdir -p "$WORK/results" "$WORK/logs" "$WORK/cache"
exec > >(tee -a "$OUT/suite.log") 2>&1

stamp() { printf '[%4ds] %s\n' "$SECONDS" "$*"; }

# --- install -------------------------------------------------------------------------------------------------
WHEELS=${SUITE_WHEELS:-$REPO/.whl}
stamp "install $WHEELS into $SITE"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
  "$WHEELS"/*.whl > "$WORK/logs/install.log" 2>&1 || { cat "$WORK/logs/install.log"; stamp "install failed"; exit 1; }
[[ -d "$WHEELS/site" ]] && cp -a "$WHEELS/site/." "$SITE/"
export PYTHONPATH=$SITE PYTHONUNBUFFERED=1
export GIT_COMMIT=${GIT_COMMIT:-$(cat "$WHEELS/COMMIT" 2>/dev/null || echo unknown)}
# Nothing can be fetched there: fail fast instead of waiting on the hub. The cache keeps embedded checkpoints out.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 OMNI_STREAM_CACHE=$WORK/cache
cd "$WORK" || exit 1

python3 - "$SITE" "$SMOKE" <<'PY' || { stamp "preflight failed"; exit 1; }
import sys, platform
site, smoke = sys.argv[1], sys.argv[2] == "1"
import torch, transformers
import omni_stream, omni_stream.realtime, omni_stream.codecs
for mod in (omni_stream, omni_stream.realtime, omni_stream.codecs):
    assert mod.__file__.startswith(site), f"{mod.__name__} imported from {mod.__file__}, not {site}"
cuda = torch.cuda.is_available()
print(f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
      f"cuda {torch.cuda.get_device_name() if cuda else None}, omni_stream from {omni_stream.__file__}")
if not smoke and not cuda:
    sys.exit("no CUDA device (SUITE_SMOKE=1 runs the CPU smoke flags)")
PY
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
stamp "GIT_COMMIT=$GIT_COMMIT"

# --- the benchmarks ------------------------------------------------------------------------------------------
STATUS=$WORK/status.tsv
: > "$STATUS"

pack() {
  python3 "$B/gpu_suite_report.py" "$STATUS" "$WORK/results" "$WORK/suite.json" --quiet
  cp "$WORK/suite.json" "$OUT/suite.json"
  tar czf "$OUT/suite.tgz.part" -C "$WORK" results logs status.tsv suite.json && mv "$OUT/suite.tgz.part" "$OUT/suite.tgz"
}

# bench NAME CAP_S NEED_S SCRIPT ARGS...: run one benchmark under min(CAP_S, budget left); skip below NEED_S.
bench() {
  local name=$1 cap=$2 need=$3; shift 3
  if [[ -n "$ONLY" && ",$ONLY," != *",$name,"* ]]; then return; fi
  local left=$((BUDGET - SECONDS - 5)) limit=$cap
  ((left < limit)) && limit=$left
  if ((limit < need)); then
    stamp "$name: skipped (${left} s left, needs ${need} s)"
    printf '%s\tskipped\t-\t0\t%s\n' "$name" "$cap" >> "$STATUS"
    pack
    return
  fi
  stamp "$name: start (limit ${limit} s): $*"
  local t0=$SECONDS rc
  OUT=$WORK/results timeout -k 10 "$limit" python3 "$@" > "$WORK/logs/$name.log" 2>&1
  rc=$?
  local wall=$((SECONDS - t0)) state=ok
  ((rc == 124 || rc == 137)) && state=timeout
  ((rc != 0 && rc != 124 && rc != 137)) && state=failed
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$state" "$rc" "$wall" "$limit" >> "$STATUS"
  stamp "$name: $state (rc $rc) in ${wall} s; last lines:"
  grep -v -e "it/s\]" -e "s/it\]" -e "part/s\]" "$WORK/logs/$name.log" | tail -n 12 | cut -c1-240 | sed 's/^/    /'
  pack
}

if [[ $SMOKE == 1 ]]; then
  bench tts   300 30 "$B/tts_bench.py" --device cpu --tiny --size 1.7b --levels 1,2 --frames 6 --transport http
  bench text  200 20 "$B/text_bench.py" --smoke
  bench grammar 200 20 "$B/constrained_bench.py" --smoke
  bench asr   200 20 "$B/asr_bench.py" --smoke
  bench chat  300 30 "$B/chat_bench.py" --smoke
  bench voice 400 60 "$B/voice_bench.py" --build tiny --smoke --turns semantic_vad --arrivals at-once
  bench image 200 20 "$B/image_bench.py" --smoke
  bench video 200 20 "$B/video_bench.py" --smoke --transport inproc
else
  bench tts   150 70 "$B/tts_bench.py" --size 1.7b --transport http --levels 1,32
  bench text  110 40 "$B/text_bench.py"
  bench grammar 90 40 "$B/constrained_bench.py" --gpu
  bench asr   100 40 "$B/asr_bench.py" --from-config "$B/configs/whisper-large-v3-turbo" --device cuda
  bench chat  130 60 "$B/chat_bench.py"
  bench voice 170 80 "$B/voice_bench.py" --build dummy --device cuda --levels 1,16,32 --max-batch 32 \
    --turns semantic_vad --arrivals at-once
  bench image 120 50 "$B/image_bench.py" --device cuda
  bench video 180 80 "$B/video_bench.py" --gpu
fi

stamp "done"
python3 "$B/gpu_suite_report.py" "$STATUS" "$WORK/results" "$WORK/suite.json"
pack
awk -F'\t' '$2 != "ok" { bad = 1 } END { exit bad }' "$STATUS"
