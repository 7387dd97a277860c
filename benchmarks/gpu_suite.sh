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
#   voice ~150 / 230  voice_bench.py --build dummy: WS /v1/realtime, semantic_vad (Silero + Smart Turn: CUDA graphs
#                     on the GPU; OMNI_STREAM_TURN_MODEL_DEVICE=cpu before the command: onnxruntime), Whisper
#                     turbo, Qwen3-0.6B, Qwen3-TTS 0.6B, 1, 16, 32 sessions at once, cold and warm, engine batch 32
#                     (the whole matrix: voice_bench.py's docstring, one call per turn detection);
#                     SUITE_VOICE_LEVELS=16,32, SUITE_VOICE_ARGS="--rounds 3" (more warm rounds) and SUITE_VOICE_CAP
#                     (seconds, for the whole matrix) change it; the JSON is rewritten after every level
#   image  ~45 / 120  image_bench.py --device cuda: InstructPix2Pix 512 px, 20 steps, c = 1, 4, 16
#   video  ~95 / 180  video_bench.py --gpu: Helios-Base (~38 GB), 320x192, 2 chunks, c = 1, 2, 4, 8
#
# Speech under open-loop load (tts_load.py), voice cloning and the talker's levers: only when named in SUITE_ONLY, as
# one device call each (expected seconds on one H200: server or engine start ~80, then the levels; cap):
#
#   load_cv         ~290 / 420  CustomVoice, Poisson 5-80 /s x 12 s, lengths 2-20 s, HTTP then WebSocket
#   load_fixed      ~270 / 330  the same at 12 s every request (as the bursts), then bursts c = 1, 32, 128 (150 frames)
#   peers           ~110 / 150  run_peers.py --systems faster: faster-qwen3-tts beside our c=1 (after load_fixed)
#   load_base_ws    ~330 / 420  Base: clone, voice, clone-xvec, voice-xvec at 5-40 /s over WebSocket, bursts c = 1, 64
#   load_base_http  ~200 / 240  Base: clone, voice at 5-40 /s over HTTP, bursts c = 1, 64
#   levers_base     ~190 / 240  in process, Base clone (8 references): default, prefill_budget, voice_cache
#   levers_cv       ~340 / 420  in process, CustomVoice: default, admit_after_collect, first_window_wait_ms, both,
#                               step_ahead off, taking turns at 5-40 /s on one engine; bursts c = 1, 32 per arm
#   load_http       ~330 / 420  two servers: uvicorn's h11 against httptools, HTTP and WebSocket at 10-40 /s
#
# colocation      ~450 / 545  colocation_bench.py --gpu --scenarios mixed --transports ws --levels 32: speech c=32,
#                               agents, 4 image edits, 2 video sessions, alone, together and 0.3 s apart, on one server
#                               (only when named, as a call of its own: the server starts in ~100 s); each scenario
#                               also prints what the device worker ran until the speech streams' first audio;
#                               SUITE_COLOCATION_ARGS="--tune realtime_priority=on --tag _prio": an A/B arm
# gputests        ~330 / 545  the -m gpu tests (test_causal_lm_gpu, test_qwen3_codec_kernels, test_qwen3_codec_stream,
#                               test_qwen3_gpu, test_whisper_gpu, test_smart_turn_gpu, test_worker_streams_gpu,
#                               test_image_noise),
#                               from a copy of tests/ (only when named; run 29: 280 s
#                               covered 24 of 31; SUITE_GPUTESTS="test_causal_lm_gpu.py ..." runs those files only)
# unet_levers     ~185 / 300  unet_levers.py: InstructPix2Pix's UNet at 3 and 48 rows under each lever (attention
#                               kernels, NHWC, fused q/k/v, torch.compile) and its VAE (only when named);
#                               SUITE_UNET_ARGS="--levers compile_dynamic --rows 3,24,48": one graph for every batch
#
#   calls: SUITE_ONLY=load_cv | load_fixed,peers | load_base_ws | load_base_http,levers_base | levers_cv | load_http
#          | colocation | gputests
#
# Each gets min(its cap, what is left of SUITE_BUDGET_S) and is skipped when less than it needs is left; `timeout`
# signals its whole process group (the benchmark and any server it started). What comes back ($OUT, 3 files):
# suite.log (this output), suite.json (status of each benchmark and every result JSON inside), suite.tgz
# (results/*.json and logs/*.log), repacked after every benchmark so a cut-off call still returns what finished.
#
# load_cv's transports, rates and seconds per rate: SUITE_LOAD_TRANSPORTS=ws, SUITE_LOAD_RATES=20,40,
# SUITE_LOAD_DURATION=8 (defaults: http,ws; 5,10,20,40,80; 12).
# levers_cv's arms and rates: SUITE_LEVERS_CV="default: admit:admit_after_collect=on" (retune specs, space-separated)
# and SUITE_LEVERS_RATES=20,40 (default: every arm above at 5,10,20,40).
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
# named NAME ...: the same, for a benchmark that runs only when SUITE_ONLY names it.
named() {
  if [[ ",$ONLY," == *",$1,"* ]]; then bench "$@"; fi
}
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

