// The chat playground: streams /v1/chat/completions and renders the answer as Markdown. With an
// MCP server switched on (the "Tools" panel, from GET /v1/mcp/servers), the conversation goes
// through /v1/responses instead, with an `mcp` tool per server: the server runs the model's calls,
// and the page shows each call (server, tool, arguments, output or error) and asks the person
// before running a call whose server needs approval. A conversation with MCP turns stays on
// /v1/responses after its servers are switched off, so the server reads its own calls back.
// Model output reaches the DOM only through render(): marked with raw HTML escaped to text,
// then DOMPurify; what MCP servers and tools say is set as text (G.el) and never parsed as HTML.
// The page's CSP forbids inline and foreign scripts besides.
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
    if (m.items) {
      node.append(el("div", { class: "steps" }), el("div", { class: "stats" }));
      render(node, m);
      return node;
    }
    const reasoning = el("details", { class: "reasoning", hidden: true }, el("summary", {}, "Reasoning"), el("div", { class: "reasoning-body" }));
    node.append(reasoning, el("div", { class: "tools", hidden: true }), el("div", { class: "body answer-body" }), el("div", { class: "stats" }));
    render(node, m);
    return node;
  }

  function render(node, m) {
    if (m.items) { renderSteps(node, m); return; }
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
    renderEnd(node, m);
  }

  function renderEnd(node, m) {
    node.dataset.state = m.state || "done";
    const stats = node.querySelector(".stats");
    stats.replaceChildren();
    if (m.error) stats.append(el("span", { class: "error" }, m.error));
    if (m.stats) stats.append(statsText(m));
  }

  // --- an answer through /v1/responses: its items in order -------------------------------------

  // The approval requests of a turn that no approval response answers yet.
  function waiting(m) {
    const answered = new Set(m.items.filter((it) => it.type === "mcp_approval_response").map((it) => it.approval_request_id));
    return m.items.filter((it) => it.type === "mcp_approval_request" && !answered.has(it.id));
  }

  function pretty(args) {
    try { return JSON.stringify(JSON.parse(args), null, 2); } catch (_) { return args || ""; }
  }

  // An mcp_call's error in words: the tool's own (`content`), or the protocol's (`message`, `code`).
  function errorText(error) {
    if (!error) return "";
    if (typeof error === "string") return error;
    if (error.message) return error.code !== undefined ? `${error.message} (code ${error.code})` : error.message;
    const c = error.content;
    if (typeof c === "string") return c;
    if (Array.isArray(c)) return c.map((p) => (p && typeof p.text === "string" ? p.text : JSON.stringify(p))).join("\n");
    return JSON.stringify(error);
  }

  function callHead(kind, it, ...rest) {
    return el("div", { class: "mcp-head" }, el("strong", {}, kind), " ",
      el("code", { class: "mcp-server-name" }, it.server_label || "?"), " · ",
      el("code", { class: "mcp-tool-name" }, it.name || "?"), ...rest);
  }

  const CALL_STATES = { in_progress: "running", calling: "running", completed: "done", failed: "failed", incomplete: "cut short" };

  function step(it, m, live, decisions) {
    if (it.type === "message") {
      const body = el("div", { class: "body answer-body" });
      body.innerHTML = markdown(it.text);
      body.querySelectorAll("pre code").forEach(highlight);
      return body;
    }
    if (it.type === "reasoning") {
      const r = el("details", { class: "reasoning", open: m.state === "streaming" && it === m.items[m.items.length - 1] },
        el("summary", {}, "Reasoning"), el("div", { class: "reasoning-body" }));
      r.querySelector(".reasoning-body").innerHTML = markdown(it.text);
      return r;
    }
    if (it.type === "mcp_call") {
      return el("div", { class: "mcp-call", "data-status": it.status || "", "data-server": it.server_label, "data-tool": it.name },
        callHead("MCP call", it, el("span", { class: "muted mcp-status" }, " · " + (CALL_STATES[it.status] || it.status || "")),
                 it.approval_request_id ? el("span", { class: "muted" }, " · approved") : null),
        el("div", { class: "mcp-label" }, "arguments"), el("pre", { class: "mcp-arguments" }, pretty(it.arguments)),
        it.output !== null && it.output !== undefined ? el("div", { class: "mcp-label" }, "output") : null,
        it.output !== null && it.output !== undefined ? el("pre", { class: "mcp-output" }, it.output) : null,
        it.error ? el("div", { class: "mcp-label" }, "error") : null,
        it.error ? el("pre", { class: "mcp-error error" }, errorText(it.error)) : null);
    }
    if (it.type === "mcp_approval_request") {
      const decided = decisions.get(it.id);
      let foot;
      if (decided !== undefined) foot = el("div", { class: "muted mcp-decision" }, decided ? "approved" : "denied: not run");
      else if (live) {
        foot = el("div", { class: "mcp-buttons" },
          el("button", { type: "button", class: "approve", onclick: () => answer(m, it.id, true) }, "Approve"),
          el("button", { type: "button", class: "deny small", onclick: () => answer(m, it.id, false) }, "Deny"));
      } else foot = el("div", { class: "muted mcp-decision" }, "not answered: not run");
      return el("div", { class: "mcp-approval", "data-server": it.server_label, "data-tool": it.name, "data-decided": decided === undefined ? "" : String(decided) },
        callHead("Run this MCP call?", it), el("div", { class: "mcp-label" }, "arguments"),
        el("pre", { class: "mcp-arguments" }, pretty(it.arguments)), foot);
    }
    if (it.type === "function_call") {
      return el("div", { class: "tool-call" }, el("strong", {}, "tool call: "), el("code", {}, it.name || "?"), el("pre", {}, it.arguments || ""));
    }
    return null; // an approval response: shown on its request
  }

  function renderSteps(node, m) {
    const decisions = new Map(m.items.filter((it) => it.type === "mcp_approval_response").map((it) => [it.approval_request_id, it.approve]));
    // Approve and Deny are offered on the conversation's last answer only, while nothing streams.
    const live = m.state === "awaiting" && !controller && current.messages[current.messages.length - 1] === m;
    node.querySelector(".steps").replaceChildren(...m.items.map((it) => step(it, m, live, decisions)).filter(Boolean));
    renderEnd(node, m);
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
    if (m.state === "awaiting") parts.push("waiting for your approval");
    return parts.join(" · ");
  }

  function showMessages() {
    $("messages").replaceChildren(...current.messages.map(messageNode));
    showServers();
    scrollDown();
  }

  function scrollDown() {
    const box = $("messages");
    box.scrollTop = box.scrollHeight;
  }

  // --- models ---------------------------------------------------------------------------------

  let models = [];

  async function loadModels() {
    const got = await G.chatModels($("model"), current && current.model,
      (m) => `${m.id}${m.loaded && m.loaded.length ? " · loaded" : ""}`);
    if (!got) return;
    models = got;
    describeModel();
  }

  function describeModel() {
    const m = models.find((x) => x.id === $("model").value);
    $("model-info").textContent = m ? `${(m.capabilities || []).join(", ")}` +
      (m.context_length ? ` · context ${m.context_length}` : "") +
      (m.loaded && m.loaded.length ? ` · loaded (${m.loaded.map((r) => r.state).join(", ")})` : " · not loaded") : "";
  }

  // --- MCP servers: the "Tools" panel ---------------------------------------------------------

  let servers = []; // GET /v1/mcp/servers: those the key in use may use, with their tools

  async function loadServers() {
    let list;
    try {
      list = (await G.json("/v1/mcp/servers")).data || [];
      $("mcp-error").hidden = true;
    } catch (e) {
      servers = [];
      // 401: the banner already says so (the models' call); 404: a server without the route.
      const quiet = e.status === 401 || e.status === 404;
      $("mcp-error").textContent = quiet ? "" : "The MCP servers could not be listed: " + e.message;
      $("mcp-error").hidden = quiet;
      $("mcp").hidden = quiet;
      showServers();
      return;
    }
    servers = list;
    $("mcp").hidden = !servers.length;
    showServers();
  }

  // This conversation's settings of a server: {ask, force} while it is switched on, else undefined.
  function setting(label) { return current && current.mcp ? current.mcp[label] : undefined; }

  function setServer(label, value) {
    current.mcp = current.mcp || {};
    if (value) current.mcp[label] = value; else delete current.mcp[label];
    // One call can be forced per request: forcing one server's stops forcing the others'.
    if (value && value.force) for (const [k, v] of Object.entries(current.mcp)) if (k !== label) v.force = "";
    save();
    showServers();
  }

  function serverNode(s) {
    const label = s.server_label;
    const on = setting(label);
    const force = el("select", { class: "mcp-force", disabled: !on,
      onchange: (ev) => setServer(label, Object.assign({}, setting(label), { force: ev.target.value })) },
      el("option", { value: "" }, "no"), el("option", { value: "*" }, "any of its tools"),
      ...(s.tools || []).map((t) => el("option", { value: t.name }, t.name)));
    force.value = on && on.force && (on.force === "*" || (s.tools || []).some((t) => t.name === on.force)) ? on.force : "";
    return el("li", { class: "mcp-server", "data-server": label },
      el("div", { class: "mcp-controls" },
        el("label", { class: "check" }, el("input", { type: "checkbox", class: "mcp-on", checked: !!on,
          onchange: (ev) => setServer(label, ev.target.checked ? { ask: true, force: "" } : null) }),
          el("strong", {}, label), el("span", { class: "muted" }, s.transport || "")),
        el("label", { class: "check" }, el("input", { type: "checkbox", class: "mcp-ask", checked: !on || on.ask, disabled: !on,
          onchange: (ev) => setServer(label, Object.assign({}, setting(label), { ask: ev.target.checked })) }),
          "ask before each call"),
        el("label", { title: "tool_choice: the model must call one of this server's tools (then answers: max_tool_calls 1)" },
          "force a call", force)),
      s.error ? el("div", { class: "error mcp-list-error" }, s.error) : null,
      el("ul", { class: "mcp-tools" }, ...(s.tools || []).map((t) => el("li", { "data-tool": t.name, title: t.description || "" },
        el("code", {}, t.name), t.read_only ? el("span", { class: "muted" }, " read-only") : null,
        t.description ? el("span", { class: "muted" }, " · " + t.description) : null))));
  }

  function showServers() {
    if (!current) return;
    $("mcp-servers").replaceChildren(...servers.map(serverNode));
    const on = enabledServers().map((s) => s.server_label);
    $("mcp-count").textContent = on.length ? "· on: " + on.join(", ") : "";
  }

  function enabledServers() { return servers.filter((s) => setting(s.server_label)); }

  // The Responses fields that the switched-on servers make: null when none is on (plain chat).
  function mcpSetup() {
    const on = enabledServers();
    if (!on.length) return null;
    const setup = { tools: on.map((s) => ({ type: "mcp", server_label: s.server_label,
                                            require_approval: setting(s.server_label).ask ? "always" : "never" })) };
    const forced = on.find((s) => setting(s.server_label).force);
    if (forced) {
      const name = setting(forced.server_label).force;
      setup.tool_choice = name === "*" ? { type: "mcp", server_label: forced.server_label }
                                       : { type: "mcp", server_label: forced.server_label, name };
      setup.max_tool_calls = 1; // then the model answers with the result, offered no more tools
    }
    return setup;
  }

  // --- sending --------------------------------------------------------------------------------

  function settingsFields(body, maxField) {
    const t = parseFloat($("temperature").value);
    if (!Number.isNaN(t)) body.temperature = t;
    const n = parseInt($("max-tokens").value, 10);
    if (n > 0) body[maxField] = n;
    const extra = $("extra").value.trim();
    if (extra) {
      let fields;
      try { fields = JSON.parse(extra); } catch (e) { throw new Error("More request fields: not JSON (" + e.message + ")"); }
      if (typeof fields !== "object" || fields === null || Array.isArray(fields)) throw new Error("More request fields: a JSON object, please");
      Object.assign(body, fields);
    }
    return body;
  }

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
    return settingsFields(body, "max_tokens");
  }

  // One item of a /v1/responses turn as the input item that sends it back: the whole conversation
  // goes with every request (a stored response is not needed, so a conversation outlives a restart).
  function inputItem(it) {
    switch (it.type) {
      case "message": return it.text ? { role: "assistant", content: it.text } : null;
      case "reasoning": return it.text ? { type: "reasoning", summary: [], content: [{ type: "reasoning_text", text: it.text }] } : null;
      case "mcp_call": {
        const x = { type: "mcp_call", id: it.id, server_label: it.server_label, name: it.name, arguments: it.arguments || "",
                    output: it.output === undefined ? null : it.output, error: it.error || null };
        if (it.status) x.status = it.status;
        if (it.approval_request_id) x.approval_request_id = it.approval_request_id;
        return x;
      }
      case "mcp_approval_request":
        return { type: "mcp_approval_request", id: it.id, server_label: it.server_label, name: it.name, arguments: it.arguments || "" };
      case "mcp_approval_response":
        return { type: "mcp_approval_response", approval_request_id: it.approval_request_id, approve: it.approve };
      case "function_call":
        return it.call_id ? { type: "function_call", call_id: it.call_id, name: it.name, arguments: it.arguments || "" } : null;
      default: return null;
    }
  }

  function inputItems() {
    const items = [];
    for (const m of current.messages) {
      if (m.role === "user") items.push({ role: "user", content: m.content });
      else if (m.items) for (const it of m.items) { const x = inputItem(it); if (x) items.push(x); }
      else if (m.content) items.push({ role: "assistant", content: m.content }); // a chat answer: its text
    }
    return items;
  }

  function responsesBody(model, input, setup) {
    const body = { model, input, tools: setup.tools, stream: true, store: true,
                   reasoning: { effort: $("reasoning").checked ? "medium" : "none" } };
    if (setup.tool_choice) body.tool_choice = setup.tool_choice;
    if (setup.max_tool_calls) body.max_tool_calls = setup.max_tool_calls;
    const system = $("system").value.trim();
    if (system) body.instructions = system;
    return settingsFields(body, "max_output_tokens");
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

  // A chat completion's stream into m; `tick()` after each chunk.
  async function streamChat(m, body, signal, tick) {
    const resp = await G.call("/v1/chat/completions", { json: body, signal });
    for await (const chunk of events(resp)) {
      if (chunk.error) throw new Error(typeof chunk.error === "string" ? chunk.error : chunk.error.message);
      for (const c of chunk.choices || []) {
        if (c.delta) merge(m, c.delta);
        if (c.finish_reason) m.stats.finish_reason = c.finish_reason;
      }
      if (chunk.usage) {
        m.stats.prompt_tokens = chunk.usage.prompt_tokens;
        m.stats.completion_tokens = chunk.usage.completion_tokens;
        const d = chunk.usage.prompt_tokens_details;
        m.stats.cached_tokens = d ? d.cached_tokens || 0 : 0;
      }
      tick(!!(m.content || m.reasoning || m.tool_calls));
    }
  }

  // An output item as the page keeps it: a message's or reasoning's parts as one text.
  function kept(item) {
    if (item.type === "message") {
      return { type: "message", id: item.id, text: (item.content || []).map((p) => p.text || p.refusal || "").join("") };
    }
    if (item.type === "reasoning") {
      return { type: "reasoning", id: item.id, text: (item.content || []).map((p) => p.text || "").join("") };
    }
    return Object.assign({}, item);
  }

  // A /v1/responses stream into m.items (appended: an approval's continuation adds to its turn).
  async function streamResponses(m, body, signal, tick) {
    const resp = await G.call("/v1/responses", { json: body, signal });
    const at = {}; // output_index -> the item kept in m.items (null: a tool list, not kept)
    let shown = false; // this response has streamed text or arguments (the time to first token)
    const replace = (i, item) => {
      const k = m.items.indexOf(at[i]);
      if (k >= 0) m.items[k] = item; else m.items.push(item);
      at[i] = item;
    };
    for await (const ev of events(resp)) {
      const it = at[ev.output_index];
      switch (ev.type) {
        case "response.output_item.added":
          if (ev.item.type === "mcp_list_tools") at[ev.output_index] = null;
          else { at[ev.output_index] = kept(ev.item); m.items.push(at[ev.output_index]); }
          break;
        case "response.output_item.done":
          if (ev.item.type !== "mcp_list_tools") replace(ev.output_index, kept(ev.item));
          else if (ev.item.error) throw new Error(`MCP server ${ev.item.server_label}: ${ev.item.error}`);
          break;
        case "response.output_text.delta":
        case "response.reasoning_text.delta":
          if (it) it.text += ev.delta;
          shown = true;
          break;
        case "response.mcp_call_arguments.delta":
          if (it) it.arguments = (it.arguments || "") + ev.delta;
          shown = true;
          break;
        case "response.mcp_call_arguments.done":
          if (it) it.arguments = ev.arguments;
          break;
        case "response.mcp_call.completed":
        case "response.mcp_call.failed":
          if (it) it.status = ev.type === "response.mcp_call.completed" ? "completed" : "failed";
          break;
        case "response.completed":
        case "response.incomplete": {
          const u = ev.response.usage;
          if (u) {
            m.stats.prompt_tokens = u.input_tokens;
            m.stats.completion_tokens = u.output_tokens;
            m.stats.cached_tokens = u.input_tokens_details ? u.input_tokens_details.cached_tokens || 0 : 0;
          }
          if (ev.type === "response.incomplete") m.stats.finish_reason = "length";
          break;
        }
        case "response.failed":
          throw new Error((ev.response.error && ev.response.error.message) || "the response failed");
        case "error":
          throw new Error(ev.message || "the response failed");
        default:
      }
      tick(shown);
    }
  }

  // Runs one stream into the answer m (shown by node): Stop, painting, stats, errors, saving.
  async function run(m, node, work) {
    m.state = "streaming";
    m.stats = {};
    delete m.error;
    controller = new AbortController();
    busy(true);
    render(node, m);
    const t0 = performance.now();
    let tFirst = null;
    let frame = 0;
    const paint = () => { frame = 0; render(node, m); scrollDown(); };
    const tick = (shown) => {
      if (tFirst === null && shown) {
        tFirst = performance.now();
        m.stats.ttft_ms = tFirst - t0;
      }
      if (!frame) frame = requestAnimationFrame(paint);
    };
    try {
      await work(controller.signal, tick);
      m.state = m.items && waiting(m).length ? "awaiting" : "done";
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

  async function send(text) {
    const model = $("model").value;
    if (!model) { G.banner("Choose a model first."); return; }
    current.model = model;
    if (!current.messages.length) current.title = text.slice(0, 40);
    // A conversation with MCP turns stays on /v1/responses (with no tools once its servers are off):
    // the server reads its calls back as it wrote them, results contained as the model first read them.
    const setup = mcpSetup() || (current.messages.some((m) => m.items) ? { tools: [] } : null);
    let body;
    try {
      body = setup ? responsesBody(model, [...inputItems(), { role: "user", content: text }], setup) : requestBody(model, text);
    } catch (e) { G.banner(e.message); return; }
    G.banner("");
    current.messages.push({ role: "user", content: text });
    const m = { role: "assistant", model, content: "", state: "streaming", stats: {} };
    if (setup) { m.items = []; m.mcp = setup; }
    current.messages.push(m);
    save();
    showList();
    showMessages();
    const node = $("messages").lastElementChild;
    await run(m, node, (signal, tick) => (setup ? streamResponses : streamChat)(m, body, signal, tick));
  }

  // Approve or Deny an approval request of the last answer; once none waits, the answers go to the
  // server (with the whole conversation and the same tools), and its continuation joins this turn.
  async function answer(m, id, approve) {
    if (controller || !waiting(m).some((it) => it.id === id)) return;
    m.items.push({ type: "mcp_approval_response", approval_request_id: id, approve });
    save();
    const node = $("messages").lastElementChild;
    if (waiting(m).length) { render(node, m); return; }
    let body;
    // Not forced again: an approved call runs before the model's turn (and counts in max_tool_calls).
    const setup = { tools: m.mcp.tools, max_tool_calls: m.mcp.max_tool_calls };
    try { body = responsesBody(m.model, inputItems(), setup); } catch (e) { G.banner(e.message); return; }
    await run(m, node, (signal, tick) => streamResponses(m, body, signal, tick));
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
    $("mcp-refresh").addEventListener("click", loadServers);
    document.addEventListener("geniex:key", () => { loadModels(); loadServers(); });
    loadModels();
    loadServers();
  });
})();
