// The chat page. It speaks only the public API (api.js): the models from /v1/models,
// answers streamed from /v1/chat/completions. Conversations, settings and the key live
// in this browser (store.js). A message is {role, content, ...}: "user" (with images),
// "assistant" (reasoning, tool calls, stats), "tool" (a tool's result) and "error" (shown,
// never sent). A user message the server refused, or one stopped before any answer, is
// marked `failed` and left out of later requests until it is edited or retried.

import { Api, ApiError } from "./api.js";
import {
  LocalError, describe, markUnanswered, mergeCall, newId, parseTools, requestBody, titleOf,
} from "./conversation.js";
import { el, renderMessage } from "./render.js";
import * as store from "./store.js";

const $ = (id) => document.getElementById(id);
const ui = {
  app: $("app"), sidebar: $("sidebar"), scrim: $("scrim"), list: $("conversations"), newChat: $("new-chat"),
  openSidebar: $("open-sidebar"), closeSidebar: $("close-sidebar"), model: $("model"),
  toggleSettings: $("toggle-settings"), settings: $("settings"), setKey: $("set-key"),
  temperature: $("temperature"), temperatureValue: $("temperature-value"), maxTokens: $("max-tokens"),
  reasoning: $("reasoning"), toolChoice: $("tool-choice"), system: $("system"), tools: $("tools"),
  toolsError: $("tools-error"), baseModel: $("base-model"),
  messages: $("messages"), empty: $("empty"), composer: $("composer"), input: $("input"), send: $("send"),
  stop: $("stop"), attach: $("attach"), file: $("file"), attachments: $("attachments"),
  keyDialog: $("key-dialog"), keyForm: $("key-form"), keyInput: $("key-input"), keyError: $("key-error"),
  keyCancel: $("key-cancel"),
};

const DEFAULTS = {
  model: "", temperature: 0.8, maxTokens: "", reasoning: "default", toolChoice: "auto", system: "", tools: "",
};
const state = {
  settings: { ...DEFAULTS, ...store.load("settings", {}) },
  key: store.load("key", ""),
  index: store.load("conversations", []), // [{id, title, updated}], newest first
  conversation: null,
  models: [],
  generation: null, // {controller, conversation, message}
  attachments: [], // data URLs waiting to be sent
  deleted: new Set(), // ids of conversations deleted since the page loaded
};
const api = new Api(() => state.key);

// ------------------------------------------------------------------ conversations

function startConversation() {
  state.conversation = { id: newId(), title: "New chat", model: state.settings.model, messages: [] };
  renderAll();
}

function openConversation(id) {
  const conversation = store.loadConversation(id);
  if (!conversation) {
    state.index = state.index.filter((c) => c.id !== id);
    store.save("conversations", state.index);
    startConversation();
    return;
  }
  state.conversation = conversation;
  if (conversation.model && state.models.some((m) => m.id === conversation.model)) {
    ui.model.value = conversation.model;
    chooseModel(conversation.model);
  }
  store.save("current", id);
  renderAll();
}

function persist(conversation = state.conversation) {
  if (!conversation.messages.length || state.deleted.has(conversation.id)) return;
  conversation.title = titleOf(conversation);
  conversation.updated = Date.now();
  const saved = store.saveConversation(conversation);
  if (saved === "without-images") notify("The browser's storage is full: this conversation's images are not kept.");
  if (saved === "failed") notify("The browser's storage is full: this conversation is not kept.");
  state.index = [{ id: conversation.id, title: conversation.title, updated: conversation.updated },
    ...state.index.filter((c) => c.id !== conversation.id)];
  store.save("conversations", state.index);
  store.save("current", conversation.id);
  renderList();
}

function deleteConversation(id) {
  state.deleted.add(id); // an answer still streaming into it is not saved back when it ends
  if (state.generation?.conversation.id === id) stopGeneration();
  store.removeConversation(id);
  state.index = state.index.filter((c) => c.id !== id);
  store.save("conversations", state.index);
  if (state.conversation.id === id) startConversation();
  else renderList();
}

// ------------------------------------------------------------------ models and settings

function currentModel() {
  return state.models.find((m) => m.id === ui.model.value);
}

