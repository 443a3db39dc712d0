// The playground: chat (streamed, with history), completion, and index search against this server's API.
"use strict";
const $ = (id) => document.getElementById(id);
let history = [];
let models = {};  // id -> its /v1/models entry

function headers() {
  const h = { "Content-Type": "application/json" };
  if ($("apikey").value) h["Authorization"] = "Bearer " + $("apikey").value;
  return h;
}

function say(text) { $("status").textContent = text || ""; }

async function loadModels() {
  const res = await fetch("/v1/models", { headers: headers() });
  if (!res.ok) { say("could not list models: " + res.status); return; }
  const body = await res.json();
  models = {};
  for (const [select, kind] of [["model", "generate"], ["index", "search"]]) {
    $(select).innerHTML = "";
    for (const m of body.data.filter((m) => m.kind === kind)) {
      models[m.id] = m;
      const o = document.createElement("option");
      o.value = m.id;
      const note = m.chat ? " (chat)" : m.chat_template === "default" ? " (base model: default chat template)" : "";
      o.textContent = m.id + note;
      $(select).appendChild(o);
    }
  }
  // Search needs an index; without one its tab would be an empty dropdown
  $("tab-search").classList.toggle("hidden", !body.data.some((m) => m.kind === "search"));
  openSupportedTab();
}

// A base model continues text: open Complete for it, Chat for an instruction-tuned one, Search for an index alone
function openSupportedTab() {
  const m = models[$("model").value];
  const tab = m ? (m.chat ? "chat" : "complete") : ($("index").value ? "search" : "chat");
  show(tab);
  $("chat-note").textContent = m && m.chat_template === "default"
    ? m.id + " was not instruction-tuned: chat uses the plain default template (User:/Assistant: lines)" : "";
}

async function runSearch(ev) {
  ev.preventDefault();
  say("");
  $("hits").innerHTML = "";
  const res = await fetch("/v1/search", { method: "POST", headers: headers(),
    body: JSON.stringify({ model: $("index").value, query: $("query").value, k: Number($("k").value) || 5 }) });
  const body = await res.json();
  if (!res.ok) { say(body.error ? body.error.message : res.statusText); return; }
  for (const hit of body.data) {
    const li = document.createElement("li");
    li.textContent = hit.score.toFixed(3) + "  " + hit.text;
    $("hits").appendChild(li);
  }
}

// POST a streamed request; call onText with each piece of text as it arrives.
async function streamed(path, payload, onText) {
  const res = await fetch(path, { method: "POST", headers: headers(), body: JSON.stringify({ ...payload, stream: true }) });
  if (!res.ok) {
    const err = await res.json().catch(() => ({}));
    throw new Error((err.error && err.error.message) || res.statusText);
  }
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const line = buffer.slice(0, cut).trim();
      buffer = buffer.slice(cut + 2);
      if (!line.startsWith("data: ")) continue;
      const data = line.slice(6);
      if (data === "[DONE]") return;
      const event = JSON.parse(data);
      if (event.error) throw new Error(event.error.message);
      for (const c of event.choices || []) {
        const piece = c.delta ? c.delta.content : c.text;
        if (piece) onText(piece);
      }
    }
  }
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const who = document.createElement("b");
  who.textContent = role;
  const span = document.createElement("span");
  span.textContent = text;
  div.append(who, span);
  $("transcript").appendChild(div);
  return span;
}

async function sendChat(ev) {
  ev.preventDefault();
  const text = $("message").value.trim();
  if (!text) return;
  $("message").value = "";
  say("");
  addMessage("user", text);
  history.push({ role: "user", content: text });
  const span = addMessage("assistant", "");
  const messages = $("system").value ? [{ role: "system", content: $("system").value }, ...history] : history;
  $("send").disabled = true;
  try {
    await streamed("/v1/chat/completions", { model: $("model").value, messages, max_tokens: 128 },
      (piece) => {
        span.textContent += piece;
        span.parentElement.dataset.pieces = Number(span.parentElement.dataset.pieces || 0) + 1;
      });
    history.push({ role: "assistant", content: span.textContent });
    span.parentElement.dataset.done = "1";
  } catch (e) {
    say(e.message);
    history.pop();
  } finally {
    $("send").disabled = false;
  }
}

async function runCompletion() {
  $("completion").textContent = "";
  say("");
  const num = (id) => ($(id).value === "" ? undefined : Number($(id).value));
  const payload = { model: $("model").value, prompt: $("prompt").value, max_tokens: num("max_tokens"),
    temperature: num("temperature"), top_p: num("top_p"), top_k: num("top_k") || undefined, seed: num("seed") };
  $("completion").textContent = $("prompt").value;
  try {
    await streamed("/v1/completions", payload, (piece) => { $("completion").textContent += piece; });
  } catch (e) { say(e.message); }
}

function show(tab) {
  for (const name of ["chat", "complete", "search"]) {
    $(name).classList.toggle("hidden", name !== tab);
    $("tab-" + name).classList.toggle("active", name === tab);
  }
}

$("chat-form").addEventListener("submit", sendChat);
$("message").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) sendChat(e); });
$("reset").addEventListener("click", () => { history = []; $("transcript").innerHTML = ""; });
$("run").addEventListener("click", runCompletion);
$("tab-chat").addEventListener("click", () => show("chat"));
$("tab-complete").addEventListener("click", () => show("complete"));
$("tab-search").addEventListener("click", () => show("search"));
$("search-form").addEventListener("submit", runSearch);
$("apikey").addEventListener("change", loadModels);
$("model").addEventListener("change", openSupportedTab);
loadModels();
