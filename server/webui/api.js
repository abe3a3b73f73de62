// The page's client of the public API: the model list and streamed chat completions,
// with the key from the page's storage. A refusal, or an error sent inside the stream,
// becomes an ApiError holding the server's own message, status and code.

export class ApiError extends Error {
  constructor(status, message, code = null) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
  }
}

async function refusal(response) {
  let message = `${response.status} ${response.statusText}`.trim();
  let code = null;
  try {
    const body = await response.json();
    const error = body.error ?? body;
    if (typeof error === "string") message = error;
    else if (error && error.message) message = error.message;
    code = (error && error.code) ?? null;
  } catch {
    // not JSON (a proxy's page): the status line says it
  }
  return new ApiError(response.status, message, code);
}

// The `data:` payloads of a server-sent event stream, one string per event.
async function* events(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart());
      if (data.length) yield data.join("\n");
    }
  }
}

export class Api {
  constructor(key) {
    this.key = key; // () => the API key, or ""
  }

  headers(json) {
    const headers = json ? { "Content-Type": "application/json" } : {};
    const key = this.key();
    if (key) headers.Authorization = `Bearer ${key}`;
    return headers;
  }

  async models(signal) {
    const response = await fetch("/v1/models", { headers: this.headers(false), signal });
    if (!response.ok) throw await refusal(response);
    return (await response.json()).data;
  }

  // Yields the stream's chat.completion.chunk objects until `data: [DONE]`.
  async* chat(request, signal) {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: this.headers(true), signal,
      body: JSON.stringify({ ...request, stream: true, stream_options: { include_usage: true } }),
    });
    if (!response.ok) throw await refusal(response);
    for await (const data of events(response.body)) {
      if (data === "[DONE]") return;
      let chunk;
      try {
        chunk = JSON.parse(data);
      } catch {
        throw new ApiError(0, `the server sent an event that is not JSON: ${data.slice(0, 200)}`);
      }
      const error = chunk.error;
      if (error) throw new ApiError(response.status, error.message ?? String(error), error.code ?? null);
      yield chunk;
    }
    throw new ApiError(0, "the reply's stream ended before it was complete");
  }
}
