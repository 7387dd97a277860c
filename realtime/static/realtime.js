// Voice agent page: microphone -> WS /v1/realtime (OpenAI Realtime events, server VAD) -> speaker.
//
// One AudioContext at 24 kHz (the session's audio/pcm rate: the browser resamples the microphone and the
// speaker): a capture worklet posts 100 ms blocks that go out as input_audio_buffer.append (PCM16 base64), and
// the gapless player worklet plays response.output_audio.delta. On speech_started the page drops what it has
// not played and tells the server what was heard (conversation.item.truncate), as OpenAI clients do.
// With the WebRTC transport the page sends its microphone track to the fastrtc stream under /rtc (data channel
// first: the server waits for it) and plays the agent's track; the data channel's logs drive the status.
// The camera toggle (WebRTC only, off by default) adds the camera's track, shown in a small preview, and offers to
// /rtc/camera, where a text model that sees is shown the camera's latest picture as each turn starts. It is
// disabled, saying why, when the server has no camera route or its text model does not see; a camera the browser
// refuses is said so, and the call goes on without it.
// The model line names the agent's text model (the one ?model= names) and the speech model it speaks with; it and
// the voice list load again once an API key is typed. A response that fails, and a key the server refuses, are
// shown as such.
// window.agent holds the page's state for tests.

import { authHeaders, refusedKey, socketProtocols, watchKey } from "./server-access.js";

const RATE = 24000;
const $ = (id) => document.getElementById(id);
const agent = (window.agent = {
  state: "idle",
  model: null, // the text model's id (null until /v1/models has answered)
  voices: [],
  events: [],
  errors: [],
  sentSamples: 0,
  receivedSamples: 0,
  samplesPlayed: 0,
  latencyMs: null,
  turns: [], // {role, text, cancelled, status}
  transport: "ws",
  logs: [], // WebRTC data-channel logs
  rtcState: null,
  rtcAvailable: null, // what /rtc/config said (null until it has answered)
  loudFrames: 0, // WebRTC: analyser frames of the agent's track with sound in them
  camera: { available: false, sees: false, on: false }, // /rtc/config's camera and sees; on: a call sends it
});

let socket = null;
let rtc = null; // {pc, stream, context}
let audio = null; // {context, player, capture, stream}
let current = null; // the assistant turn being spoken: {li, turn, itemId, playedAtStart}
const responses = new Map(); // response id -> its assistant turn, until its response.done
let playerBusy = false; // the player still has agent audio to play
let stoppedAt = null; // when the user's last turn ended (performance.now())
let explained = null; // the failed response's reason: the error event that repeats it adds no line
let goingAway = false; // the server said it is shutting down: its 1001 close adds no line
const userTurns = new Map(); // item id -> the user's turn, filled in when its transcript arrives

function setState(state) {
  agent.state = state;
  $("state").textContent = state;
  $("start").disabled = state !== "idle";
  $("stop").disabled = state === "idle";
  if ($("camera-on")) updateCamera();
}

function showError(message) {
  agent.errors.push(message);
  const li = document.createElement("li");
  li.textContent = message;
  $("errors").append(li);
}

function render() {
  $("sent").textContent = agent.transport === "rtc" ? "(WebRTC track)" : `${(agent.sentSamples / RATE).toFixed(1)} s`;
  // WebRTC: time with sound on the agent's track, sampled every 20 ms
  const received = agent.transport === "rtc" ? agent.loudFrames * 0.02 : agent.receivedSamples / RATE;
  $("received").textContent = `${received.toFixed(1)} s`;
  $("played").textContent =
    agent.transport === "rtc" ? "(by the audio element)" : `${(agent.samplesPlayed / RATE).toFixed(1)} s`;
  $("latency").textContent = agent.latencyMs === null ? "–" : `${Math.round(agent.latencyMs)} ms`;
}

function addTurn(role, text = "") {
  const turn = { role, text, cancelled: false, status: null };
  agent.turns.push(turn);
  const li = document.createElement("li");
  li.className = role;
  li.textContent = text;
  $("turns").append(li);
  return { li, turn };
}

const key = () => $("key").value.trim();
let infoKey = null; // the key the model line and the voices were loaded with