LOAD=("$B/tts_load.py")
LEVERS_CV=(--retune default: --retune admit:admit_after_collect=on --retune wait:first_window_wait_ms=3
  --retune both:admit_after_collect=on,first_window_wait_ms=3 --retune sync:step_ahead=off)
if [[ -n ${SUITE_LEVERS_CV:-} ]]; then  # a subset of arms, e.g. "default: admit:admit_after_collect=on"
  LEVERS_CV=()
  for arm in $SUITE_LEVERS_CV; do LEVERS_CV+=(--retune "$arm"); done
fi
LEVERS_RATES=${SUITE_LEVERS_RATES:-5,10,20,40}
LEVERS_BASE=(--voice-mode clone --ref-pool 8 --retune default: --retune budget:prefill_budget=128
  --retune cache:voice_cache=64)
BASE_MODES=(--voice-mode clone,voice,clone-xvec,voice-xvec)
PARSERS=(--arm h11:--http=h11 --arm httptools:--http=httptools)
if [[ $SMOKE == 1 ]]; then
  TINY=(--device cpu --tiny --size 1.7b --server-timeout 300)
  named load_cv        400 30 "${LOAD[@]}" "${TINY[@]}" --transport http,ws --rates 3,6 --duration 1.5 --lengths 0.4-0.8
  named load_fixed     400 30 "${LOAD[@]}" "${TINY[@]}" --transport ws,http --rates 3 --duration 1.5 --lengths 0.48 \
    --bursts 1,2 --burst-frames 4
  if [[ ",$ONLY," == *",peers,"* ]]; then
    python3 -m omni_stream.cli make-checkpoint --tiny --size 1.7b "$WORK/tiny-ckpt" > "$WORK/logs/tiny-ckpt.log" 2>&1
  fi
  named peers          300 20 "$B/peers/run_peers.py" --checkpoint "$WORK/tiny-ckpt" --tag tiny-1.7b --device cpu \
    --frames 4 --reps 1 --stream-reps 1
  named load_base_ws   500 30 "${LOAD[@]}" "${TINY[@]}" "${BASE_MODES[@]}" --transport ws --rates 3 --duration 1.5 \
    --lengths 0.4-0.8 --ref-seconds 1.5 --bursts 1,2 --burst-frames 4
  named load_base_http 400 30 "${LOAD[@]}" "${TINY[@]}" --voice-mode clone,voice --transport http --rates 3 \
    --duration 1.5 --lengths 0.4-0.8 --ref-seconds 1.5 --bursts 1,2 --burst-frames 4
  named levers_base    400 30 "${LOAD[@]}" "${TINY[@]}" "${LEVERS_BASE[@]}" --transport inproc --rates 3 --duration 1.5 \
    --lengths 0.4-0.8 --ref-seconds 1.5 --bursts 1,2 --burst-frames 4
  named levers_cv      400 30 "${LOAD[@]}" "${TINY[@]}" "${LEVERS_CV[@]}" --transport inproc --rates 3 --duration 1.5 \
    --lengths 0.4-0.8 --bursts 1,2 --burst-frames 4
  named load_http      400 30 "${LOAD[@]}" "${TINY[@]}" "${PARSERS[@]}" --transport http,ws --rates 3 --duration 1.5 \
    --lengths 0.4-0.8
else
  named load_cv        420 140 "${LOAD[@]}" --size 1.7b --transport "${SUITE_LOAD_TRANSPORTS:-http,ws}" \
    --rates "${SUITE_LOAD_RATES:-5,10,20,40,80}" --duration "${SUITE_LOAD_DURATION:-12}" --lengths 2-20
  named load_fixed     330 200 "${LOAD[@]}" --size 1.7b --transport ws,http --rates 5,10,20,40,80 --duration 10 \
    --lengths 12 --bursts 1,32,128
  named peers          150 90 "$B/peers/run_peers.py" --size 1.7b --systems faster --stream-reps 2
  named load_base_ws   420 200 "${LOAD[@]}" --size 1.7b "${BASE_MODES[@]}" --transport ws --rates 5,10,20,40 \
    --duration 10 --lengths 2-20 --bursts 1,64
  named load_base_http 240 150 "${LOAD[@]}" --size 1.7b --voice-mode clone,voice --transport http --rates 5,10,20,40 \
    --duration 10 --lengths 2-20 --bursts 1,64
  named levers_base    240 150 "${LOAD[@]}" --size 1.7b "${LEVERS_BASE[@]}" --transport inproc --rates 5,10,20 \
    --duration 10 --lengths 2-20 --bursts 1,64
  named levers_cv      420 200 "${LOAD[@]}" --size 1.7b "${LEVERS_CV[@]}" --transport inproc --rates "$LEVERS_RATES" \
    --duration 10 --lengths 2-20 --bursts 1,32
  named load_http      420 200 "${LOAD[@]}" --size 1.7b "${PARSERS[@]}" --transport http,ws --rates 10,20,40 \
    --duration 10 --lengths 2-20