function chooseModel(id) {
  state.settings.model = id;
  store.save("settings", state.settings);
  const model = currentModel();
  ui.attach.hidden = !model?.vision;
  ui.baseModel.hidden = !model || model.chat_template !== false || model.kind !== "chat";
  if (state.conversation && !state.conversation.messages.length) state.conversation.model = id;
}

async function loadModels() {
  try {
    state.models = await api.models();
  } catch (error) {
    state.models = [];
    renderModels();
    if (error instanceof ApiError && error.status === 401) askKey(error.message);
    else notify(`Could not list the models: ${error.message}`);
    return;
  }
  renderModels();
}

function renderModels() {
  ui.model.replaceChildren();
  if (!state.models.length) {
    ui.model.append(new Option("no models", ""));
    ui.model.disabled = true;
    return;
  }
  ui.model.disabled = false;
  for (const m of state.models) {
    const option = new Option(m.error ? `${m.id} (failed)` : m.id, m.id);
    option.disabled = Boolean(m.error);
    option.title = m.error || [m.status, m.quantization, m.vision ? "vision" : ""].filter(Boolean).join(", ");
    ui.model.append(option);
  }
  const wanted = [state.conversation?.model, state.settings.model].find((id) =>
    state.models.some((m) => m.id === id && !m.error));
  ui.model.value = wanted || state.models.find((m) => !m.error)?.id || "";
  chooseModel(ui.model.value);
}

function showSettings() {
  const s = state.settings;
  ui.temperature.value = s.temperature;
  ui.temperatureValue.value = Number(s.temperature).toFixed(2);
  ui.maxTokens.value = s.maxTokens;
  ui.reasoning.value = s.reasoning;
  ui.toolChoice.value = s.toolChoice;
  ui.system.value = s.system;
  ui.tools.value = s.tools;
}

function readSettings() {
  const s = state.settings;
  s.temperature = Number(ui.temperature.value);
  ui.temperatureValue.value = s.temperature.toFixed(2);
  s.maxTokens = ui.maxTokens.value;
  s.reasoning = ui.reasoning.value;
  s.toolChoice = ui.toolChoice.value;
  s.system = ui.system.value;
  s.tools = ui.tools.value;
  store.save("settings", s);
  try {
    parseTools(state.settings);
    ui.toolsError.hidden = true;
  } catch (error) {
    ui.toolsError.textContent = `${error.title} ${error.message}`;
    ui.toolsError.hidden = false;
  }
}

// ------------------------------------------------------------------ the request

// ------------------------------------------------------------------ generating

async function generate() {
  const conversation = state.conversation;
  if (state.generation) return;
  let body;
  try {
    if (!ui.model.value) throw new LocalError("No model is selected.", "The server lists none that can be served.");
    conversation.model = ui.model.value;
    body = requestBody(conversation, state.settings);
  } catch (error) {
    fail(conversation, error, null);
    persist(conversation);
    renderMessages();
    return;
  }
  const message = { role: "assistant", content: "", reasoning: "", tool_calls: [], model: conversation.model };
  conversation.messages.push(message);
  const controller = new AbortController();
  state.generation = { controller, conversation, message };
  const started = performance.now();
  let first = null;
  let thought = null;
  setBusy(true);
  renderMessages();
  let saved = performance.now();
  const model = currentModel();
  const loading = model && model.status !== "loaded";  // its first request waits for the load
  if (loading) notify(`Loading ${model.id}: the first answer waits for the model to load.`);
  try {
    for await (const chunk of api.chat(body, controller.signal)) {
      if (loading && model.status !== "loaded") {
        model.status = "loaded";
        notify("");
      }
      if (chunk.usage) message.usage = chunk.usage;
      const choice = chunk.choices?.[0];
      if (!choice) continue;
      const delta = choice.delta || {};
      if (delta.reasoning_content) message.reasoning += delta.reasoning_content;
      if (delta.content) {
        message.content += delta.content;
        if (message.reasoning && thought === null) thought = performance.now();
      }
      for (const call of delta.tool_calls || []) mergeCall(message.tool_calls, call);
      if (first === null && (delta.content || delta.reasoning_content || delta.tool_calls)) first = performance.now();
      if (choice.finish_reason) message.finish = choice.finish_reason;
      update(message);
      if (performance.now() - saved > 2000) {
        persist(conversation);
        saved = performance.now();
      }
    }
  } catch (error) {
    if (controller.signal.aborted) message.stopped = true;
    else fail(conversation, error, message);
  } finally {
    if (loading) notify("");
    const end = performance.now();
    message.seconds = (end - started) / 1000;
    if (first !== null) message.firstSeconds = (first - started) / 1000;
    if (message.reasoning) message.thoughtSeconds = ((thought ?? end) - started) / 1000;
    if (message.stopped && !message.content && !message.reasoning && !message.tool_calls.length) {
      markUnanswered(conversation, message);
    }
    state.generation = null;
    setBusy(false);
    persist(conversation);
    if (state.conversation === conversation) renderMessages();
    ui.input.focus();
  }
}

