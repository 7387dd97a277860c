// The demo page: speaks the typed text over WS /v1/audio/speech/stream and plays the PCM16 frames gaplessly
// through an AudioWorklet. Counters are mirrored on window.__demo so browser tests can read them.

import { authHeaders, refusedKey, socketProtocols, watchKey } from "./server-access.js";

const $ = (id) => document.getElementById(id);
const STREAM_RATE = 24000; // the server's PCM rate unless /v1/models or audio.start say otherwise
// A session holds at most 64 sentences queued or being synthesized (Settings.max_ws_queued_units) and refuses text
// past that, so a long text goes as utterances of GROUP sentences, AHEAD of them unfinished at a time: the next is
// sent when one's session.done arrives, while the queued one is synthesized (no gap).
const GROUP = 16;
const AHEAD = 2;

const demo = {
  state: "idle", // idle | connecting | streaming | cancelling | done | cancelled | error
  model: null,
  voices: [],
  ttfaMs: null,
  bytesReceived: 0,
  framesReceived: 0, // binary frames off the socket
  framesToWorklet: 0, // frames the worklet confirms it received
  samplesPlayed: 0, // at the AudioContext rate
  underruns: 0,
  bufferedMs: 0,
  sentences: 0, // audio.done events: sentences spoken (or failed)
  playing: false,
  contextRate: null,
  errors: [],
};
window.__demo = demo;

let serverRate = STREAM_RATE;
let player = null; // Promise<{context, node}>, made on the first Speak (a user gesture may start audio)
let run = 0; // id of the current Speak; stats of older ones are ignored
let socket = null;
let startedAt = 0;
let finished = true; // session.done seen (or the socket closed) for the current Speak
let playerRate = null;
let groups = []; // the text's utterances not yet sent
let sent = 0; // utterances sent for the current Speak
let ended = 0; // their session.done events
let stopping = false; // Stop pressed: no more utterances are sent
let cancelled = false; // a session.done said cancelled

