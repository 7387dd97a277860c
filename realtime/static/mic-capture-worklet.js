// Microphone capture: an AudioWorkletProcessor that posts mono float32 blocks of `blockSize` samples.
//
// Runs in an AudioContext at the rate the realtime session wants (24 kHz), so the browser resamples the
// microphone for us. Messages out: {type: "block", data: Float32Array} (transferred).

class MicCapture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.blockSize = options.processorOptions?.blockSize ?? 2400; // 100 ms at 24 kHz
    this.block = new Float32Array(this.blockSize);
    this.filled = 0;
  }

  process(inputs) {
    const channel = inputs[0]?.[0];
    if (!channel) return true;
    let i = 0;
    while (i < channel.length) {
      const n = Math.min(channel.length - i, this.blockSize - this.filled);
      this.block.set(channel.subarray(i, i + n), this.filled);
      this.filled += n;
      i += n;
      if (this.filled === this.blockSize) {
        this.port.postMessage({ type: "block", data: this.block }, [this.block.buffer]);
        this.block = new Float32Array(this.blockSize);
        this.filled = 0;
      }
    }
    return true;
  }
}

registerProcessor("mic-capture", MicCapture);
