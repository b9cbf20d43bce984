// The voice page's microphone tap, an AudioWorklet module (a file of its own: the CSP runs scripts
// from this server only, so neither inline code nor a blob: URL could be loaded as a worklet).
// It turns the microphone's float samples into what /v1/realtime takes, 16-bit mono PCM at 24 kHz,
// and posts it to the page in chunks of CHUNK_MS; {flush: true} from the page posts what is left
// at once (push to talk: the last words before the button is let go), tagged {flushed: true}.
"use strict";

const RATE = 24000;
const CHUNK_MS = 80;

class Capture extends AudioWorkletProcessor {
  constructor() {
    super();
    // `sampleRate` is the AudioContext's. The page asks for a 24 kHz context, and the browser
    // resamples the microphone into it; where it cannot (Firefox refuses to connect a microphone
    // to a context at another rate than the device's), the context runs at the device's rate and
    // the resampling happens here.
    this.step = sampleRate / RATE; // input samples per output sample
    this.seen = 0; // input samples read so far
    this.made = 0; // output samples made so far
    this.sum = 0; // the input samples of the output sample being made...
    this.count = 0; // ...and how many there are
    this.held = 0; // the last output value (upsampling repeats it)
    this.chunk = new Int16Array((RATE * CHUNK_MS) / 1000);
    this.filled = 0;
    this.port.onmessage = (e) => { if (e.data && e.data.flush) this.post(true); };
  }

  post(flushed) {
    const pcm = this.chunk.slice(0, this.filled);
    this.port.postMessage({ pcm: pcm.buffer, flushed }, [pcm.buffer]);
    this.filled = 0;
  }

  push(v) {
    this.chunk[this.filled++] = Math.max(-1, Math.min(1, v)) * 0x7fff;
    if (this.filled === this.chunk.length) this.post(false);
  }

  process(inputs) {
    const x = inputs[0] && inputs[0][0]; // the first channel: the page asks for a mono microphone
    if (!x) return true;
    for (let i = 0; i < x.length; i++) {
      // Each output sample is the mean of the input samples in its span (a box filter: downsampling
      // 48 kHz speech without its highs folding back into the band); at 24 kHz it is the sample itself.
      const k = Math.floor(this.seen++ / this.step);
      while (this.made < k) {
        if (this.count) { this.held = this.sum / this.count; this.sum = 0; this.count = 0; }
        this.push(this.held);
        this.made++;
      }
      this.sum += x[i];
      this.count++;
    }
    return true;
  }
}

registerProcessor("geniex-capture", Capture);
