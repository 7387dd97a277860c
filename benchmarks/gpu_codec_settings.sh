#!/usr/bin/env bash
# The codec's settings measured and served in one device call: the window graphs of every arm, then the server at
# every level with the fastest arm's settings, then an A/B at c = 32 and 128 against the plain fused codec and with
# the codec's windows on the talker's stream instead of their own (OMNI_STREAM_CODEC_STREAM's default, high).
#
# Device command (nvidia-h200; carry [".whl"]; timeout_s 600), after `bash benchmarks/gpu_wheels.sh` here:
#
#   bash benchmarks/gpu_codec_settings.sh
#
# Steps (expected seconds on one H200; cap):
#   codec    ~120 / 200  codec_decoder.py: five arms (CODEC_ARMS), seven window graphs each, the profile of one
#                        128 x 25 window
#   served   ~130 / 170  tts_bench.py --transport http,ws at c = 1 ... 128 with `codec_decoder.py --fastest`'s
#                        settings (a fused arm: the fastest 128 x 25 window of those not slower in any window)
#   plain     ~80 / 100  the same at c = 32, 128 with the plain fused codec (phases none, time-major)
#   talker    ~80 / 100  the fastest arm's settings with OMNI_STREAM_CODEC_STREAM=off at c = 32, 128
# CODEC_SETTINGS_SMOKE=1: the same steps on the CPU with the tiny models and two levels (no install; the suite
# runs it, tests/test_gpu_codec_settings_cpu.py). The exit status is 1 when any step failed.
# What comes back ($OUT, 8 files): codec_decoder_1.7b.json, the six tts_bench JSON files (tags
# 1.7b_<RUN_TAG>_<arm>, 1.7b_<RUN_TAG>_plain, 1.7b_<RUN_TAG>_<arm>_talker; http and ws each; RUN_TAG defaults to
# the commit) and call.log (this output).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
OUT=${OUT:-/tmp/omni-stream-codec-settings}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/call.log") 2>&1
stamp() { printf '[%4ds] %s\n' "$SECONDS" "$*"; }

if [[ ${CODEC_SETTINGS_SMOKE:-0} == 1 ]]; then
  SIZE=tiny CODEC=(--tiny --device cpu --reps 1) BENCH=(--tiny --device cpu --frames 4 --server-timeout 120)
  ALL=1,2 AB=2
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || { stamp "install failed"; exit 1; }
  [[ -d .whl/site ]] && cp -a .whl/site/. /tmp/site/  # silero-vad's files: the server loads its VAD at start
  export PYTHONPATH=/tmp/site
  SIZE=1.7b CODEC=(--size 1.7b) BENCH=(--size 1.7b) ALL=1,4,16,32,64,128 AB=32,128
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
failed=0
export GIT_COMMIT=${GIT_COMMIT:-$(cat .whl/COMMIT 2>/dev/null || echo unknown)}
RUN_TAG=${RUN_TAG:-${GIT_COMMIT:0:7}}
stamp "commit $GIT_COMMIT"

# the plain fused arm (the baseline of --fastest) and every arm that may win; the module arm and channel-major
# activations with dilated convolutions (2.2 s a 128 x 25 window) are left to codec_decoder.py's full run
ARMS=triton,triton_phases_9,triton_phases_3_9,triton_channels_last_phases_9,triton_channels_last_phases_3_9
stamp "codec window graphs: ${CODEC_ARMS:-$ARMS}"
timeout -s INT 200 python3 benchmarks/codec_decoder.py "${CODEC[@]}" --arms "${CODEC_ARMS:-$ARMS}" \
  || { stamp "codec_decoder.py: exit $?"; failed=1; }
settings=$(python3 benchmarks/codec_decoder.py --fastest "$OUT/codec_decoder_$SIZE.json") \
  || { stamp "no codec result to choose from"; exit 1; }
stamp "fastest: $settings"
eval "export $settings"
bench() {  # bench CAP TAG LEVELS [ENV=VALUE...]
  local cap=$1 tag=$2 levels=$3; shift 3
  stamp "tts_bench $tag at c = $levels ($*)"
  env "$@" timeout -s INT "$cap" python3 benchmarks/tts_bench.py "${BENCH[@]}" --transport http,ws \
    --levels "$levels" --tag-suffix "_${RUN_TAG}_$tag" || { stamp "tts_bench.py $tag: exit $?"; failed=1; }
}
bench 170 "$CODEC_ARM" "$ALL"
bench 100 plain "$AB" OMNI_STREAM_CODEC_PHASES=none OMNI_STREAM_CODEC_CHANNELS_LAST=off
bench 100 "${CODEC_ARM}_talker" "$AB" OMNI_STREAM_CODEC_STREAM=off
stamp "done"
exit $failed