async function loadInfo() {
  const used = key();
  infoKey = used;
  try {
    const models = await fetch("v1/models", { headers: authHeaders(used) });
    if (models.status === 401) {
      agent.model = null;
      $("model").textContent = used ? "the API key was refused" : "enter the API key (the server needs one)";
      if (used) showError(await refusedKey(used));
    } else if (models.ok) {
      const data = (await models.json()).data ?? [];
      const text = data.find((m) => m.kind === "text");
      const speech = data.find((m) => m.kind === "speech");
      agent.model = text?.id ?? null;
      const voice = speech ? `, speaking with ${speech.id}` : "";
      $("model").textContent = text ? `${text.id}${voice}` : "no text model loaded: the agent cannot answer";
    }
    const rtcConfig = await fetch("rtc/config");
    const config = rtcConfig.ok ? await rtcConfig.json() : {};
    const rtcOption = $("transport").querySelector("option[value=rtc]");
    rtcOption.disabled = !config.available; // no fastrtc on this server: say so, not only grey it out
    rtcOption.textContent = config.available ? "WebRTC (/rtc)" : "WebRTC (/rtc): not on this server";
    agent.rtcAvailable = Boolean(config.available);
    agent.camera.available = Boolean(config.camera);
    agent.camera.sees = Boolean(config.sees);
    updateCamera();
    const voices = await fetch("v1/audio/voices", { headers: authHeaders(used) });
    if (voices.ok) {
      agent.voices = (await voices.json()).voices ?? [];
      const names = agent.voices;
      $("voice").replaceChildren(new Option("(model default)", ""), ...names.map((n) => new Option(n, n)));
    }
  } catch (err) {
    showError(`Could not reach the server: ${err.message}`);
  }
}

function updateCamera() {
  // The toggle is usable with the WebRTC transport, a camera route and a text model that sees; the note says why not.
  const { available, sees } = agent.camera;
  const rtc = $("transport").value === "rtc";
  const model = agent.model ?? "the text model";
  let why = "";
  if (!available) why = "this server has no camera route";
  else if (!sees) why = `${model} does not see pictures`;
  else if (!rtc) why = "WebRTC only";
  $("camera-on").disabled = Boolean(why) || agent.state !== "idle";
  if (why) $("camera-on").checked = false;
  $("camera-note").textContent = why ? `(${why})` : "show the agent my camera";
}

// --- audio ---

function toBase64(int16) {
  const bytes = new Uint8Array(int16.buffer, int16.byteOffset, int16.byteLength);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

function fromBase64(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes.buffer;
}

async function openAudio() {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: false, autoGainControl: false },
  });
  const context = new AudioContext({ sampleRate: RATE, latencyHint: "interactive" });
  await context.audioWorklet.addModule("static/pcm-player-worklet.js");
  await context.audioWorklet.addModule("static/mic-capture-worklet.js");
  const player = new AudioWorkletNode(context, "pcm-player", { numberOfInputs: 0, outputChannelCount: [1] });
  player.port.onmessage = (event) => {
    agent.samplesPlayed = event.data.samplesPlayed;
    playerBusy = event.data.playing || event.data.bufferedMs > 0;
    // the last answer has played out (its response is done: no audio of it is still coming)
    if (!playerBusy && agent.state === "speaking" && !responses.size) setState("listening");
    render();
  };
  player.connect(context.destination);
  player.port.postMessage({ type: "format", sampleRate: RATE });
  const capture = new AudioWorkletNode(context, "mic-capture", { processorOptions: { blockSize: RATE / 10 } });
  capture.port.onmessage = (event) => sendAudio(event.data.data);
  const mute = context.createGain();
  mute.gain.value = 0; // the capture node must be pulled by the graph, but the user must not hear themselves
  context.createMediaStreamSource(stream).connect(capture).connect(mute).connect(context.destination);
  await context.resume();
  return { context, player, capture, stream };
}

function sendAudio(block) {
  if (!socket || socket.readyState !== WebSocket.OPEN) return;
  const pcm = new Int16Array(block.length);
  for (let i = 0; i < block.length; i++) {
    const x = Math.max(-1, Math.min(1, block[i]));
    pcm[i] = Math.round(x * 32767);
  }
  socket.send(JSON.stringify({ type: "input_audio_buffer.append", audio: toBase64(pcm) }));
  agent.sentSamples += pcm.length;
  render();
}

// --- the session ---

function send(event) {
  socket?.send(JSON.stringify(event));
}