function fail(conversation, error, message) {
  const shown = { role: "error", ...describe(error) };
  if (message) {
    message.interrupted = true;
    if (!message.content && !message.reasoning && !message.tool_calls.length) {
      markUnanswered(conversation, message);
      conversation.messages.splice(conversation.messages.indexOf(message), 1);
    }
  } else {
    const last = conversation.messages.at(-1);
    if (last?.role === "user") last.failed = true;
  }
  conversation.messages.push(shown);
  if (error instanceof ApiError && error.status === 401) askKey(error.message);
}

function stopGeneration() {
  state.generation?.controller.abort();
}

function setBusy(busy) {
  ui.send.hidden = busy;
  ui.stop.hidden = !busy;
  ui.messages.setAttribute("aria-busy", String(busy));
}

function send() {
  const text = ui.input.value.trim();
  if (state.generation || (!text && !state.attachments.length)) return;
  const conversation = state.conversation;
  conversation.messages.push({ role: "user", content: text, images: state.attachments });
  state.attachments = [];
  renderAttachments();
  ui.input.value = "";
  resizeInput();
  persist(conversation);
  generate();
}

// Retry after an error: the error goes, the unanswered message is sent again.
function retry(index) {
  const messages = state.conversation.messages;
  messages.splice(index, 1);
  const last = messages.at(-1);
  if (!last || last.role !== "user") return renderMessages();
  last.failed = false;
  generate();
}

function resend(index, text) {
  const messages = state.conversation.messages;
  const message = messages[index];
  message.content = text;
  message.failed = false;
  messages.splice(index + 1);
  generate();
}

function regenerate(index) {
  state.conversation.messages.splice(index);
  const last = state.conversation.messages.at(-1);
  if (last?.role === "user") last.failed = false;
  generate();
}

function sendToolResult(index, callId, name, text) {
  const messages = state.conversation.messages;
  const assistant = messages[index];
  let at = index + 1;
  while (at < messages.length && messages[at].role === "tool") at++;
  messages.splice(at, 0, { role: "tool", tool_call_id: callId, name, content: text });
  const answered = new Set(messages.slice(index + 1).filter((m) => m.role === "tool").map((m) => m.tool_call_id));
  if (assistant.tool_calls.every((c) => answered.has(c.id))) generate();
  else {
    persist();
    renderMessages();
  }
}

// ------------------------------------------------------------------ rendering

function renderAll() {
  renderList();
  renderMessages();
}

function renderList() {
  ui.list.replaceChildren();
  for (const c of state.index) {
    const item = el("li", c.id === state.conversation?.id ? "current" : "");
    const open = el("button", "open", c.title);
    open.type = "button";
    open.dataset.open = c.id;
    if (c.id === state.conversation?.id) open.setAttribute("aria-current", "true");
    const remove = el("button", "icon delete", "✕");
    remove.type = "button";
    remove.dataset.delete = c.id;
    remove.setAttribute("aria-label", `Delete “${c.title}”`);
    item.append(open, remove);
    ui.list.append(item);
  }
}

function view() {
  const g = state.generation;
  return { messages: state.conversation.messages, live: g?.conversation === state.conversation ? g.message : null,
    busy: Boolean(g) };
}

function renderMessages() {
  const messages = state.conversation.messages;
  const nodes = messages.map((m, i) => renderMessage(m, i, view()));
  ui.empty.hidden = messages.length > 0;
  ui.messages.replaceChildren(ui.empty, ...nodes);
  scrollDown(true);
}

