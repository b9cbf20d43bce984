// The chat playground: streams /v1/chat/completions and renders the answer as Markdown.
// Model output reaches the DOM only through render(): marked with raw HTML escaped to text,
// then DOMPurify; the page's CSP forbids inline and foreign scripts besides.
"use strict";

(() => {
  const STORE = "geniex.conversations";
  const $ = (id) => document.getElementById(id);
  const { el } = G;

  let conversations = [];
  let current = null; // the conversation shown
  let controller = null; // the AbortController of the answer streaming now
  let hljsState = "none"; // highlight.js is fetched the first time an answer has a code block

  // --- Markdown -------------------------------------------------------------------------------

  function escapeHtml(s) {
    return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }

  // HTML the model writes is shown as the text it is, never interpreted. A Markdown image becomes a
  // link: an answer must not make the browser fetch anything (a tracking pixel, another host).
  marked.use({ gfm: true, breaks: true, renderer: {
    html: (token) => escapeHtml(token.text),
    image: (token) => `<a href="${escapeHtml(token.href || "")}">${escapeHtml("image: " + (token.text || token.href || ""))}</a>`,
  } });

  function markdown(text) {
    const html = marked.parse(text || "");
    return DOMPurify.sanitize(html, { FORBID_TAGS: ["style", "form", "input", "button", "textarea", "iframe"],
                                      FORBID_ATTR: ["style"] });
  }

  function loadHighlighter() {
    if (hljsState !== "none") return;
    hljsState = "loading";
    const s = document.createElement("script");
    s.src = "/static/vendor/highlight/highlight.min.js";
    s.onload = () => { hljsState = "ready"; document.querySelectorAll(".msg .body pre code").forEach(highlight); };
    document.head.append(s);
    const css = document.createElement("link");
    css.rel = "stylesheet";
    css.href = "/static/vendor/highlight/github-dark.min.css";
    document.head.append(css);
  }

  function highlight(code) {
    if (code.dataset.highlighted) return;
    if (hljsState !== "ready") { loadHighlighter(); return; }
    window.hljs.highlightElement(code);
  }

  // --- storage --------------------------------------------------------------------------------

  function load() {
    try { conversations = JSON.parse(localStorage.getItem(STORE) || "[]"); } catch (_) { conversations = []; }
    if (!Array.isArray(conversations)) conversations = [];
  }

  function save() {
    try { localStorage.setItem(STORE, JSON.stringify(conversations)); } catch (_) { /* full: keep in memory */ }
  }

  function newConversation() {
    if (current && !current.messages.length) return; // the one shown is still empty: use it
    current = { id: String(Date.now()) + Math.random().toString(16).slice(2, 6), title: "New chat", messages: [] };
    conversations.unshift(current);
    save();
    showList();
    showMessages();
  }

  function showList() {
    const list = $("conversations");
    list.replaceChildren(...conversations.map((c) => el("li", { class: c === current ? "current" : "" },
      el("a", { onclick: () => { if (!controller) { current = c; showList(); showMessages(); } } }, c.title),
      el("button", { type: "button", title: "delete", "aria-label": "delete conversation", onclick: () => remove(c) }, "×"))));
  }

  function remove(c) {
    if (controller && c === current) return;
    conversations = conversations.filter((x) => x !== c);
    save();
    if (c === current) {
      if (conversations.length) { current = conversations[0]; showList(); showMessages(); } else newConversation();
    } else showList();
  }

  // --- rendering ------------------------------------------------------------------------------

  function messageNode(m) {
    const node = el("li", { class: "msg " + m.role });
    node.append(el("div", { class: "role" }, m.role === "user" ? "you" : m.model || "assistant"));
    if (m.role === "user") {
      node.append(el("div", { class: "body" }, m.content));
      return node;
    }
    const reasoning = el("details", { class: "reasoning", hidden: true }, el("summary", {}, "Reasoning"), el("div", { class: "reasoning-body" }));
    node.append(reasoning, el("div", { class: "tools", hidden: true }), el("div", { class: "body answer-body" }), el("div", { class: "stats" }));
    render(node, m);
    return node;
  }

  function render(node, m) {
    const reasoning = node.querySelector("details.reasoning");
    if (m.reasoning) {
      reasoning.hidden = false;
      reasoning.querySelector(".reasoning-body").innerHTML = markdown(m.reasoning);
      if (m.state === "streaming" && !m.content) reasoning.open = true;
    }
    const tools = node.querySelector(".tools");
    if (m.tool_calls && m.tool_calls.length) {
      tools.hidden = false;
      tools.replaceChildren(...m.tool_calls.map((t) => el("div", { class: "tool-call" },
        el("strong", {}, "tool call: "), el("code", {}, t.function.name || "?"), el("pre", {}, t.function.arguments || ""))));
    }
    const body = node.querySelector(".body");
    body.innerHTML = markdown(m.content);
    body.querySelectorAll("pre code").forEach(highlight);
    node.dataset.state = m.state || "done";
    const stats = node.querySelector(".stats");
    stats.replaceChildren();
    if (m.error) stats.append(el("span", { class: "error" }, m.error));
    if (m.stats) stats.append(statsText(m));
  }

  function statsText(m) {
    const s = m.stats;
    const parts = [];
    if (s.ttft_ms !== undefined) parts.push(`first token ${(s.ttft_ms / 1000).toFixed(2)} s`);
    if (s.tps !== undefined) parts.push(`${s.tps.toFixed(1)} tok/s`);
    if (s.completion_tokens !== undefined) parts.push(`${s.completion_tokens} tokens`);
    if (s.prompt_tokens !== undefined) parts.push(`prompt ${s.prompt_tokens} tokens (${s.cached_tokens || 0} from cache)`);
    if (s.finish_reason) parts.push(s.finish_reason === "length" ? "stopped at max tokens" : s.finish_reason);
    if (m.state === "stopped") parts.push("stopped");
    return parts.join(" · ");
  }

  function showMessages() {
    $("messages").replaceChildren(...current.messages.map(messageNode));
    scrollDown();
  }

  function scrollDown() {
    const box = $("messages");
    box.scrollTop = box.scrollHeight;
  }

  // --- models ---------------------------------------------------------------------------------

  let models = [];

  async function loadModels() {
    try {
      models = (await G.models()).filter((m) => (m.capabilities || []).includes("chat"));
      G.banner(models.length ? "" : "No chat model is installed: `geniex pull org/repo` fetches one.");
    } catch (e) {
      G.banner(e.message);
      return;
    }
    const select = $("model");
    const chosen = select.value || (current && current.model);
    select.replaceChildren(...models.map((m) => el("option", { value: m.id },
      `${m.id}${m.loaded && m.loaded.length ? " · loaded" : ""}`)));
    if (chosen && models.some((m) => m.id === chosen)) select.value = chosen;
    describeModel();
  }

  function describeModel() {
    const m = models.find((x) => x.id === $("model").value);
    $("model-info").textContent = m ? `${(m.capabilities || []).join(", ")}` +
      (m.context_length ? ` · context ${m.context_length}` : "") +
      (m.loaded && m.loaded.length ? ` · loaded (${m.loaded.map((r) => r.state).join(", ")})` : " · not loaded") : "";
  }

  // --- sending --------------------------------------------------------------------------------

  function requestBody(model, text) {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    for (const m of current.messages) {
      if (m.role === "user") messages.push({ role: "user", content: m.content });
      else if (m.content || m.tool_calls) {
        const a = { role: "assistant", content: m.content || "" };
        if (m.tool_calls && m.tool_calls.length) a.tool_calls = m.tool_calls;
        messages.push(a);
      }
    }
    messages.push({ role: "user", content: text });
    const reasoning = $("reasoning").checked;
    const body = { model, messages, stream: true, stream_options: { include_usage: true },
                   enable_think: reasoning, reasoning_format: reasoning ? "auto" : "none" };
    const t = parseFloat($("temperature").value);
    if (!Number.isNaN(t)) body.temperature = t;
    const n = parseInt($("max-tokens").value, 10);
    if (n > 0) body.max_tokens = n;
    const extra = $("extra").value.trim();
    if (extra) {
      let fields;
      try { fields = JSON.parse(extra); } catch (e) { throw new Error("More request fields: not JSON (" + e.message + ")"); }
      if (typeof fields !== "object" || fields === null || Array.isArray(fields)) throw new Error("More request fields: a JSON object, please");
      Object.assign(body, fields);
    }
    return body;
  }

  // Server-sent events from a fetch body: one JSON chunk per `data:` event, `[DONE]` at the end.
  async function* events(resp) {
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
        if (!data) continue;
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }

  function merge(m, delta) {
    if (delta.content) m.content += delta.content;
    const r = delta.reasoning_content || delta.reasoning;
    if (r) m.reasoning = (m.reasoning || "") + r;
    for (const t of delta.tool_calls || []) {
      m.tool_calls = m.tool_calls || [];
      const i = t.index || 0;
      const call = m.tool_calls[i] || (m.tool_calls[i] = { id: "", type: "function", function: { name: "", arguments: "" } });
      if (t.id) call.id = t.id;
      if (t.function && t.function.name) call.function.name += t.function.name;
      if (t.function && t.function.arguments) call.function.arguments += t.function.arguments;
    }
  }

  async function send(text) {
    const model = $("model").value;
    if (!model) { G.banner("Choose a model first."); return; }
    current.model = model;
    if (!current.messages.length) current.title = text.slice(0, 40);
    let body;
    try { body = requestBody(model, text); } catch (e) { G.banner(e.message); return; }
    G.banner("");
    current.messages.push({ role: "user", content: text });
    const m = { role: "assistant", model, content: "", state: "streaming", stats: {} };
    current.messages.push(m);
    save();
    showList();
    showMessages();
    const node = $("messages").lastElementChild;
    controller = new AbortController();
    busy(true);
    const t0 = performance.now();
    let tFirst = null;
    let frame = 0;
    const paint = () => { frame = 0; render(node, m); scrollDown(); };
    try {
      const resp = await G.call("/v1/chat/completions", { json: body, signal: controller.signal });
      for await (const chunk of events(resp)) {
        if (chunk.error) throw new Error(typeof chunk.error === "string" ? chunk.error : chunk.error.message);
        for (const c of chunk.choices || []) {
          if (c.delta) merge(m, c.delta);
          if (c.finish_reason) m.stats.finish_reason = c.finish_reason;
        }
        if (tFirst === null && (m.content || m.reasoning || m.tool_calls)) {
          tFirst = performance.now();
          m.stats.ttft_ms = tFirst - t0;
        }
        if (chunk.usage) {
          m.stats.prompt_tokens = chunk.usage.prompt_tokens;
          m.stats.completion_tokens = chunk.usage.completion_tokens;
          const d = chunk.usage.prompt_tokens_details;
          m.stats.cached_tokens = d ? d.cached_tokens || 0 : 0;
        }
        if (!frame) frame = requestAnimationFrame(paint);
      }
      m.state = "done";
    } catch (e) {
      if (e.name === "AbortError") m.state = "stopped";
      else { m.state = "error"; m.error = e.message; if (e.status === 401) G.banner(e.message); }
    } finally {
      if (frame) cancelAnimationFrame(frame);
      const tEnd = performance.now();
      if (tFirst !== null && m.stats.completion_tokens > 1 && tEnd > tFirst) {
        m.stats.tps = (m.stats.completion_tokens - 1) / ((tEnd - tFirst) / 1000);
      }
      controller = null;
      busy(false);
      render(node, m);
      scrollDown();
      save();
      loadModels();
    }
  }

  function busy(on) {
    $("send").hidden = on;
    $("stop").hidden = !on;
    $("prompt").disabled = on;
  }

  // --- wiring ---------------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    load();
    if (conversations.length) { current = conversations[0]; showList(); showMessages(); } else newConversation();
    $("new-chat").addEventListener("click", () => { if (!controller) newConversation(); });
    $("model").addEventListener("change", describeModel);
    $("composer").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const text = $("prompt").value.trim();
      if (!text || controller) return;
      $("prompt").value = "";
      send(text);
    });
    $("prompt").addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); $("composer").requestSubmit(); }
    });
    // Aborting the fetch closes the connection: the server sees the disconnect and cancels the generation.
    $("stop").addEventListener("click", () => { if (controller) controller.abort(); });
    document.addEventListener("geniex:key", loadModels);
    loadModels();
  });
})();
