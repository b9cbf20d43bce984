// Try-it panels, one per capability an installed model has (per /v1/models): embeddings,
// reranking, speech, transcription, OCR and image generation. Each calls the public route.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const { el } = G;
  const PANELS = ["embeddings", "rerank", "speech", "transcription", "ocr", "images"];

  const lines = (id) => $(id).value.split("\n").map((s) => s.trim()).filter(Boolean);
  const modelOf = (capability) => document.querySelector(`select.model[data-capability="${capability}"]`).value;

  async function guarded(button, work) {
    button.disabled = true;
    G.banner("");
    try { await work(); } catch (e) { G.banner(e.message); } finally { button.disabled = false; }
  }

  async function showPanels() {
    let models;
    try { models = await G.models(); } catch (e) { G.banner(e.message); return; }
    let shown = 0;
    for (const capability of PANELS) {
      const having = models.filter((m) => (m.capabilities || []).includes(capability));
      const panel = $("panel-" + capability);
      panel.hidden = having.length === 0;
      shown += having.length ? 1 : 0;
      const select = panel.querySelector("select.model");
      select.replaceChildren(...having.map((m) => el("option", { value: m.id }, m.id)));
    }
    $("none").hidden = shown > 0;
  }

  // --- embeddings: cosine similarity of every pair ------------------------------------------

  async function embeddings() {
    const texts = lines("emb-input").slice(0, 12);
    const body = await G.json("/v1/embeddings", { json: { model: modelOf("embeddings"), input: texts } });
    const vectors = body.data.sort((a, b) => a.index - b.index).map((d) => d.embedding);
    const cos = (a, b) => {
      let dot = 0, na = 0, nb = 0;
      for (let i = 0; i < a.length; i++) { dot += a[i] * b[i]; na += a[i] * a[i]; nb += b[i] * b[i]; }
      return dot / Math.sqrt(na * nb);
    };
    const short = (t) => (t.length > 24 ? t.slice(0, 23) + "…" : t);
    const head = el("tr", {}, el("th", {}), ...texts.map((t, i) => el("th", { title: t }, `${i + 1}. ${short(t)}`)));
    const rows = vectors.map((a, i) => el("tr", {}, el("th", { title: texts[i] }, `${i + 1}. ${short(texts[i])}`),
      ...vectors.map((b) => {
        const s = cos(a, b);
        const cell = el("td", {}, s.toFixed(2));
        cell.style.backgroundColor = `rgba(59, 91, 219, ${Math.max(0, s).toFixed(2)})`; // CSSOM, allowed by the CSP
        if (s > 0.6) cell.style.color = "#fff";
        return cell;
      })));
    $("emb-matrix").replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
  }

  // --- reranking -----------------------------------------------------------------------------

  async function rerank() {
    const documents = lines("rr-docs");
    const body = await G.json("/v1/reranking", { json: { model: modelOf("rerank"), query: $("rr-query").value, documents, normalize: true } });
    const ranked = documents.map((d, i) => ({ d, s: body.result[i] })).sort((a, b) => b.s - a.s);
    const top = Math.max(...ranked.map((r) => Math.abs(r.s)), 1e-9);
    $("rr-out").replaceChildren(...ranked.map((r) => {
      const bar = el("span", { class: "bar" });
      bar.style.width = `${Math.round(120 * Math.max(0, r.s) / top)}px`;
      return el("li", {}, bar, el("code", {}, r.s.toFixed(3)), " ", r.d);
    }));
  }

  // --- speech --------------------------------------------------------------------------------

  let audioUrl = null;
  async function speech() {
    const resp = await G.call("/v1/audio/speech", { json: { model: modelOf("speech"), input: $("tts-input").value } });
    if (audioUrl) URL.revokeObjectURL(audioUrl);
    audioUrl = URL.createObjectURL(await resp.blob());
    const audio = $("tts-audio");
    audio.src = audioUrl;
    audio.hidden = false;
    audio.play().catch(() => { /* autoplay refused: the controls are there */ });
  }

  // --- transcription -------------------------------------------------------------------------

  let recorded = null;
  let recorder = null;
  async function record(button) {
    if (recorder) { recorder.stop(); return; }
    const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    const parts = [];
    recorder = new MediaRecorder(stream);
    recorder.ondataavailable = (e) => parts.push(e.data);
    recorder.onstop = () => {
      recorded = new Blob(parts, { type: recorder.mimeType });
      stream.getTracks().forEach((t) => t.stop());
      recorder = null;
      button.textContent = "Record";
    };
    recorder.start();
    button.textContent = "Stop recording";
  }

  async function transcribe() {
    const file = $("stt-file").files[0] || recorded;
    if (!file) throw new Error("Choose an audio file or record one first.");
    const form = new FormData();
    form.append("model", modelOf("transcription"));
    form.append("file", file, file.name || "recording.webm");
    form.append("response_format", "json");
    const body = await G.json("/v1/audio/transcriptions", { method: "POST", body: form });
    $("stt-out").textContent = body.text;
  }

  // --- OCR -----------------------------------------------------------------------------------

  function readAsDataURL(file) {
    return new Promise((resolve, reject) => {
      const r = new FileReader();
      r.onload = () => resolve(r.result);
      r.onerror = () => reject(r.error);
      r.readAsDataURL(file);
    });
  }

  async function ocr(file) {
    const url = await readAsDataURL(file);
    const body = await G.json("/v1/cv", { json: { model: modelOf("ocr"), image: url } });
    const img = new Image();
    img.src = url;
    await img.decode();
    const canvas = $("ocr-canvas");
    canvas.width = img.naturalWidth;
    canvas.height = img.naturalHeight;
    const g = canvas.getContext("2d");
    g.drawImage(img, 0, 0);
    g.strokeStyle = "#e8590c";
    g.lineWidth = Math.max(2, img.naturalWidth / 400);
    for (const r of body.results) g.strokeRect(r.bbox.x, r.bbox.y, r.bbox.width, r.bbox.height);
    canvas.hidden = false;
    $("ocr-out").replaceChildren(...body.results.map((r) => el("li", {}, r.label, " ", el("span", { class: "muted" }, `(${r.confidence.toFixed(2)})`))));
  }

  // --- images --------------------------------------------------------------------------------

  async function image() {
    const steps = parseInt($("img-steps").value, 10) || 4;
    const body = await G.json("/v1/images/generations", {
      json: { model: modelOf("images"), prompt: $("img-prompt").value, size: "256x256", num_inference_steps: steps },
    });
    const out = $("img-out");
    out.src = "data:image/png;base64," + body.data[0].b64_json;
    out.hidden = false;
  }

  document.addEventListener("DOMContentLoaded", () => {
    const on = (id, work) => $(id).addEventListener("click", (ev) => guarded(ev.target, work));
    on("emb-run", embeddings);
    on("rr-run", rerank);
    on("tts-run", speech);
    on("stt-run", transcribe);
    $("stt-record").addEventListener("click", (ev) => record(ev.target).catch((e) => G.banner(e.message)));
    on("img-run", image);
    $("ocr-file").addEventListener("change", (ev) => { if (ev.target.files[0]) ocr(ev.target.files[0]).catch((e) => G.banner(e.message)); });
    const drop = $("ocr-drop");
    drop.addEventListener("dragover", (ev) => { ev.preventDefault(); drop.classList.add("over"); });
    drop.addEventListener("dragleave", () => drop.classList.remove("over"));
    drop.addEventListener("drop", (ev) => {
      ev.preventDefault();
      drop.classList.remove("over");
      const f = ev.dataTransfer.files[0];
      if (f) ocr(f).catch((e) => G.banner(e.message));
    });
    document.addEventListener("geniex:key", showPanels);
    showPanels();
  });
})();
