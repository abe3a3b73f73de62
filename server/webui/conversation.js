// The conversation's rules, apart from the page: which messages go into a request and
// how, the request's body from the settings, a streamed tool call put together, and an
// error said in words a person reads. No DOM here.

import { ApiError } from "./api.js";

export function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

export function titleOf(conversation) {
  const first = conversation.messages.find((m) => m.role === "user");
  const text = (first?.content || (first?.images?.length ? "Image" : "") || "New chat").replace(/\s+/g, " ").trim();
  return text.length > 48 ? text.slice(0, 47) + "…" : text;
}

// A request the page does not send (no model, tools that are not JSON).
export class LocalError extends Error {
  constructor(title, detail) {
    super(detail);
    this.title = title;
  }
}

export function parseTools(settings) {
  const text = settings.tools.trim();
  if (!text) return null;
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch (error) {
    throw new LocalError("The tools in the settings are not valid JSON.", error.message);
  }
  if (!Array.isArray(parsed)) throw new LocalError("The tools in the settings must be a JSON array.", "");
  return parsed;
}

// The messages as the API takes them: errors, failed user messages and empty replies left out.
export function apiMessages(messages, system = "") {
  const out = [];
  if (system.trim()) out.push({ role: "system", content: system });
  for (const m of messages) {
    if (m.role === "user" && !m.failed) {
      const images = m.images || [];
      out.push({
        role: "user",
        content: images.length
          ? [{ type: "text", text: m.content }, ...images.map((url) => ({ type: "image_url", image_url: { url } }))]
          : m.content,
      });
    } else if (m.role === "assistant" && (m.content || m.tool_calls?.length)) {
      const message = { role: "assistant", content: m.content || null };
      if (m.reasoning) message.reasoning_content = m.reasoning;
      if (m.tool_calls?.length) message.tool_calls = m.tool_calls;
      out.push(message);
    } else if (m.role === "tool") {
      out.push({ role: "tool", tool_call_id: m.tool_call_id, content: m.content });
    }
  }
  return out;
}

// The streamed chat completion's body for the conversation's next answer, with the settings.
export function requestBody(conversation, s) {
  const body = {
    model: conversation.model, messages: apiMessages(conversation.messages, s.system), temperature: s.temperature,
  };
  const maxTokens = parseInt(s.maxTokens, 10);
  if (maxTokens > 0) body.max_tokens = maxTokens;
  if (s.reasoning !== "default") body.chat_template_kwargs = { enable_thinking: s.reasoning === "on" };
  const defined = parseTools(s);
  if (defined) {
    body.tools = defined;
    if (s.toolChoice !== "auto") body.tool_choice = s.toolChoice;
  }
  return body;
}

// An error as the conversation shows it: what happened, the server's words, what to do.
export function describe(error) {
  if (error instanceof LocalError) return { title: error.title, detail: error.message };
  if (!(error instanceof ApiError)) {
    return { title: "Could not reach the server.", detail: error.message || String(error) };
  }
  const { status, code } = error;
  let title = "The server refused the request.";
  if (status === 401) title = "The server refused the API key.";
  else if (code === "context_length_exceeded") title = "The conversation is too long for the model's context.";
  else if (status === 429) title = "The server is busy.";
  else if (status === 503) title = "The model is not ready.";
  else if (status === 0) title = "The reply was cut off.";
  else if (status >= 500 || status === 200) title = "The server failed while answering.";
  const hints = {
    401: "Set the key with the key button at the top.",
    429: "Its queue is full: try again in a moment.",
    503: "Try again in a moment.",
  };
  const hint = code === "context_length_exceeded" ? "Shorten or edit the message, or start a new chat." : hints[status];
  return { title, detail: error.message, hint, status, code };
}

// A streamed tool call's piece into the calls made so far (OpenAI's deltas by index).
export function mergeCall(calls, delta) {
  const i = delta.index ?? calls.length;
  const call = calls[i] || (calls[i] = { id: "", type: "function", function: { name: "", arguments: "" } });
  if (delta.id) call.id = delta.id;
  if (delta.function?.name) call.function.name += delta.function.name;
  if (delta.function?.arguments) call.function.arguments += delta.function.arguments;
}

// The user message an empty reply answered: marked failed, so that later requests leave it out.
export function markUnanswered(conversation, message) {
  const at = conversation.messages.indexOf(message);
  for (let i = at - 1; i >= 0; i--) {
    const m = conversation.messages[i];
    if (m.role === "user") {
      m.failed = true;
      break;
    }
    if (m.role === "assistant") break;
  }
}