function onEvent(event) {
  agent.events.push(event.type);
  switch (event.type) {
    case "session.created": {
      // semantic_vad (Smart Turn) where the server has it; its refusal below falls back to server_vad
      const session = { type: "realtime", audio: { input: { turn_detection: { type: "semantic_vad" } } } };
      const voice = $("voice").value;
      if (voice) session.audio.output = { voice };
      send({ type: "session.update", session });
      break;
    }
    case "session.updated":
      setState("listening");
      break;
    case "input_audio_buffer.speech_started":
      setState("hearing you");
      interrupt();
      break;
    case "input_audio_buffer.speech_stopped":
      stoppedAt = performance.now();
      setState("thinking");
      break;
    case "input_audio_buffer.committed":
      userTurns.set(event.item_id, addTurn("user", "…"));
      break;
    case "conversation.item.input_audio_transcription.completed": {
      const user = userTurns.get(event.item_id) ?? addTurn("user");
      userTurns.delete(event.item_id);
      user.turn.text = event.transcript || "(nothing heard)";
      user.li.textContent = user.turn.text;
      break;
    }
    case "response.created": {
      const responseId = event.response?.id;
      current = { ...addTurn("assistant"), itemId: null, playedAtStart: agent.samplesPlayed, received: 0, responseId };
      responses.set(responseId, current);
      break;
    }
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta":
      if (current) {
        current.turn.text += event.delta;
        current.li.textContent = current.turn.text;
        current.itemId = event.item_id;
      }
      break;
    case "response.output_audio.delta": {
      const data = fromBase64(event.delta);
      if (stoppedAt !== null) {
        agent.latencyMs = performance.now() - stoppedAt;
        stoppedAt = null;
      }
      agent.receivedSamples += data.byteLength / 2;
      if (current) {
        current.itemId = event.item_id;
        current.received += data.byteLength / 2;
      }
      audio?.player.port.postMessage({ type: "pcm", data }, [data]);
      setState("speaking");
      render();
      break;
    }
    case "response.done": {
      const { id, status, status_details: details } = event.response;
      const done = responses.get(id) ?? current; // also a turn the user interrupted before its end
      responses.delete(id);
      if (done) {
        done.turn.status = status;
        done.turn.cancelled ||= status === "cancelled";
        if (status !== "completed") done.li.classList.add(status); // cancelled, failed or incomplete
      }
      if (status === "failed") {
        explained = details?.error?.message ?? null;
        showError(`The response failed: ${explained ?? "no reason given"}`);
      }
      if (done === current) audio?.player.port.postMessage({ type: "end" });
      // the agent is still heard while its audio plays out: "listening" once the player has drained it
      if (agent.state === "thinking" || (agent.state === "speaking" && !playerBusy)) setState("listening");
      break;
    }
    case "error":
      if (event.error.param === "session.audio.input.turn_detection.type") {
        send({ type: "session.update", session: { audio: { input: { turn_detection: { type: "server_vad" } } } } });
        break;
      }
      // a failed response's error event repeats its reason (a shutdown: response.done, error, then 1001)
      if (event.error.message !== explained) showError(`${event.error.code ?? event.error.type}: ${event.error.message}`);
      explained = null;
      goingAway ||= event.error.code === "server_shutdown";
      break;
  }
}

function interrupt() {
  // Drop the agent audio not yet played; tell the server how much of its answer was heard.
  audio?.player.port.postMessage({ type: "flush" });
  playerBusy = false;
  const played = current ? Math.min(agent.samplesPlayed - current.playedAtStart, current.received) : 0;
  if (current && (responses.has(current.responseId) || played < current.received)) {
    // cut off: still being answered, or its audio not all heard; response.done adds the server's status
    current.turn.cancelled = true;
    current.li.classList.add("cancelled");
  }
  if (current?.itemId) {
    send({
      type: "conversation.item.truncate",
      item_id: current.itemId,
      content_index: 0,
      audio_end_ms: Math.max(0, Math.floor((played * 1000) / RATE)),
    });
  }
  current = null;
}

function onLog(message) {
  agent.logs.push(message);
  if (message === "camera_ignored") showError("The text model does not see: the camera's pictures are ignored");
  else if (message === "started_talking") setState("hearing you");
  else if (message === "pause_detected") {
    stoppedAt = performance.now();
    addTurn("user", "(a spoken turn)");
    setState("thinking");
  } else if (message === "response_starting") {
    addTurn("assistant", "(answering in speech)");
    setState("speaking");
  }
}

function iceGathered(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    pc.addEventListener("icegatheringstatechange", () => pc.iceGatheringState === "complete" && resolve());
  });
}

function watchLoudness(stream) {
  // Counts analyser frames with sound in them (for the page's numbers and for tests).
  const context = new AudioContext();
  const analyser = context.createAnalyser();
  context.createMediaStreamSource(stream).connect(analyser);
  const data = new Float32Array(analyser.fftSize);
  const tick = () => {
    if (!rtc) return context.close().catch(() => {});
    analyser.getFloatTimeDomainData(data);
    if (data.some((x) => Math.abs(x) > 0.03)) {
      agent.loudFrames += 1;
      if (stoppedAt !== null) {
        agent.latencyMs = performance.now() - stoppedAt;
        stoppedAt = null;
      }
      render();
    }
    setTimeout(tick, 20);
  };
  tick();
  return context;
}

