// The operations page: the workers (/v1/workers), read again whenever /v1/events says a worker
// changed, and every second while one is busy (for the throughput and queue charts over the last
// five minutes); the models with load and unload and their effective settings; a box that pulls a
// model from Hugging Face with a progress bar; the usage ledger per day and model. Without the event stream (an older server, a proxy that buffers), it polls every second.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const { el } = G;
  const WINDOW_S = 300;
  const series = { t: [], tps: [], inflight: [], queued: [] };
  let previous = null; // {at, tokens: Map pid -> tokens_generated}
  let charts = null;

  function td(text, cls) { return el("td", cls ? { class: cls } : {}, text); }

  function chart(target, label, lines) {
    const width = Math.max(280, target.clientWidth || 300);
    const opts = {
      width, height: 150,
      legend: { show: true },
      // The last five minutes, however few points there are yet.
      scales: { x: { time: true, range: () => { const now = Date.now() / 1000; return [now - WINDOW_S, now]; } }, y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
      axes: [{ stroke: "#888", grid: { stroke: "rgba(128,128,128,.15)" } },
             { stroke: "#888", grid: { stroke: "rgba(128,128,128,.15)" }, size: 40 }],
      series: [{}, ...lines.map(([name, color]) => ({ label: name, stroke: color, width: 1.5, points: { show: false } }))],
    };
    return new uPlot(opts, [[], ...lines.map(() => [])], target);
  }

  function setupCharts() {
    if (typeof uPlot === "undefined") return;
    charts = {
      tps: chart($("chart-tps"), "tokens/s", [["tokens/s", "#3b5bdb"]]),
      queue: chart($("chart-queue"), "requests", [["in flight", "#2b8a3e"], ["queued", "#e8590c"]]),
    };
    window.addEventListener("resize", () => {
      for (const [id, c] of [["chart-tps", charts.tps], ["chart-queue", charts.queue]]) {
        c.setSize({ width: Math.max(280, $(id).clientWidth), height: 150 });
      }
    });
  }

  // Tokens per second over the last RATE_S seconds. /v1/workers counts a request's tokens when it
  // ends, so a per-second difference would be all spikes; a few seconds' window smooths them.
  const RATE_S = 5;
  let generated = 0; // tokens generated since the page opened, summed over the workers seen
  const totals = []; // [time, generated]

  function record(rows) {
    const now = Date.now() / 1000;
    const tokens = new Map(rows.map((w) => [w.pid, w.tokens_generated || 0]));
    if (previous) {
      for (const [pid, n] of tokens) {
        const before = previous.tokens.get(pid);
        if (before !== undefined && n >= before) generated += n - before;
      }
    }
    previous = { at: now, tokens };
    totals.push([now, generated]);
    while (totals.length > 1 && totals[0][0] < now - RATE_S) totals.shift();
    const span = now - totals[0][0];
    const rate = span > 0 ? (generated - totals[0][1]) / span : 0;
    series.t.push(now);
    series.tps.push(rate);
    series.inflight.push(rows.reduce((s, w) => s + Math.min(w.inflight || 0, w.parallel || 0), 0));
    series.queued.push(rows.reduce((s, w) => s + (w.queue_depth || 0), 0));
    while (series.t.length && series.t[0] < now - WINDOW_S) for (const k in series) series[k].shift();
    if (charts) {
      charts.tps.setData([series.t, series.tps]);
      charts.queue.setData([series.t, series.inflight, series.queued]);
    }
  }

  async function unload(w, button) {
    button.disabled = true;
    try {
      await G.call("/v1/models/unload", { json: { model: w.model, nctx: w.nctx, compute: w.compute } });
      G.banner("");
    } catch (e) {
      G.banner(e.status === 409 ? `${w.model} is serving a request; unload it when it is idle.` : e.message);
    }
    refresh();
  }

  async function load(m, button) {
    button.disabled = true;
    button.textContent = "loading…";
    try {
      await G.call("/v1/models/load", { json: { model: m.id } });
      G.banner("");
    } catch (e) { G.banner(e.message); }
    refreshModels();
  }

  async function refresh() {
    let table;
    try { table = await G.json("/v1/workers"); } catch (e) { G.banner(e.message); return; }
    const rows = table.data || [];
    $("workers").tBodies[0].replaceChildren(...rows.map((w) => el("tr", { "data-pid": w.pid },
      td(w.model), td(w.engine || ""), td(w.compute), td(w.nctx, "num"),
      el("td", { class: "state-" + w.state }, w.state), td(w.queue_depth, "num"), td(w.inflight, "num"),
      td(G.bytes(w.rss_bytes), "num"), td(w.tokens_generated, "num"), td(w.requests_served, "num"), td(w.pid ?? "", "num pid"),
      el("td", {}, el("button", { type: "button", class: "small", onclick: (ev) => unload(w, ev.target) }, "unload")))));
    $("no-workers").hidden = rows.length > 0;
    $("updated").textContent = "· updated " + new Date().toLocaleTimeString();
    record(rows);
  }

  // A model's effective settings, when the server's models file gives any: its aliases, its
  // default request settings, and where they come from.
  function settingsCell(m) {
    const parts = [];
    if ((m.aliases || []).length) parts.push("aliases: " + m.aliases.join(", "));
    for (const [k, v] of Object.entries(m.defaults || {})) parts.push(`${k}: ${JSON.stringify(v)}`);
    const cell = el("td", { class: "settings" }, parts.join("; "));
    if (m.defaults_source) cell.append(el("div", { class: "muted" }, "from " + m.defaults_source));
    return cell;
  }

  async function refreshModels() {
    let models;
    try { models = await G.models(); } catch (e) { G.banner(e.message); return; }
    $("models").tBodies[0].replaceChildren(...models.map((m) => el("tr", { "data-model": m.id },
      td(m.id), td(m.engine || ""), td((m.capabilities || []).join(", ")), td(G.bytes(m.size), "num"),
      td(m.served_context ?? m.context_length ?? "", "num"), td(m.compute || ""),
      el("td", { class: "state-" + (m.state || "") }, m.state || ""),
      td((m.loaded || []).map((r) => `${r.compute} ${r.nctx} ${r.state}`).join("; ")), settingsCell(m),
      el("td", {}, el("button", { type: "button", class: "small", onclick: (ev) => load(m, ev.target) }, "load")))));
  }

  // /v1/events, read with fetch() so that the API key goes along (an EventSource cannot send it).
  // Any event means a worker changed: the tables are read again (at most a few times a second).
  let streaming = false;
  let stream = null; // the AbortController of the current connection
  let pending = null;
  function changed() {
    if (pending) return;
    pending = setTimeout(() => { pending = null; refresh(); refreshModels(); }, 150);
  }
  async function follow() {
    if (stream) stream.abort();
    const mine = stream = new AbortController();
    try {
      const resp = await G.call("/v1/events", { signal: mine.signal, headers: { Accept: "text/event-stream" } });
      const reader = resp.body.getReader();
      const text = new TextDecoder();
      let buffered = "";
      streaming = true;
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        // Lines end in CRLF (or LF); a `data:` line is an event, a `:` line only a keep-alive.
        const lines = (buffered + text.decode(value, { stream: true })).split(/\r?\n/);
        buffered = lines.pop();
        if (lines.some((line) => line.startsWith("data:"))) changed();
      }
    } catch (_) { /* refused, aborted or cut: polled until it is back */ }
    if (stream !== mine) return; // replaced by a newer connection (a new key)
    streaming = false;
    setTimeout(follow, 5000);
  }

  // Every second while the stream is down or a worker is busy (the charts), else every ten.
  let lastPoll = 0;
  function tick() {
    const busy = $("workers").querySelector("td.state-busy") !== null;
    const every = !streaming || busy ? 1000 : 10000;
    if (Date.now() - lastPoll >= every) { lastPoll = Date.now(); refresh(); }
  }

  // Pull: POST /v1/models/pull read as Server-Sent Events with fetch() (the key goes along). Cancel
  // aborts the fetch; the server stops the download once no client follows it, and keeps nothing.
  let pulling = null; // the AbortController of the pull in progress
  function pullStatus(text, failed) {
    const status = $("pull-status");
    status.textContent = text;
    status.classList.toggle("error", !!failed);
    status.classList.toggle("muted", !failed);
  }

  function pullProgress(data) {
    const bar = $("pull-progress");
    if (data.total) {
      bar.max = data.total;
      bar.value = data.completed || 0;
      const pct = Math.floor((100 * (data.completed || 0)) / data.total);
      pullStatus(`${data.file || data.status}: ${G.bytes(data.completed || 0)} of ${G.bytes(data.total)} (${pct}%)`);
    } else {
      pullStatus(data.status);
    }
  }

  // Calls onEvent(event, data) for each event of an SSE body; returns when the body ends.
  async function readEvents(resp, onEvent) {
    const reader = resp.body.getReader();
    const text = new TextDecoder();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      const blocks = (buffered + text.decode(value, { stream: true })).split(/\r?\n\r?\n/);
      buffered = blocks.pop();
      for (const block of blocks) {
        let event = "message";
        const data = [];
        for (const line of block.split(/\r?\n/)) {
          if (line.startsWith("event:")) event = line.slice(6).trim();
          else if (line.startsWith("data:")) data.push(line.slice(5).trim());
        }
        if (data.length) onEvent(event, JSON.parse(data.join("\n")));
      }
    }
  }

  async function pull(ev) {
    ev.preventDefault();
    const name = $("pull-name").value.trim();
    if (!name || pulling) return;
    const mine = pulling = new AbortController();
    $("pull-start").disabled = true;
    $("pull-cancel").hidden = false;
    const bar = $("pull-progress");
    bar.value = 0;
    bar.hidden = false;
    pullStatus(`pulling ${name}…`);
    let outcome = null;
    try {
      const resp = await G.call("/v1/models/pull", {
        json: { model: name, stream: true }, signal: mine.signal, headers: { Accept: "text/event-stream" },
      });
      await readEvents(resp, (event, data) => {
        if (event === "progress") pullProgress(data);
        else if (event === "done") outcome = { id: data.id };
        else if (event === "error") outcome = { error: data.error };
      });
      if (outcome && outcome.id) {
        bar.value = bar.max;
        pullStatus(`pulled ${outcome.id}`);
        refreshModels();
      } else {
        pullStatus((outcome && outcome.error) || "the pull ended without an answer; try again", true);
      }
    } catch (e) {
      if (mine.signal.aborted) pullStatus(`cancelled the pull of ${name}`);
      else pullStatus(e.message, true);
    } finally {
      pulling = null;
      $("pull-start").disabled = false;
      $("pull-cancel").hidden = true;
      if (!(outcome && outcome.id)) bar.hidden = true;
    }
  }

  async function refreshUsage() {
    let rows;
    try { rows = (await G.json("/v1/usage")).data || []; } catch (e) { G.banner(e.message); return; }
    // The ledger keeps a row per day, model, key and user; this page sums the keys and users.
    const sums = new Map();
    for (const r of rows) {
      const k = r.day + "\u0000" + r.model;
      const s = sums.get(k) || { day: r.day, model: r.model, requests: 0, prompt_tokens: 0, completion_tokens: 0, total_tokens: 0, energy_j: 0, energy_tokens: 0 };
      for (const f of ["requests", "prompt_tokens", "completion_tokens", "total_tokens", "energy_j", "energy_tokens"]) s[f] += r[f] || 0;
      sums.set(k, s);
    }
    const sorted = [...sums.values()].sort((a, b) => (b.day + a.model).localeCompare(a.day + b.model));
    $("usage").tBodies[0].replaceChildren(...sorted.map((s) => el("tr", {},
      td(s.day), td(s.model), td(s.requests, "num"), td(s.prompt_tokens, "num"), td(s.completion_tokens, "num"), td(s.total_tokens, "num"),
      // Joules per token over the answers whose energy was measured; "—" where the machine reports none.
      td(s.energy_tokens ? (s.energy_j / s.energy_tokens).toPrecision(3) : "\u2014", "num"))));
  }

  document.addEventListener("DOMContentLoaded", () => {
    setupCharts();
    $("pull-form").addEventListener("submit", pull);
    $("pull-cancel").addEventListener("click", () => { if (pulling) pulling.abort(); });
    const all = () => { lastPoll = Date.now(); refresh(); refreshModels(); refreshUsage(); };
    all();
    follow();
    setInterval(tick, 1000);
    setInterval(() => { refreshModels(); refreshUsage(); }, 10000);
    document.addEventListener("geniex:key", () => { all(); follow(); });
  });
})();
