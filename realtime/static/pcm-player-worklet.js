// Gapless PCM16 player: an AudioWorkletProcessor fed little-endian mono PCM16 chunks through its port.
//
// Messages in (port.postMessage):
//   {type: "format", sampleRate}  input rate of the chunks that follow (resampled to the context rate if it differs)
//   {type: "pcm", data}           an ArrayBuffer of PCM16 LE mono samples (transfer it)
//   {type: "end"}                 no more chunks for now: draining the buffer to silence is not an underrun
//   {type: "flush"}               drop everything buffered (Stop)
//   {type: "reset", run}          flush and zero the counters; later stats carry ``run``
// Messages out: {type: "stats", run, frames, samplesIn, samplesPlayed, underruns, bufferedMs, playing}, a few per
// second and whenever a chunk arrives or playback starts or drains.

const PREBUFFER_MS = 60; // audio held before playback starts, so the first chunks do not stutter
const STATS_EVERY_S = 0.1;

class Ring {
  // A growable FIFO of float32 samples: chunks arrive faster than real time, so it must hold a whole utterance.
  constructor(capacity) {
    this.buf = new Float32Array(capacity);
    this.head = 0; // next read index
    this.size = 0;
  }

  push(samples, count) {
    if (this.size + count > this.buf.length) this.grow(this.size + count);
    let tail = (this.head + this.size) % this.buf.length;
    for (let i = 0; i < count; i++) {
      this.buf[tail] = samples[i];
      tail = tail + 1 === this.buf.length ? 0 : tail + 1;
    }
    this.size += count;
  }

  // Copies up to out.length samples into out; returns how many were available.
  pull(out) {
    const n = Math.min(out.length, this.size);
    for (let i = 0; i < n; i++) {
      out[i] = this.buf[this.head];
      this.head = this.head + 1 === this.buf.length ? 0 : this.head + 1;
    }
    this.size -= n;
    return n;
  }

  grow(needed) {
    let capacity = this.buf.length * 2;
    while (capacity < needed) capacity *= 2;
    const next = new Float32Array(capacity);
    const out = next.subarray(0, this.size);
    this.pull(out);
    this.size = out.length;
    this.buf = next;
    this.head = 0;
  }

  clear() {
    this.head = 0;
    this.size = 0;
  }
}

class LinearResampler {
  // Streaming linear interpolation from inRate to outRate, continuous across chunk boundaries.
  constructor(inRate, outRate) {
    this.step = inRate / outRate;
    this.pos = 0; // read position in the current chunk; -1 <= pos < 0 interpolates from the previous chunk's last sample
    this.prev = 0;
    this.out = new Float32Array(0);
  }

  // Returns [samples, count]; the array is reused by the next call.
  run(input) {
    const n = input.length;
    const max = Math.ceil((n + 1) / this.step) + 1;
    if (this.out.length < max) this.out = new Float32Array(max);
    let count = 0;
    let pos = this.pos;
    while (pos < n - 1) {
      const i = Math.floor(pos);
      const a = i < 0 ? this.prev : input[i];
      const b = input[i + 1];
      this.out[count++] = a + (b - a) * (pos - i);
      pos += this.step;
    }
    if (n > 0) {
      this.pos = pos - n;
      this.prev = input[n - 1];
    }
    return [this.out, count];
  }
}

class PcmPlayer extends AudioWorkletProcessor {
  constructor() {
    super();
    this.ring = new Ring(sampleRate * 10);
    this.resampler = null;
    this.carry = null; // the odd byte of a chunk that ended mid-sample
    this.playing = false; // draining the buffer to the output
    this.ended = true; // the stream said no more chunks are coming
    this.frames = 0;
    this.samplesIn = 0;
    this.samplesPlayed = 0;
    this.underruns = 0;
    this.lastStats = 0;
    this.run = 0;
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  onMessage(msg) {
    if (msg.type === "pcm") {
      this.ended = false;
      this.enqueue(msg.data);
      this.frames += 1;
    } else if (msg.type === "format") {
      this.resampler = msg.sampleRate === sampleRate ? null : new LinearResampler(msg.sampleRate, sampleRate);
      this.carry = null;
    } else if (msg.type === "end") {
      this.ended = true;
    } else if (msg.type === "flush" || msg.type === "reset") {
      this.ring.clear();
      this.carry = null;
      this.playing = false;
      this.ended = true;
      if (msg.type === "reset") {
        this.run = msg.run;
        this.frames = this.samplesIn = this.samplesPlayed = this.underruns = 0;
      }
    }
    this.report(true);
  }

  enqueue(buffer) {
    let bytes = new Uint8Array(buffer);
    if (this.carry !== null) {
      const joined = new Uint8Array(bytes.length + 1);
      joined[0] = this.carry;
      joined.set(bytes, 1);
      bytes = joined;
      this.carry = null;
    }
    if (bytes.length % 2 === 1) {
      this.carry = bytes[bytes.length - 1];
      bytes = bytes.subarray(0, bytes.length - 1);
    }
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
    const samples = new Float32Array(bytes.length / 2);
    for (let i = 0; i < samples.length; i++) samples[i] = view.getInt16(2 * i, true) / 32768;
    this.samplesIn += samples.length;
    if (this.resampler === null) {
      this.ring.push(samples, samples.length);
    } else {
      const [out, count] = this.resampler.run(samples);
      this.ring.push(out, count);
    }
  }

  process(inputs, outputs) {
    const channel = outputs[0][0];
    if (!this.playing && (this.ring.size >= (PREBUFFER_MS / 1000) * sampleRate || (this.ended && this.ring.size > 0))) {
      this.playing = true;
      this.report(true);
    }
    if (this.playing) {
      const got = this.ring.pull(channel);
      channel.fill(0, got);
      this.samplesPlayed += got;
      if (got < channel.length) {
        // Ran dry: an underrun unless the stream had ended; either way wait for a new prebuffer.
        if (!this.ended) this.underruns += 1;
        this.playing = false;
        this.report(true);
      }
    }
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(channel);
    this.report(false);
    return true;
  }

  report(now) {
    if (!now && currentTime - this.lastStats < STATS_EVERY_S) return;
    this.lastStats = currentTime;
    this.port.postMessage({
      type: "stats",
      run: this.run,
      frames: this.frames,
      samplesIn: this.samplesIn,
      samplesPlayed: this.samplesPlayed,
      underruns: this.underruns,
      bufferedMs: (1000 * this.ring.size) / sampleRate,
      playing: this.playing,
    });
  }
}

registerProcessor("pcm-player", PcmPlayer);