fi
if [[ -n "$(ls "$WORK"/results/tts_load_*.json 2>/dev/null)" ]]; then  # the table and the plot of TTFA p95 vs rate
  OUT=$WORK/results python3 "$B/tts_load.py" --summarize > "$WORK/logs/tts_load_summary.log" 2>&1
  tail -n 60 "$WORK/logs/tts_load_summary.log" | cut -c1-240
  [[ -f "$WORK/results/tts_load.png" ]] && cp "$WORK/results/tts_load.png" "$OUT/tts_load.png"
fi

if [[ $SMOKE == 1 ]]; then
  bench tts   300 30 "$B/tts_bench.py" --device cpu --tiny --size 1.7b --levels 1,2 --frames 6 --transport http
  bench text  200 20 "$B/text_bench.py" --smoke
  bench grammar 200 20 "$B/constrained_bench.py" --smoke
  bench asr   200 20 "$B/asr_bench.py" --smoke
  bench chat  300 30 "$B/chat_bench.py" --smoke
  bench voice 400 60 "$B/voice_bench.py" --build tiny --smoke --turns semantic_vad --arrivals at-once
  named colocation 400 60 "$B/colocation_bench.py" --smoke --transports ws
  bench image 200 20 "$B/image_bench.py" --smoke
  bench video 200 20 "$B/video_bench.py" --smoke --transport inproc
  named unet_levers 200 20 "$B/unet_levers.py" --smoke
else
  bench tts   150 70 "$B/tts_bench.py" --size 1.7b --transport http --levels 1,32
  bench text  110 40 "$B/text_bench.py"
  bench grammar 90 40 "$B/constrained_bench.py" --gpu
  bench asr   100 40 "$B/asr_bench.py" --from-config "$B/configs/whisper-large-v3-turbo" --device cuda
  bench chat  130 60 "$B/chat_bench.py"
  bench voice "${SUITE_VOICE_CAP:-230}" 80 "$B/voice_bench.py" --build dummy --device cuda --levels "${SUITE_VOICE_LEVELS:-1,16,32}" --max-batch 32 \
    --turns semantic_vad --arrivals at-once ${SUITE_VOICE_ARGS:-}
  # server ~100 s and a warm-up of every route (run 29): the mixed scenarios at c=32 alone fill one call
  # shellcheck disable=SC2086  # SUITE_COLOCATION_ARGS splits on purpose (e.g. "--tune realtime_priority=on --tag _prio")
  named colocation 545 300 "$B/colocation_bench.py" --gpu --scenarios mixed --transports ws --levels 32 \
    ${SUITE_COLOCATION_ARGS:-}
  if [[ ",$ONLY," == *",gputests,"* ]]; then  # a copy outside the repository: its omni_stream/ would shadow /tmp/site
    mkdir -p "$WORK/t/benchmarks" && cp -r "$REPO/tests" "$REPO/pyproject.toml" "$WORK/t/" && cp -r "$B/configs" "$WORK/t/benchmarks/"
  fi
  GPUTESTS=${SUITE_GPUTESTS:-test_causal_lm_gpu.py test_qwen3_codec_kernels.py test_qwen3_codec_stream.py \
    test_qwen3_gpu.py test_whisper_gpu.py test_smart_turn_gpu.py test_worker_streams_gpu.py test_image_noise.py}
  # shellcheck disable=SC2086  # the file names split on purpose
  named gputests 545 "$([[ -n ${SUITE_GPUTESTS:-} ]] && echo 60 || echo 300)" -m pytest \
    $(printf "$WORK/t/tests/%s " $GPUTESTS) -m gpu -q -p no:cacheprovider -rs
  bench image 120 50 "$B/image_bench.py" --device cuda
  bench video 180 80 "$B/video_bench.py" --gpu
  # the image denoiser's call under each lever (attention kernels, NHWC, fused q/k/v, torch.compile: ~2 min)
  # shellcheck disable=SC2086  # SUITE_UNET_ARGS splits on purpose (e.g. "--levers compile_dynamic --rows 3,24,48")
  named unet_levers 300 120 "$B/unet_levers.py" ${SUITE_UNET_ARGS:-}
fi

stamp "done"
python3 "$B/gpu_suite_report.py" "$STATUS" "$WORK/results" "$WORK/suite.json"
pack
awk -F'\t' '$2 != "ok" { bad = 1 } END { exit bad }' "$STATUS"
