// The transcription page: a file (or a recording from the microphone) goes to POST /v1/audio/transcriptions (or
// /translations) with stream=true, and the transcript appears as its SSE deltas arrive. State is mirrored on
// window.__transcribe so browser tests can read it.

import { authHeaders, refusedKey, watchKey } from "./server-access.js";

const $ = (id) => document.getElementById(id);

const state = {
  state: "idle", // idle | recording | sending | streaming | done | stopped | error
  model: null,
  text: "",
  deltas: 0,
  ttftMs: null,
  usage: null,
  recordedBytes: 0,
  errors: [],
};
window.__transcribe = state;

let controller = null; // aborts the request in flight
let recorder = null; // MediaRecorder while recording
let recording = null; // the last recording, a Blob

function setState(value) {
  state.state = value;
  $("state").textContent = value;
  const busy = value === "sending" || value === "streaming";
  $("start").disabled = busy || value === "recording" || !state.model;
  $("stop").disabled = !busy;
  $("record").disabled = busy;
}

function showError(message) {
  state.errors.push(message);
  const item = document.createElement("li");
  item.textContent = message;
  $("errors").append(item);
}

async function loadModel() {
  const key = $("key").value.trim();
  try {
    const response = await fetch("v1/models", { headers: authHeaders(key) });
    if (response.status === 401) {
      $("model").textContent = key ? "the API key was refused" : "enter the API key (the server needs one)";
      if (key) showError(await refusedKey(key));
      return;
    }
    if (!response.ok) throw new Error(`GET v1/models: ${response.status}`);
    const asr = (await response.json()).data.find((m) => m.kind === "transcription");
    state.model = asr ? asr.id : null;
    $("model").textContent = asr ? asr.id : "no transcription model is loaded (serve one with --model ASR_DIR)";
    $("languages").replaceChildren(
      ...(asr?.languages ?? []).map((code) => Object.assign(document.createElement("option"), { value: code })),
    );
  } catch (err) {
    $("model").textContent = "unavailable";
    showError(`Could not reach the server: ${err.message}`);
  }
  setState(state.state);
}

// The microphone's audio as the browser records it (webm/opus in Chromium), used instead of the file input.
async function toggleRecording() {
  if (recorder) {
    recorder.stop();
    return;
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (err) {
    showError(`No microphone: ${err.message}`);
    return;
  }
  const chunks = [];
  recorder = new MediaRecorder(stream);
  recorder.ondataavailable = (event) => chunks.push(event.data);
  recorder.onstop = () => {
    stream.getTracks().forEach((track) => track.stop());
    recording = new Blob(chunks, { type: recorder.mimeType || "audio/webm" });
    state.recordedBytes = recording.size;
    $("recorded").textContent = `recorded ${(recording.size / 1024).toFixed(1)} KiB (used instead of the file)`;
    $("record").textContent = "Record";
    recorder = null;
    setState("idle");
  };
  recorder.start();
  $("record").textContent = "Stop recording";
  setState("recording");
}

// One SSE event's JSON from its lines (data: only; the route sends no other fields).
function parseEvent(block) {
  const data = block
    .split("\n")
    .filter((line) => line.startsWith("data:"))
    .map((line) => line.slice(5).trimStart())
    .join("\n");
  return data ? JSON.parse(data) : null;
}

function show(event, startedAt) {
  if (event.type === "transcript.text.delta") {
    if (state.ttftMs === null) {
      state.ttftMs = performance.now() - startedAt;
      $("ttft").textContent = `${state.ttftMs.toFixed(0)} ms`;
    }
    state.text += event.delta;
    state.deltas += 1;
  } else if (event.type === "transcript.text.done") {
    state.text = event.text;
    state.usage = event.usage;
    const u = event.usage;
    $("tokens").textContent = u ? `${u.input_token_details.audio_tokens} / ${u.output_tokens}` : "–";
  } else if (event.type === "error") {
    throw new Error(event.error.message);
  }
  $("transcript").textContent = state.text;
  $("chars").textContent = String(state.text.length);
}

async function transcribe(event) {
  event.preventDefault();
  const file = recording ?? $("file").files[0];
  if (!file) {
    showError("Choose an audio file or record one first");
    return;
  }
  const form = new FormData();
  form.append("file", file, file.name ?? "recording.webm");
  form.append("model", state.model);
  form.append("stream", "true");
  const language = $("language").value.trim();
  if (language && $("task").value === "transcribe") form.append("language", language);
  const prompt = $("prompt").value.trim();
  if (prompt) form.append("prompt", prompt);
  const route = $("task").value === "translate" ? "v1/audio/translations" : "v1/audio/transcriptions";
  Object.assign(state, { text: "", deltas: 0, ttftMs: null, usage: null });
  $("transcript").textContent = "";
  $("ttft").textContent = "–";
  $("tokens").textContent = "–";
  controller = new AbortController();
  const startedAt = performance.now();
  setState("sending");
  try {
    const response = await fetch(route, {
      method: "POST",
      body: form,
      headers: authHeaders($("key").value.trim()),
      signal: controller.signal,
    });
    if (!response.ok) {
      const body = await response.json().catch(() => null);
      throw new Error(body?.error?.message ?? `HTTP ${response.status}`);
    }
    setState("streaming");
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += value;
      let end;
      while ((end = buffered.indexOf("\n\n")) >= 0) {
        const parsed = parseEvent(buffered.slice(0, end));
        buffered = buffered.slice(end + 2);
        if (parsed) show(parsed, startedAt);
      }
    }
    setState(state.usage ? "done" : "error");
    if (!state.usage) showError("The stream ended before the transcript was done");
  } catch (err) {
    if (err.name === "AbortError") {
      setState("stopped");
    } else {
      setState("error");
      showError(err.message);
    }
  } finally {
    controller = null;
  }
}

$("form").addEventListener("submit", transcribe);
$("stop").addEventListener("click", () => controller?.abort());
$("record").addEventListener("click", toggleRecording);
$("file").addEventListener("change", () => {
  recording = null; // a chosen file replaces an earlier recording
  $("recorded").textContent = "";
});
watchKey($("key"), loadModel);
setState("idle");
loadModel();