// The text as utterances of at most GROUP sentences (cut where the server's sentence split also cuts).
function utterances(text) {
  const sentences = text.match(/[\s\S]*?(?:[。！？]+|[.!?]+["'”’)\]]*(?=\s|$)|$)\s*/g).filter((s) => s.trim());
  const out = [];
  for (let i = 0; i < sentences.length; i += GROUP) out.push(sentences.slice(i, i + GROUP).join("").trim());
  return out;
}

// --- server info ---

async function getJson(path) {
  const response = await fetch(path, { headers: authHeaders($("key").value.trim()) });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const message = body?.error?.message ?? response.statusText;
    const error = new Error(`GET ${path}: ${response.status} ${message}`);
    error.status = response.status;
    throw error;
  }
  return body;
}

async function loadServerInfo() {
  try {
    const [models, voices] = await Promise.all([getJson("v1/models"), getJson("v1/audio/voices")]);
    const model = models.data[0];
    demo.model = model ? model.id : null;
    serverRate = model?.sample_rate ?? STREAM_RATE;
    $("model").textContent = model ? `${model.id} (${model.model_type}, ${serverRate} Hz)` : "none loaded";
    fillVoices(voices.voices);
  } catch (err) {
    if (err.status === 401) {  // as the realtime and video pages say it: no key yet is not an error
      const key = $("key").value.trim();
      $("model").textContent = key ? "the API key was refused" : "enter the API key (the server needs one)";
      if (key) showError(err.message);
      return;
    }
    $("model").textContent = "unavailable";
    showError(err.message);
  }
}

function fillVoices(names) {
  const select = $("voice");
  const current = select.value;
  demo.voices = names;
  select.replaceChildren(new Option("(model default)", ""), ...names.map((name) => new Option(name, name)));
  select.value = names.includes(current) ? current : names[0] ?? "";
}

// --- audio ---

async function createPlayer() {
  if (!window.AudioWorkletNode) {
    throw new Error("AudioWorklet is unavailable: open the page over https or on localhost");
  }
  // ?rate=N plays at N Hz instead (the worklet resamples): for devices that refuse the stream's rate, and tests.
  const rate = Number(new URLSearchParams(location.search).get("rate")) || serverRate;
  let context;
  try {
    context = new AudioContext({ sampleRate: rate, latencyHint: "interactive" });
  } catch {
    context = new AudioContext({ latencyHint: "interactive" }); // the worklet resamples instead
  }
  await context.audioWorklet.addModule("static/pcm-player-worklet.js");
  const node = new AudioWorkletNode(context, "pcm-player", { numberOfInputs: 0, outputChannelCount: [1] });
  node.port.onmessage = (event) => onStats(event.data);
  node.connect(context.destination);
  demo.contextRate = context.sampleRate;
  return { context, node };
}

// Messages reach the worklet in call order, also those sent before it finished loading.
function toPlayer(message, transfer = []) {
  player?.then(({ node }) => node.port.postMessage(message, transfer)).catch(() => {});
}

function onStats(stats) {
  if (stats.run !== run) return;
  demo.framesToWorklet = stats.frames;
  demo.samplesPlayed = stats.samplesPlayed;
  demo.underruns = stats.underruns;
  demo.bufferedMs = stats.bufferedMs;
  demo.playing = stats.playing;
  render();
}

// --- speaking ---

function speak(text) {
  closeSocket();
  player ??= createPlayer();
  player
    .then(({ context }) => context.resume())
    .catch((err) => {
      player = null; // let the next Speak try again
      closeSocket();
      fail(err.message);
    });
  run += 1;
  Object.assign(demo, {
    ttfaMs: null,
    bytesReceived: 0,
    framesReceived: 0,
    framesToWorklet: 0,
    samplesPlayed: 0,
    underruns: 0,
    bufferedMs: 0,
    sentences: 0,
    errors: [],
  });
  $("errors").replaceChildren();
  $("sentence").textContent = "";
  toPlayer({ type: "reset", run });
  playerRate = null;
  finished = false;
  groups = utterances(text);
  sent = ended = 0;
  stopping = cancelled = false;
  startedAt = performance.now();
  setState("connecting");

  const key = $("key").value.trim();
  const url = new URL("v1/audio/speech/stream", location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  let ws;
  let opened = false;
  try {
    ws = new WebSocket(url, socketProtocols(key));
  } catch (err) {
    fail(`Cannot connect: ${err.message}`);
    return;
  }
  ws.binaryType = "arraybuffer";
  socket = ws;
  const config = { type: "session.config", response_format: "pcm", stream_audio: true, split_granularity: "sentence" };
  if (demo.model) config.model = demo.model;
  if ($("voice").value) config.voice = $("voice").value;
  ws.onopen = () => {
    opened = true;
    send(ws, config);
    while (sent < AHEAD && groups.length) sendUtterance(ws);
    setState("streaming");
  };
  ws.onmessage = (event) => {
    if (ws !== socket) return;
    if (typeof event.data === "string") onEvent(JSON.parse(event.data));
    else onAudio(event.data);
  };
  ws.onclose = async (event) => {
    if (ws !== socket) return;
    socket = null;
    if (!finished) {
      finished = true;
      toPlayer({ type: "end" });
      const reason = event.reason ? `: ${event.reason}` : "";
      const refused = opened ? null : await refusedKey(key);
      fail(refused ?? `Connection closed before the speech finished (code ${event.code}${reason})`);
    }
  };
}

function sendUtterance(ws) {
  send(ws, { type: "input.text", text: groups.shift() });
  send(ws, { type: "input.done" });
  sent += 1;
}

function send(ws, message) {
  if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(message));
}

function onAudio(data) {
  if (demo.state === "cancelling") return; // frames already in flight when Stop was pressed
  if (demo.ttfaMs === null) demo.ttfaMs = Math.round(performance.now() - startedAt);
  demo.bytesReceived += data.byteLength;
  demo.framesReceived += 1;
  toPlayer({ type: "pcm", data }, [data]);
  render();
}

function onEvent(message) {
  switch (message.type) {
    case "audio.start":
      $("sentence").textContent = message.sentence_text ?? "";
      if (message.sample_rate !== playerRate) {
        playerRate = message.sample_rate;
        toPlayer({ type: "format", sampleRate: playerRate });
      }
      break;
    case "audio.done":
      demo.sentences += 1;
      if (message.error) showError(`Sentence ${demo.sentences} failed`);
      break;
    case "session.done":
      ended += 1;
      cancelled ||= Boolean(message.cancelled);
      if (!stopping && !cancelled && groups.length) {
        sendUtterance(socket);
        break;
      }
      if (ended < sent) break; // the utterances still queued end (cancelled, after a Stop) first
      finished = true;
      toPlayer({ type: "end" });
      $("sentence").textContent = "";
      setState(cancelled ? "cancelled" : "done");
      send(socket, { type: "session.close" });
      break;
    case "error":
      showError(message.message);
      break;
  }
}

function stop() {
  toPlayer({ type: "flush" });
  if (socket && !finished) {
    stopping = true;
    send(socket, { type: "input.cancel" });
    setState("cancelling");
  } else if (demo.state === "done") {
    setState("cancelled");
  }
}

function closeSocket() {
  if (socket) {
    const old = socket;
    socket = null;
    old.close(1000);
  }
}

// --- display ---

function fail(message) {
  showError(message);
  setState("error");
}

function showError(message) {
  demo.errors.push(message);
  const item = document.createElement("li");
  item.textContent = message;
  $("errors").append(item);
}

function setState(state) {
  demo.state = state;
  render();
}

function formatMs(ms) {
  return ms < 10000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(1)} s`;
}

// Sets text only when it changes, so the status live region is not re-announced on every stats message.
function show(id, text) {
  if ($(id).textContent !== text) $(id).textContent = text;
}

function render() {
  const busy = ["connecting", "streaming", "cancelling"].includes(demo.state);
  const audible = demo.playing || demo.bufferedMs > 0;
  $("speak").disabled = busy;
  $("stop").disabled = !(busy || audible) || demo.state === "cancelling";
  show("state", demo.state === "done" && audible ? "received, playing" : demo.state);
  show("ttfa", demo.ttfaMs === null ? "–" : `${demo.ttfaMs} ms`);
  show("bytes", demo.bytesReceived.toLocaleString("en"));
  show("frames", `${demo.framesToWorklet} / ${demo.framesReceived}`);
  show("played", `${(demo.samplesPlayed / (demo.contextRate || serverRate)).toFixed(2)} s`);
  show("buffered", formatMs(demo.bufferedMs));
  show("underruns", String(demo.underruns));
}

$("form").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("text").value.trim();
  if (text) speak(text);
  else {
    // "required" lets blanks through: say so rather than doing nothing
    $("text").setCustomValidity("Type some text to speak");
    $("text").reportValidity();
  }
});
$("text").addEventListener("input", () => $("text").setCustomValidity(""));
$("stop").addEventListener("click", stop);
watchKey($("key"), () => {
  $("errors").replaceChildren();
  demo.errors = [];
  if (demo.state === "error") setState("idle"); // what failed was the old key's: the page is ready again
  loadServerInfo();
});
loadServerInfo();
render();
