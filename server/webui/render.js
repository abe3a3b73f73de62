// The messages as elements: a user's bubble (text, images, Edit), an answer (reasoning
// folded apart, markdown, tool calls as cards with a field for each result, a line of
// figures, Copy and Regenerate), a tool's result and an error (with Retry). Text goes in
// as text; only renderMarkdown's escaped output goes in as HTML.

import { renderMarkdown } from "./markdown.js";

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function button(label, action, index, extra = {}) {
  const b = el("button", extra.className || "link", label);
  b.type = "button";
  b.dataset.action = action;
  b.dataset.index = index;
  if (extra.aria) b.setAttribute("aria-label", extra.aria);
  return b;
}

// One message's element. `view`: {messages: the conversation's, live: the message being
// generated (or null), busy: whether an answer is being generated}.
export function renderMessage(m, i, view) {
  if (m.role === "user") return userNode(m, i);
  if (m.role === "assistant") return assistantNode(m, i, view);
  if (m.role === "tool") {
    const node = el("article", "message tool");
    node.append(el("div", "tool-head", `Result of ${m.name || "the tool"}`), el("pre", "", m.content));
    return node;
  }
  const node = el("article", "message error");
  node.setAttribute("role", "alert");
  node.append(el("p", "error-title", m.title));
  if (m.detail) node.append(el("p", "error-detail", m.detail));
  if (m.hint) node.append(el("p", "error-hint", m.hint));
  if (i === view.messages.length - 1 && !view.busy) node.append(button("Retry", "retry", i));
  return node;
}

function userNode(m, i) {
  const node = el("article", "message user" + (m.failed ? " failed" : ""));
  node.dataset.index = i;
  const bubble = el("div", "bubble");
  if (m.images?.length) {
    const images = el("div", "images");
    for (const url of m.images) {
      const img = el("img");
      img.src = url;
      img.alt = "attached image";
      images.append(img);
    }
    bubble.append(images);
  }
  if (m.imagesDropped) bubble.append(el("p", "note", `${m.imagesDropped} image(s) not kept: storage was full`));
  if (m.content) bubble.append(el("div", "text", m.content));
  const actions = el("div", "actions");
  actions.append(button("Edit", "edit", i, { aria: "Edit and resend this message" }));
  node.append(bubble, actions);
  return node;
}

function assistantNode(m, i, view) {
  const node = el("article", "message assistant");
  node.dataset.index = i;
  const live = view.live === m;
  if (live) node.setAttribute("aria-busy", "true");
  if (m.reasoning) {
    const details = el("details", "reasoning");
    const summary = el("summary", "", reasoningLabel(m, live));
    details.append(summary, el("div", "reasoning-text", m.reasoning));
    node.append(details);
  }
  const content = el("div", "content markdown");
  content.innerHTML = renderMarkdown(m.content);
  node.append(content);
  if (m.tool_calls?.length) node.append(toolCalls(m, i, live, view.messages));
  const meta = el("div", "meta", metaLine(m, live));
  node.append(meta);
  if (!live) {
    const actions = el("div", "actions");
    if (m.content) actions.append(button("Copy", "copy", i, { aria: "Copy the answer" }));
    const last = view.messages.slice(i + 1).every((x) => x.role === "error");
    if (last) actions.append(button("Regenerate", "regenerate", i, { aria: "Answer again" }));
    node.append(actions);
  }
  return node;
}

function reasoningLabel(m, live) {
  if (live && !m.content && !m.tool_calls.length) return `Thinking… (${words(m.reasoning)})`;
  const seconds = m.thoughtSeconds ? ` for ${m.thoughtSeconds.toFixed(1)} s` : "";
  return `Reasoning${seconds} (${words(m.reasoning)})`;
}

function words(text) {
  const n = (text.match(/\S+/g) || []).length;
  return n === 1 ? "1 word" : `${n} words`;
}

function metaLine(m, live) {
  if (live) return m.content || m.reasoning || m.tool_calls.length ? "" : "Waiting for the first token…";
  const parts = [];
  if (m.stopped) parts.push("Stopped");
  if (m.interrupted) parts.push("Cut off by an error");
  if (m.finish === "length") parts.push("Reached the max tokens");
  const tokens = m.usage?.completion_tokens;
  if (tokens) {
    parts.push(`${tokens} tokens`);
    const decoding = m.seconds - (m.firstSeconds ?? 0);
    if (tokens > 1 && decoding > 0) parts.push(`${((tokens - 1) / decoding).toFixed(1)} tok/s`);
  }
  if (m.firstSeconds !== undefined) parts.push(`first token ${m.firstSeconds.toFixed(2)} s`);
  return parts.join(" · ");
}

function toolCalls(m, i, live, messages) {
  const box = el("div", "tool-calls");
  const answered = new Map(messages.slice(i + 1).filter((x) => x.role === "tool")
    .map((x) => [x.tool_call_id, x]));
  for (const call of m.tool_calls) {
    const card = el("div", "tool-call");
    const head = el("div", "tool-head");
    head.append("Tool call ", el("code", "", call.function.name || "…"));
    let args = call.function.arguments;
    try {
      args = JSON.stringify(JSON.parse(args), null, 2);
    } catch {
      // still streaming, or not JSON: shown as it came
    }
    card.append(head, el("pre", "tool-args", args));
    if (!live && !answered.has(call.id)) {
      const form = el("form", "tool-reply");
      form.dataset.index = i;
      form.dataset.call = call.id;
      form.dataset.name = call.function.name;
      const label = el("label", "", "Result");
      const field = el("textarea");
      field.rows = 2;
      field.name = "result";
      field.id = `result-${i}-${call.id}`;
      label.htmlFor = field.id;
      const submit = el("button", "primary", "Send result");
      submit.type = "submit";
      form.append(label, field, submit);
      card.append(form);
    }
    box.append(card);
  }
  return box;
}