// The streaming message, redrawn at most once a frame.
let pending = null;
function update(message) {
  if (pending) return;
  pending = requestAnimationFrame(() => {
    pending = null;
    if (state.conversation !== state.generation?.conversation) return;
    const i = state.conversation.messages.indexOf(message);
    const old = ui.messages.querySelector(`article.assistant[data-index="${i}"]`);
    if (!old) return;
    const wasOpen = old.querySelector("details.reasoning")?.open;
    const fresh = renderMessage(message, i, view());
    if (wasOpen) fresh.querySelector("details.reasoning").open = true;
    const follow = nearBottom();
    old.replaceWith(fresh);
    scrollDown(follow);
  });
}

function nearBottom() {
  const m = ui.messages;
  return m.scrollHeight - m.scrollTop - m.clientHeight < 80;
}

function scrollDown(follow) {
  if (follow) ui.messages.scrollTop = ui.messages.scrollHeight;
}

function editMessage(index) {
  const node = ui.messages.querySelector(`article.user[data-index="${index}"]`);
  const message = state.conversation.messages[index];
  const form = el("form", "edit");
  const field = el("textarea");
  field.value = message.content;
  field.rows = Math.min(10, message.content.split("\n").length + 1);
  field.setAttribute("aria-label", "Edit the message");
  const save = el("button", "primary", "Send");
  save.type = "submit";
  const cancel = el("button", "", "Cancel");
  cancel.type = "button";
  const buttons = el("div", "edit-buttons");
  buttons.append(cancel, save);
  form.append(field, buttons);
  node.replaceChildren(form);
  field.focus();
  const done = () => renderMessages();
  cancel.addEventListener("click", done);
  field.addEventListener("keydown", (e) => {
    if (e.key === "Escape") {
      e.stopPropagation();
      done();
    } else if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      form.requestSubmit();
    }
  });
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    if (state.generation || !field.value.trim()) return;
    resend(index, field.value.trim());
  });
}

async function copyText(text, source) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // not a secure context (a LAN address over http): copy through a selection
    const area = el("textarea");
    area.value = text;
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  const label = source.textContent;
  source.textContent = "Copied";
  setTimeout(() => (source.textContent = label), 1200);
}

function notify(text) {
  let node = document.getElementById("notice");
  if (!node) {
    node = el("div", "notice");
    node.id = "notice";
    node.setAttribute("role", "status");
    ui.settings.after(node);
  }
  node.textContent = text;
  node.hidden = !text;
}

// ------------------------------------------------------------------ attachments

