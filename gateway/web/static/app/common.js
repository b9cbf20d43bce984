// What every page shares: the API key, calls to the public API, a message banner, safe DOM building.
// Nothing here ever assigns model output to innerHTML; chat.js does so only after marked + DOMPurify.
"use strict";

const G = (() => {
  const KEY = "geniex.apiKey";

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  function apiKey() { return localStorage.getItem(KEY) || ""; }

  function headers(extra) {
    const h = Object.assign({}, extra || {});
    const key = apiKey();
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  // A failed call as one sentence a person can act on.
  async function explain(resp) {
    let detail = "";
    try {
      const body = await resp.json();
      detail = typeof body.error === "string" ? body.error : (body.error && body.error.message) || "";
    } catch (_) { /* not JSON */ }
    if (resp.status === 401) {
      return new ApiError(401, "This server requires an API key: enter it in the “API key” field at the top" +
        (apiKey() ? " (the one entered was refused)." : "."));
    }
    return new ApiError(resp.status, `${resp.status}: ${detail || resp.statusText}`);
  }

  // fetch() on the same origin with the key; JSON bodies; errors thrown as ApiError.
  async function call(path, options) {
    const opts = Object.assign({}, options || {});
    const extra = {};
    if (opts.json !== undefined) {
      extra["Content-Type"] = "application/json";
      opts.body = JSON.stringify(opts.json);
      delete opts.json;
      opts.method = opts.method || "POST";
    }
    opts.headers = headers(Object.assign(extra, opts.headers || {}));
    const resp = await fetch(path, opts);
    if (!resp.ok) throw await explain(resp);
    return resp;
  }

  async function json(path, options) { return (await call(path, options)).json(); }

  function banner(message) {
    const b = document.getElementById("banner");
    if (!b) return;
    b.textContent = message || "";
    b.hidden = !message;
  }

  // el("td", {class: "num"}, "12"): children are text (never parsed as HTML) or nodes.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") node.className = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) {
      if (c === undefined || c === null) continue;
      node.append(c instanceof Node ? c : String(c));
    }
    return node;
  }

  function bytes(n) {
    if (n === null || n === undefined) return "";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
  }

  async function models() { return (await json("/v1/models")).data; }

  // Fills `select` with the installed chat models (keeping its choice, else `preferred`), each
  // option's text `label(model)`; returns them, or null when they could not be read (the banner says why).
  async function chatModels(select, preferred, label = (m) => m.id) {
    let list;
    try {
      list = (await models()).filter((m) => (m.capabilities || []).includes("chat"));
      banner(list.length ? "" : "No chat model is installed: `geniex pull org/repo` fetches one.");
    } catch (e) {
      banner(e.message);
      return null;
    }
    const chosen = select.value || preferred;
    select.replaceChildren(...list.map((m) => el("option", { value: m.id }, label(m))));
    if (chosen && list.some((m) => m.id === chosen)) select.value = chosen;
    return list;
  }

  function setupKeyField() {
    const input = document.getElementById("api-key");
    if (!input) return;
    input.value = apiKey();
    input.addEventListener("change", () => {
      if (input.value.trim()) localStorage.setItem(KEY, input.value.trim());
      else localStorage.removeItem(KEY);
      banner("");
      document.dispatchEvent(new CustomEvent("geniex:key"));
    });
  }

  document.addEventListener("DOMContentLoaded", setupKeyField);
  return { ApiError, apiKey, headers, explain, call, json, banner, el, bytes, models, chatModels };
})();
