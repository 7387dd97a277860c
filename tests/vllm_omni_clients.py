"""vLLM-Omni's own speech and video chat clients, taken unchanged from its source distributions on PyPI (never
committed here).

``python tests/vllm_omni_clients.py fetch [DEST]`` downloads the sdists with pip (no dependencies, nothing
installed) and extracts only the client scripts into DEST (default ``.vendor/vllm-omni``, ignored by git);
``.ci/run`` does that before the tests. ``tests/test_vllm_omni_clients.py`` runs them against
``omni-stream serve`` and skips, saying why, where they were not fetched.

Which release holds which client: 0.20.0 is the newest release with a source distribution (later ones ship
wheels only, without ``examples/``); the raw-PCM benchmark client ``bench_tts_serve.py`` was replaced after
0.18.0, so it comes from that release.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DEST = ROOT / ".vendor" / "vllm-omni"
ENV_DEST = "OMNI_STREAM_VLLM_OMNI_CLIENTS"  # where the fetched clients are, when not DEFAULT_DEST

# (release, path inside its sdist) -> the file name the tests use
CLIENTS = {
    "openai_speech_client.py": ("0.20.0", "examples/online_serving/text_to_speech/qwen3_tts/openai_speech_client.py"),
    "streaming_speech_client.py": (
        "0.20.0",
        "examples/online_serving/text_to_speech/qwen3_tts/streaming_speech_client.py",
    ),
    "batch_speech_client.py": ("0.20.0", "examples/online_serving/text_to_speech/qwen3_tts/batch_speech_client.py"),
    "bench_tts_serve.py": ("0.18.0", "benchmarks/qwen3-tts/vllm_omni/bench_tts_serve.py"),
    "streaming_video_client.py": ("0.20.0", "examples/online_serving/qwen3_omni/streaming_video_client.py"),
}


def clients_dir() -> Path:
    return Path(os.environ.get(ENV_DEST) or DEFAULT_DEST)


def client(name: str) -> Path | None:
    """The fetched script ``name``, or None when it was not fetched."""
    path = clients_dir() / name
    return path if path.is_file() else None


def fetch(dest: Path) -> list[Path]:
    """Download the sdists and extract the client scripts into ``dest``; returns the written paths."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for release in sorted({release for release, _ in CLIENTS.values()}):
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
            subprocess.run([*cmd, "-d", tmp, f"vllm-omni=={release}"], check=True)
            (archive,) = Path(tmp).glob(f"vllm_omni-{release}.tar.gz")
            with tarfile.open(archive) as tar:
                for name, (want, inner) in CLIENTS.items():
                    if want != release:
                        continue
                    member = tar.getmember(f"vllm_omni-{release}/{inner}")
                    data = tar.extractfile(member)
                    assert data is not None, inner
                    out = dest / name
                    out.write_bytes(data.read())  # only the named files: nothing else leaves the archive
                    written.append(out)
    (dest / "SOURCE").write_text(
        "".join(f"{name}: vllm-omni {release} sdist, {inner}\n" for name, (release, inner) in CLIENTS.items())
    )
    return written


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "fetch":
        sys.exit(f"usage: {sys.argv[0]} fetch [DEST]")
    for path in fetch(Path(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_DEST):
        print(f"fetched {path}")
