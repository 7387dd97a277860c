// The video page: generates a video over WS /v1/realtime/video and plays its fragmented-MP4 chunks as they
// arrive through Media Source Extensions; a second prompt steers the next chunks (session.interaction).
// Counters are mirrored on window.__video so browser tests can read them.

import { authHeaders, refusedKey, socketProtocols, watchKey } from "./server-access.js";

const $ = (id) => document.getElementById(id);

const state = {
  state: "idle", // idle | connecting | streaming | stopping | done | stopped | error
  model: null,
  requestId: null,
  mimeType: null,
  ttfcMs: null,
  chunks: 0, // binary chunks received
  appended: 0, // chunks the SourceBuffer took
  bytes: 0,
  currentTime: 0,
  queued: [], // event ids the server queued
  applied: [], // event ids a chunk reported as started
  done: null, // the session.done message
  errors: [],
};
window.__video = state;

let socket = null;
let source = null; // MediaSource
let buffer = null; // SourceBuffer
let pending = []; // chunk bytes waiting for the SourceBuffer
let expected = null; // the video.chunk_metadata announcing the next binary frame
let startedAt = 0;
let steerCount = 0;

function setState(value) {
  state.state = value;
  $("state").textContent = value;
  const live = value === "connecting" || value === "streaming";
  $("start").disabled = live || value === "stopping";
  $("stop").disabled = !live;
  $("send-steer").disabled = value !== "streaming";
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
      state.model = null;
      $("model").textContent = key ? "the API key was refused" : "enter the API key (the server needs one)";
      if (key) showError(await refusedKey(key));
      return;
    }
    if (!response.ok) throw new Error(`GET v1/models: ${response.status}`);
    const models = (await response.json()).data;
    const video = models.find((m) => m.kind === "video") ?? null;
    state.model = video ? video.id : null;
    $("model").textContent = video ? `${video.id} (${video.model_type})` : "no video model loaded";
  } catch (err) {
    $("model").textContent = "unavailable";
    showError(err.message);
  }
}

// --- Media Source Extensions ---

function openSource(mimeType) {
  if (!window.MediaSource || !MediaSource.isTypeSupported(mimeType)) {
    throw new Error(`this browser cannot play ${mimeType} through Media Source Extensions`);
  }
  pending = [];
  buffer = null;
  source = new MediaSource();
  const video = $("video");
  video.src = URL.createObjectURL(source);
  source.addEventListener(
    "sourceopen",
    () => {
      buffer = source.addSourceBuffer(mimeType);
      buffer.mode = "sequence";
      buffer.addEventListener("updateend", () => {
        state.appended += 1;
        pump();
      });
      buffer.addEventListener("error", () => showError("the video buffer rejected a chunk"));
      pump();
    },
    { once: true },
  );
}

function pump() {
  if (!buffer || buffer.updating || source.readyState !== "open") return;
  if (pending.length) {
    buffer.appendBuffer(pending.shift());
    const video = $("video");
    if (video.paused) video.play().catch(() => {}); // muted: autoplay is allowed
    return;
  }
  if (state.done) source.endOfStream();
}

// --- the session ---

function start(event) {
  event.preventDefault();
  if (socket) return;
  const body = { type: "session.start", prompt: $("prompt").value.trim(), format: "m4s" };
  const frames = Number($("frames").value);
  if (frames > 0) body.num_frames = frames;
  if (state.model) body.model = state.model;
  Object.assign(state, { requestId: null, ttfcMs: null, chunks: 0, appended: 0, bytes: 0, queued: [], applied: [],
    done: null }); // prettier-ignore
  $("errors").replaceChildren();
  state.errors = [];
  // the last run's numbers, steering note and picture are not this one's
  $("ttfc").textContent = "–";
  $("chunks").textContent = "0";
  $("bytes").textContent = "0";
  $("steer-state").textContent = "";
  $("time").textContent = "0.0";
  state.currentTime = 0;
  const video = $("video");
  video.removeAttribute("src");
  video.load();
  const key = $("key").value.trim();
  // relative to the page, as its fetches are: behind a proxy that serves it under a path, the socket is there too
  const url = new URL("v1/realtime/video", location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(url, socketProtocols(key));
  let opened = false;
  socket = ws;
  ws.binaryType = "arraybuffer";
  setState("connecting");
  startedAt = performance.now();
  ws.onopen = () => {
    opened = true;
    ws.send(JSON.stringify(body));
  };
  ws.onmessage = (message) => (typeof message.data === "string" ? control(JSON.parse(message.data)) : media(message.data));
  ws.onclose = async (close) => {
    socket = null;
    if (state.state === "connecting" || state.state === "streaming" || state.state === "stopping") {
      const closed = `Connection closed (code ${close.code}${close.reason ? `: ${close.reason}` : ""})`;
      const why = opened ? null : (await refusedKey(key)) ?? closed;
      if (why && !state.errors.includes(why)) showError(why);
      else if (opened && !state.done && !state.errors.length) showError(closed); // else an error event said why
      setState(state.done ? (state.done.stopped ? "stopped" : "done") : "error");
    }
  };
}

function control(message) {
  switch (message.type) {
    case "video.start":
      state.requestId = message.request_id;
      state.mimeType = message.config.mime_type;
      try {
        openSource(state.mimeType);
      } catch (err) {
        showError(err.message);
        socket.close();
        return;
      }
      setState("streaming");
      break;
    case "video.chunk_metadata":
      expected = message;
      state.applied.push(...message.started_event_ids);
      if (message.started_event_ids.length) $("steer-state").textContent = `applied from chunk ${message.generation_chunk_index}`;
      break;
    case "session.interaction.queued":
      state.queued.push(message.event_id);
      $("steer-state").textContent = "queued for the next chunk";
      break;
    case "session.done":
      state.done = message;
      setState(message.stopped ? "stopped" : "done");
      pump();
      break;
    case "error":
      showError(`${message.code}: ${message.message}`);
      if (state.state === "connecting") setState("error");
      break;
  }
}

function media(data) {
  if (!expected || expected.byte_length !== data.byteLength) showError("a chunk did not match its metadata");
  expected = null;
  if (state.ttfcMs === null) {
    state.ttfcMs = Math.round(performance.now() - startedAt);
    $("ttfc").textContent = `${state.ttfcMs} ms`;
  }
  state.chunks += 1;
  state.bytes += data.byteLength;
  $("chunks").textContent = state.chunks;
  $("bytes").textContent = state.bytes.toLocaleString();
  pending.push(data);
  pump();
}

function stop() {
  if (!socket) return;
  socket.send(JSON.stringify({ type: "session.stop" }));
  setState("stopping");
}

function steer(event) {
  event.preventDefault();
  const prompt = $("steer").value.trim();
  if (!socket || !prompt) return;
  steerCount += 1;
  const interaction = { event_id: `steer-${steerCount}`, event: { prompt }, transition_chunks: 0 };
  socket.send(JSON.stringify({ type: "session.interaction", interaction }));
}

$("video").addEventListener("timeupdate", () => {
  state.currentTime = $("video").currentTime;
  $("time").textContent = state.currentTime.toFixed(1);
});
$("form").addEventListener("submit", start);
$("stop").addEventListener("click", stop);
$("steer-form").addEventListener("submit", steer);
watchKey($("key"), () => {
  $("errors").replaceChildren();
  state.errors = [];
  if (state.state === "error") setState("idle"); // what failed was the old key's: the page is ready again
  loadModel();
});
setState("idle");
loadModel();