function readImage(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function attach(files) {
  for (const file of files) {
    if (!file.type.startsWith("image/")) {
      notify(`${file.name} is not an image.`);
      continue;
    }
    state.attachments.push(await readImage(file));
  }
  renderAttachments();
}

function renderAttachments() {
  ui.attachments.replaceChildren();
  ui.attachments.hidden = !state.attachments.length;
  state.attachments.forEach((url, i) => {
    const item = el("div", "attachment");
    const img = el("img");
    img.src = url;
    img.alt = `attachment ${i + 1}`;
    const remove = el("button", "icon", "✕");
    remove.type = "button";
    remove.dataset.detach = i;
    remove.setAttribute("aria-label", `Remove attachment ${i + 1}`);
    item.append(img, remove);
    ui.attachments.append(item);
  });
}

// ------------------------------------------------------------------ the key

function askKey(reason) {
  ui.keyInput.value = state.key;
  ui.keyError.textContent = reason ? `The server said: ${reason}` : "";
  ui.keyError.hidden = !reason;
  if (!ui.keyDialog.open) ui.keyDialog.showModal();
  ui.keyInput.focus();
}

async function saveKey() {
  state.key = ui.keyInput.value.trim();
  store.save("key", state.key);
  ui.keyError.hidden = true;
  try {
    state.models = await api.models();
  } catch (error) {
    ui.keyError.textContent = error instanceof ApiError && error.status === 401
      ? `The server said: ${error.message}` : `Could not reach the server: ${error.message}`;
    ui.keyError.hidden = false;
    ui.keyInput.select();
    return;
  }
  ui.keyDialog.close();
  notify("");
  renderModels();
  ui.input.focus();
}

// ------------------------------------------------------------------ the sidebar on a narrow screen

function setSidebar(open) {
  ui.app.classList.toggle("sidebar-open", open);
  ui.scrim.hidden = !open;
  ui.openSidebar.setAttribute("aria-expanded", String(open));
  if (open) ui.newChat.focus();
}

function resizeInput() {
  ui.input.style.height = "auto";
  ui.input.style.height = `${Math.min(ui.input.scrollHeight, 200)}px`;
}

// ------------------------------------------------------------------ events

function wire() {
  ui.composer.addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  ui.input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  ui.input.addEventListener("input", resizeInput);
  ui.input.addEventListener("paste", (e) => {
    const files = [...(e.clipboardData?.files || [])].filter((f) => f.type.startsWith("image/"));
    if (files.length && currentModel()?.vision) {
      e.preventDefault();
      attach(files);
    }
  });
  ui.stop.addEventListener("click", () => {
    stopGeneration();
    ui.input.focus();
  });
  ui.attach.addEventListener("click", () => ui.file.click());
  ui.file.addEventListener("change", () => {
    attach([...ui.file.files]);
    ui.file.value = "";
  });
  ui.attachments.addEventListener("click", (e) => {
    const b = e.target.closest("[data-detach]");
    if (!b) return;
    state.attachments.splice(Number(b.dataset.detach), 1);
    renderAttachments();
    ui.input.focus();
  });
  ui.newChat.addEventListener("click", () => {
    startConversation();
    setSidebar(false);
    ui.input.focus();
  });
  ui.list.addEventListener("click", (e) => {
    const open = e.target.closest("[data-open]");
    const remove = e.target.closest("[data-delete]");
    if (open) {
      openConversation(open.dataset.open);
      setSidebar(false);
      ui.input.focus();
    } else if (remove) deleteConversation(remove.dataset.delete);
  });
  ui.openSidebar.addEventListener("click", () => setSidebar(true));
  ui.closeSidebar.addEventListener("click", () => setSidebar(false));
  ui.scrim.addEventListener("click", () => setSidebar(false));
  ui.model.addEventListener("change", () => chooseModel(ui.model.value));
  ui.toggleSettings.addEventListener("click", () => {
    const open = ui.settings.hidden;
    ui.settings.hidden = !open;
    ui.toggleSettings.setAttribute("aria-expanded", String(open));
    if (open) ui.temperature.focus();
  });
  for (const field of [ui.temperature, ui.maxTokens, ui.reasoning, ui.toolChoice, ui.system, ui.tools]) {
    field.addEventListener("input", readSettings);
  }
  ui.setKey.addEventListener("click", () => askKey(""));
  ui.keyForm.addEventListener("submit", (e) => {
    e.preventDefault();
    saveKey();
  });
  ui.keyCancel.addEventListener("click", () => ui.keyDialog.close());
  ui.messages.addEventListener("click", (e) => {
    const copy = e.target.closest("[data-copy]");
    if (copy) return copyText(copy.closest(".code-block").querySelector("code").textContent, copy);
    const b = e.target.closest("button[data-action]");
    if (!b) return;
    const i = Number(b.dataset.index);
    const action = b.dataset.action;
    if (action === "edit" && !state.generation) editMessage(i);
    else if (action === "retry" && !state.generation) retry(i);
    else if (action === "regenerate" && !state.generation) regenerate(i);
    else if (action === "copy") copyText(state.conversation.messages[i].content, b);
  });
  ui.messages.addEventListener("submit", (e) => {
    const form = e.target.closest("form.tool-reply");
    if (!form) return;
    e.preventDefault();
    if (state.generation) return;
    sendToolResult(Number(form.dataset.index), form.dataset.call, form.dataset.name, form.elements.result.value);
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && state.generation && !ui.keyDialog.open) {
      stopGeneration();
    } else if (e.key === "Escape" && ui.app.classList.contains("sidebar-open")) {
      setSidebar(false);
    } else if (e.altKey && (e.key === "n" || e.key === "N")) {
      e.preventDefault();
      startConversation();
      ui.input.focus();
    }
  });
  window.addEventListener("storage", (e) => {
    if (e.key === "gguf-serve.conversations") {
      state.index = store.load("conversations", []);
      renderList();
    }
  });
}

async function main() {
  wire();
  showSettings();
  const current = store.load("current", null);
  if (current && state.index.some((c) => c.id === current)) state.conversation = store.loadConversation(current);
  if (!state.conversation) state.conversation = { id: newId(), title: "New chat", model: "", messages: [] };
  renderAll();
  await loadModels();
  ui.input.focus();
  document.body.dataset.ready = "true";
}

main();