async function startRtc() {
  const config = await (await fetch("rtc/config")).json();
  const pc = new RTCPeerConnection({ iceServers: config.iceServers });
  const channel = pc.createDataChannel("text"); // before the offer: fastrtc's tracks wait for it
  channel.onmessage = (message) => {
    const data = JSON.parse(message.data);
    if (data.type === "log") onLog(data.data);
  };
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: false, autoGainControl: false },
  });
  agent.camera.on = false;
  if ($("camera-on").checked) {
    try {
      const video = await navigator.mediaDevices.getUserMedia({ video: { width: 640, height: 480, frameRate: 15 } });
      video.getVideoTracks().forEach((track) => stream.addTrack(track));
      $("preview").srcObject = video;
      $("preview").hidden = false;
      agent.camera.on = true;
    } catch (err) {
      showError(`The camera was refused or is unavailable (${err.name}): talking without it`);
    }
  }
  stream.getTracks().forEach((track) => pc.addTrack(track, stream));
  rtc = { pc, stream, context: null };
  pc.ontrack = (event) => {
    if (event.track.kind !== "audio") return; // the camera route's self-view: the local preview shows the camera
    const remote = new MediaStream([event.track]);
    $("remote").srcObject = remote; // Chrome plays remote WebRTC audio only through a media element
    rtc.context = watchLoudness(remote);
  };
  pc.onconnectionstatechange = () => {
    agent.rtcState = pc.connectionState;
    if (pc.connectionState === "connected") setState("listening");
    if (pc.connectionState === "failed") {
      showError("WebRTC connection failed");
      stop();
    }
  };
  await pc.setLocalDescription(await pc.createOffer());
  await iceGathered(pc);
  const body = { sdp: pc.localDescription.sdp, type: "offer", webrtc_id: crypto.randomUUID() };
  const reply = await fetch(agent.camera.on ? "rtc/camera/webrtc/offer" : "rtc/webrtc/offer", {
    method: "POST",
    headers: { "Content-Type": "application/json", ...authHeaders(key()) }, // the offer needs the API key too
    body: JSON.stringify(body),
  });
  if (reply.status === 401) throw new Error((await refusedKey(key())) ?? "the server refused the API key");
  const answer = await reply.json();
  if (answer.status === "failed") throw new Error(answer.meta?.error ?? "the server refused the call");
  if (answer.error) throw new Error(answer.error.message);
  await pc.setRemoteDescription(answer);
}

async function start() {
  // a new session: the last one's errors (a refused key typed since, a closed connection) no longer apply
  $("errors").replaceChildren();
  agent.errors = [];
  explained = null;
  goingAway = false;
  setState("connecting");
  if (infoKey !== key()) await loadInfo(); // typed and clicked at once: the model and voices of this key first
  agent.transport = $("transport").value;
  if (agent.transport === "rtc") {
    try {
      await startRtc();
    } catch (err) {
      showError(`WebRTC: ${err.message}`);
      stop();
    }
    return;
  }
  try {
    audio = await openAudio();
  } catch (err) {
    showError(`Microphone or audio unavailable: ${err.message}`);
    setState("idle");
    return;
  }
  const used = key();
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const base = location.pathname.replace(/realtime\/?$/, "");
  const model = agent.model ? `?model=${encodeURIComponent(agent.model)}` : "";
  const ws = new WebSocket(`${scheme}://${location.host}${base}v1/realtime${model}`, socketProtocols(used));
  let opened = false;
  socket = ws;
  ws.onopen = () => (opened = true);
  ws.onmessage = (message) => onEvent(JSON.parse(message.data));
  ws.onclose = async (close) => {
    if (ws !== socket) return;
    // 1001 after the server said why (shutting down) is that same cause: no line of its own
    if (agent.state !== "idle" && close.code !== 1000 && !(close.code === 1001 && goingAway)) {
      const refused = opened ? null : await refusedKey(used);
      showError(refused ?? `Connection closed (${close.code}${close.reason ? `: ${close.reason}` : ""})`);
    }
    stop();
  };
}

function stop() {
  socket?.close(1000);
  socket = null;
  if (rtc) {
    rtc.stream.getTracks().forEach((track) => track.stop());
    rtc.pc.close();
    rtc = null;
  }
  $("preview").srcObject = null;
  $("preview").hidden = true;
  if (audio) {
    audio.stream.getTracks().forEach((track) => track.stop());
    audio.context.close().catch(() => {});
    audio = null;
  }
  current = null;
  responses.clear();
  playerBusy = false;
  setState("idle");
}

$("start").addEventListener("click", start);
$("stop").addEventListener("click", stop);
$("transport").addEventListener("change", updateCamera);
watchKey($("key"), () => {
  $("errors").replaceChildren();
  agent.errors = [];
  loadInfo();
});
loadInfo();
render();
