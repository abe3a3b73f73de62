// What the page keeps in the browser's localStorage (nothing is stored on the server):
// the settings, the API key, the list of conversations and each conversation under a
// key of its own, so that saving one does not rewrite the others.

const PREFIX = "gguf-serve.";

export function load(name, fallback) {
  try {
    const text = localStorage.getItem(PREFIX + name);
    return text === null ? fallback : JSON.parse(text);
  } catch {
    return fallback;
  }
}

// False when the browser refused (its quota is full, or storage is off).
export function save(name, value) {
  try {
    localStorage.setItem(PREFIX + name, JSON.stringify(value));
    return true;
  } catch {
    return false;
  }
}

export function remove(name) {
  try {
    localStorage.removeItem(PREFIX + name);
  } catch {
    // storage is off: nothing was kept
  }
}

// Save a conversation; if the quota is full, again with its images left out (they stay
// on the page until it is closed). Returns "saved", "without-images" or "failed".
export function saveConversation(conversation) {
  if (save(`conversation.${conversation.id}`, conversation)) return "saved";
  const lean = {
    ...conversation,
    messages: conversation.messages.map((m) =>
      m.images?.length ? { ...m, images: [], imagesDropped: m.images.length } : m),
  };
  return save(`conversation.${conversation.id}`, lean) ? "without-images" : "failed";
}

export function loadConversation(id) {
  return load(`conversation.${id}`, null);
}

export function removeConversation(id) {
  remove(`conversation.${id}`);
}
