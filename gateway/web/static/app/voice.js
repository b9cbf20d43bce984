// The voice page: a spoken conversation with a chat model over /v1/realtime (OpenAI's Realtime API
// on a WebSocket). The microphone goes up as 24 kHz 16-bit PCM (voice-worklet.js cuts it), the
// answer comes back as the same PCM and plays as it arrives, and both sides' words show as they
// stream. Hands-free, the server's voice activity detection takes the turns and stops an answer the
// user speaks over; push to talk, the page commits the audio when the button or space bar is let go.
// Everything the server says is shown with textContent, never parsed as HTML.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const { el } = G;
  const RATE = 24000; // the Realtime API's PCM, both ways
  const BYTES_PER_MS = (RATE * 2) / 1000;
  const MIN_TURN_MS = 100; // the least audio the server commits

  let s = null; // the session in progress: its socket, audio contexts, microphone and turn state
  const entries = new Map(); // conversation item id -> its line in the transcript

  const mode = () => document.querySelector('input[name="mode"]:checked').value; // "vad" or "ptt"
  const live = () => s && s.ready && s.ws.readyState === WebSocket.OPEN;
  const send = (ev) => { if (live()) s.ws.send(JSON.stringify(ev)); };

  // --- the status line and errors ------------------------------------------------------------

  function status(state, text) {
    const line = $("status");
    line.dataset.state = state;
    line.textContent = text;
  }

  function showError(message) {
    $("voice-error").textContent = message || "";
    $("voice-error").hidden = !message;
  }

  // What the user sees now, from the session's state (called after anything changes).
  function render() {
    if (!s) return;
    const ptt = mode() === "ptt";
    $("talk").hidden = !ptt;
    if (!s.ready) status("connecting", "Connecting…");
    else if (s.holding) status("recording", "Recording: let go to send.");
    else if (s.hearing) status("hearing", "Hearing you…");
    else if (s.playing.size) status("speaking", ptt ? "Speaking (hold to talk over it)." : "Speaking (talk to interrupt).");
    else if (s.waiting || s.responding) status("thinking", "Thinking…");
    else status("listening", ptt ? "Ready: hold the button or the space bar to talk." : "Listening: just speak.");
  }

  // --- the transcript --------------------------------------------------------------------------

  function entry(itemId, role) {
    let e = entries.get(itemId);
    if (!e) {
      const body = el("div", { class: "body" });
      const stats = el("div", { class: "stats" });
      const li = el("li", { class: `msg ${role}`, "data-item": itemId, "data-state": "pending" },
        el("div", { class: "role" }, role === "user" ? "You" : "Assistant"), body, stats);
      $("transcript").append(li);
      li.scrollIntoView({ block: "nearest" });
      e = { li, body, stats, text: "", audioMs: 0 };
      entries.set(itemId, e);
    }
    return e;
  }

  function write(e, text, state) {
    e.text = text;
    e.body.textContent = text;
    if (state) e.li.dataset.state = state;
  }

  // --- playback: each audio delta an AudioBuffer, queued back to back ------------------------

  function play(e, b64) {
    const bin = atob(b64);
    const n = bin.length >> 1;
    if (!n) return;
    const buf = s.audio.createBuffer(1, n, RATE); // played at the context's rate, resampled if it differs
    const ch = buf.getChannelData(0);
    for (let i = 0; i < n; i++) {
      const v = bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8); // little-endian 16-bit
      ch[i] = (v > 0x7fff ? v - 0x10000 : v) / 32768;
    }
    const src = s.audio.createBufferSource();
    src.buffer = buf;
    src.connect(s.audio.destination);
    // Right after what is queued; when the queue ran dry, a little ahead of now, so that the first
    // chunk (or one that came late) starts whole instead of clipped.
    const at = Math.max(s.playEnd, s.audio.currentTime + 0.03);
    src.start(at);
    s.playEnd = at + buf.duration;
    s.playingItem = e;
    e.audioMs += n / (RATE / 1000);
    const mine = s;
    s.playing.add(src);
    src.onended = () => { mine.playing.delete(src); if (!mine.playing.size) render(); };
  }

  // Stop the answer's audio at once. `truncate`: also tell the server how much of the item was
  // heard, so that the conversation (what the model reads next turn) holds only that.
  function silence(truncate) {
    if (!s) return;
    const e = s.playingItem;
    const left = s.audio ? Math.max(0, s.playEnd - s.audio.currentTime) * 1000 : 0;
    for (const src of s.playing) { src.onended = null; try { src.stop(); } catch (_) { /* not started */ } }
    s.playing.clear();
    s.playEnd = 0;
    s.playingItem = null;
    if (truncate && e && left > 1) {
      e.heardMs = Math.max(0, Math.floor(e.audioMs - left));
      e.li.dataset.interrupted = "true";
      note(e, "");
      send({ type: "conversation.item.truncate", item_id: e.li.dataset.item, content_index: 0, audio_end_ms: e.heardMs });
    }
  }

  // The user talks over the answer: stop it here; push to talk, stop it on the server too (hands-free,
  // the server cancels it itself when it hears the speech start).
  function interrupt(cancel) {
    s.cut = s.responding; // deltas of that response still on their way are not played
    silence(true);
    if (cancel && s.responding) send({ type: "response.cancel", response_id: s.responding });
  }

  // --- capture: the microphone through the worklet, appended as it comes ---------------------

  async function openMic(mine) {
    if (!navigator.mediaDevices) throw new Error("The browser offers the microphone only to pages over https or on localhost.");
    const mic = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    if (s !== mine) { mic.getTracks().forEach((t) => t.stop()); return; } // stopped meanwhile
    mine.mic = mic;
    let ctx = mine.audio;
    let source;
    try {
      source = ctx.createMediaStreamSource(mic);
    } catch (_) {
      // Firefox takes a microphone only into a context at the device's rate: capture in one of
      // those, and the worklet resamples to 24 kHz.
      ctx = mine.captureCtx = new AudioContext();
      source = ctx.createMediaStreamSource(mic);
    }
    await ctx.audioWorklet.addModule("/static/app/voice-worklet.js");
    if (s !== mine) return;
    // No outputs: the node only listens (a node without outputs is pulled by the context anyway).
    mine.tap = new AudioWorkletNode(ctx, "geniex-capture",
      { numberOfInputs: 1, numberOfOutputs: 0, channelCount: 1, channelCountMode: "explicit" });
    mine.tap.port.onmessage = (m) => { if (s === mine) chunk(m.data); };
    source.connect(mine.tap);
  }

  function chunk({ pcm, flushed }) {
    const ptt = mode() === "ptt";
    // Hands-free, everything goes up (the server listens for turns); push to talk, what was
    // recorded while held, up to the flush that answered the release.
    if (pcm.byteLength && (ptt ? s.turnOpen : true)) {
      const bytes = new Uint8Array(pcm);
      let bin = "";
      for (let i = 0; i < bytes.length; i += 0x2000) bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x2000));
      send({ type: "input_audio_buffer.append", audio: btoa(bin) });
      if (ptt) s.heldMs += bytes.length / BYTES_PER_MS;
    }
    if (flushed && s.turnOpen) endTurn();
  }

  // --- push to talk ------------------------------------------------------------------------------

  function press() {
    if (!live() || mode() !== "ptt" || s.holding) return;
    showError("");
    interrupt(true);
    send({ type: "input_audio_buffer.clear" }); // nothing but this turn's audio
    Object.assign(s, { holding: true, turnOpen: true, heldMs: 0 });
    $("talk").setAttribute("aria-pressed", "true");
    render();
  }

  function release() {
    if (!s || !s.holding) return;
    s.holding = false;
    $("talk").setAttribute("aria-pressed", "false");
    s.tap.port.postMessage({ flush: true }); // its answer (the last words) ends the turn: endTurn
    render();
  }

  function endTurn() {
    s.turnOpen = false;
    if (s.heldMs < MIN_TURN_MS) {
      send({ type: "input_audio_buffer.clear" });
      showError("That was too short to send: hold the button (or the space bar) while you speak.");
      return;
    }
    s.committing = true; // response.create follows the server's input_audio_buffer.committed
    s.waiting = true;
    send({ type: "input_audio_buffer.commit" });
    render();
  }

  // --- the session ------------------------------------------------------------------------------

  function configure() {
    const tokens = parseInt($("max-tokens").value, 10);
    send({
      type: "session.update",
      session: {
        type: "realtime", model: $("model").value, instructions: $("instructions").value,
        output_modalities: ["audio"], max_output_tokens: tokens > 0 ? tokens : "inf",
        audio: { input: { transcription: { model: "whisper-1" },
                          turn_detection: mode() === "vad" ? { type: "server_vad" } : null } },
      },
    });
  }

  function finish(r) {
    for (const item of r.output || []) {
      const e = entries.get(item.id);
      if (!e || item.type !== "message") continue;
      const part = (item.content || [])[0] || {};
      // What the model said, even where it was cut (dimmed then; the server keeps only what was heard).
      write(e, e.text || part.transcript || part.text || "", r.status);
      note(e, r.status);
      e.li.dataset.audioMs = String(Math.round(e.audioMs));
    }
  }

  // An answer's footnote: how long it spoke, and whether it was cut.
  function note(e, status) {
    const secs = (ms) => `${(ms / 1000).toFixed(1)} s`;
    const notes = [];
    if (e.heardMs !== undefined) notes.push(`interrupted after ${secs(e.heardMs)} of ${secs(e.audioMs)} of speech`);
    else if (e.audioMs) notes.push(`${secs(e.audioMs)} of speech`);
    if (status === "cancelled" && e.heardMs === undefined) notes.push("interrupted");
    if (status === "incomplete") notes.push("cut at the token limit");
    e.stats.textContent = notes.join(" · ");
  }

  function handle(ev) {
    switch (ev.type) {
      case "session.created":
        s.ready = true;
        configure();
        break;
      case "error": {
        const err = ev.error || {};
        if (err.code === "response_cancel_not_active") break; // it ended just before our cancel
        if (err.code === "input_audio_buffer_commit_empty") s.committing = s.waiting = false;
        if ((err.param || "").startsWith("session.audio.input.turn_detection")) {
          // No voice activity model on this server: push to talk is what is left.
          document.querySelector('input[name="mode"][value="ptt"]').checked = true;
          document.querySelector('input[name="mode"][value="vad"]').disabled = true;
          configure();
        }
        showError(err.message || "The server reported an error.");
        break;
      }
      case "input_audio_buffer.speech_started":
        s.hearing = true;
        interrupt(false);
        entry(ev.item_id, "user");
        break;
      case "input_audio_buffer.speech_stopped":
        s.hearing = false;
        s.waiting = true;
        break;
      case "input_audio_buffer.committed":
        entry(ev.item_id, "user");
        if (s.committing) {
          s.committing = false;
          send({ type: "response.create" });
        }
        break;
      case "conversation.item.input_audio_transcription.delta": {
        const e = entry(ev.item_id, "user");
        write(e, e.text + ev.delta, "streaming");
        break;
      }
      case "conversation.item.input_audio_transcription.completed": {
        const e = entry(ev.item_id, "user");
        write(e, ev.transcript, "done");
        if (!ev.transcript) e.stats.textContent = "nothing heard";
        break;
      }
      case "conversation.item.input_audio_transcription.failed":
        entry(ev.item_id, "user").stats.textContent = "not transcribed: " + ((ev.error || {}).message || "");
        break;
      case "response.created":
        s.responding = ev.response.id;
        break;
      case "response.output_audio_transcript.delta":
      case "response.output_text.delta": {
        const e = entry(ev.item_id, "assistant");
        write(e, e.text + ev.delta, "streaming");
        break;
      }
      case "response.output_audio.delta":
        if (ev.response_id !== s.cut) play(entry(ev.item_id, "assistant"), ev.delta);
        break;
      case "response.done": {
        const r = ev.response;
        if (s.responding === r.id) s.responding = null;
        s.waiting = false;
        if (r.status === "cancelled") silence(false);
        if (r.status === "failed") showError(((r.status_details || {}).error || {}).message || "The answer failed.");
        finish(r);
        break;
      }
      default:
        return; // nothing shown changes
    }
    render();
  }

  function connect(mine, model) {
    const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/realtime?model=${encodeURIComponent(model)}`;
    const key = G.apiKey();
    // A browser cannot set headers on a WebSocket: the key goes as a subprotocol, as OpenAI's
    // browser clients send it (the server answers "realtime").
    const ws = (mine.ws = new WebSocket(url, key ? ["realtime", "openai-insecure-api-key." + key] : ["realtime"]));
    ws.onmessage = (m) => { if (s === mine) handle(JSON.parse(m.data)); };
    ws.onclose = (e) => {
      if (s !== mine) return;
      // The server says why in an `error` event before it closes (already shown); a connection
      // refused at the handshake (a key, the page's origin) reaches the page only as a close.
      if (!mine.ready) {
        showError("The server refused the voice session" +
          (e.reason ? `: ${e.reason}` : key ? " (is the API key right?)" : " (does it need an API key? Enter it at the top)."));
      }
      stop(mine.ready ? "The session ended." : "");
    };
  }

  async function start() {
    showError("");
    const model = $("model").value;
    if (!model) { showError("No chat model is installed: `geniex pull org/repo` fetches one."); return; }
    const mine = (s = {
      ws: null, audio: null, captureCtx: null, mic: null, tap: null, ready: false,
      holding: false, turnOpen: false, heldMs: 0, committing: false, hearing: false, waiting: false,
      responding: null, cut: null, playing: new Set(), playEnd: 0, playingItem: null,
    });
    $("start").hidden = true;
    $("stop").hidden = false;
    status("connecting", "Asking for the microphone…");
    // Made in the click itself: a browser lets an AudioContext play only when a gesture made it.
    try { mine.audio = new AudioContext({ sampleRate: RATE }); } catch (_) { mine.audio = new AudioContext(); }
    try {
      await openMic(mine);
      if (s !== mine) return;
      connect(mine, model);
      render();
    } catch (e) {
      if (s !== mine) return;
      stop("");
      const refused = e.name === "NotAllowedError" || e.name === "SecurityError";
      showError(refused ? "The microphone was refused: allow it for this page in the browser's site settings."
        : e.name === "NotFoundError" ? "No microphone was found." : e.message);
    }
  }

  // End the session: the socket closed, the microphone released, the audio stopped.
  function stop(message) {
    const mine = s;
    if (!mine) return;
    silence(false);
    s = null;
    if (mine.ws) { mine.ws.onclose = null; if (mine.ws.readyState <= WebSocket.OPEN) mine.ws.close(1000); }
    if (mine.mic) mine.mic.getTracks().forEach((t) => t.stop());
    if (mine.tap) { mine.tap.port.onmessage = null; mine.tap.disconnect(); }
    for (const ctx of [mine.audio, mine.captureCtx]) if (ctx) ctx.close().catch(() => { /* closed */ });
    $("start").hidden = false;
    $("stop").hidden = true;
    $("talk").hidden = true;
    $("talk").setAttribute("aria-pressed", "false");
    status("stopped", message || "Stopped: the microphone is off.");
  }

  // --- models ------------------------------------------------------------------------------------

  async function loadModels() {
    await G.chatModels($("model"));
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("start").addEventListener("click", start);
    $("stop").addEventListener("click", () => stop(""));
    const talk = $("talk");
    talk.addEventListener("pointerdown", (e) => { talk.setPointerCapture(e.pointerId); press(); });
    talk.addEventListener("pointerup", release);
    talk.addEventListener("pointercancel", release);
    // The space bar talks too, but not while typing in a field.
    const typing = 'input:not([type="radio"]):not([type="checkbox"]), textarea, select';
    const spaceBar = (e) => e.code === "Space" && s && mode() === "ptt" && !e.target.closest(typing);
    document.addEventListener("keydown", (e) => {
      if (!spaceBar(e)) return;
      e.preventDefault(); // no scrolling, no click on a focused button
      if (!e.repeat) press();
    });
    document.addEventListener("keyup", (e) => { if (spaceBar(e)) { e.preventDefault(); release(); } });
    window.addEventListener("blur", release); // a key let go in another window never comes back here
    window.addEventListener("pagehide", () => stop(""));
    for (const id of ["model", "instructions", "max-tokens"]) $(id).addEventListener("change", () => { if (live()) configure(); });
    for (const radio of document.querySelectorAll('input[name="mode"]')) {
      radio.addEventListener("change", () => {
        if (!s) return;
        release();
        Object.assign(s, { hearing: false, turnOpen: false });
        configure();
        render();
      });
    }
    document.addEventListener("geniex:key", loadModels);
    loadModels();
  });
})();
