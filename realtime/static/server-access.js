// What every page does to reach a server that may need an API key: the header for fetch, the subprotocols for
// WebSockets, telling a refused key from other failures, and reloading once the key has been typed.

export const KEY_PROTOCOL = "openai-insecure-api-key.";

// Authorization header for fetch (none without a key).
export function authHeaders(key) {
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// Browsers cannot set headers on a WebSocket, so the key rides in a subprotocol. A browser aborts the handshake
// unless the server echoes one of the offered subprotocols, and the server never echoes the key: "realtime" beside
// it is the one echoed.
export function socketProtocols(key) {
  return key ? ["realtime", KEY_PROTOCOL + key] : [];
}

// Why a WebSocket that never opened was refused, when the reason is the key: the browser reports only code 1006,
// so ask an HTTP route that needs the same key. null: the key is not the problem (or the server is unreachable).
export async function refusedKey(key) {
  try {
    const response = await fetch("v1/models", { headers: authHeaders(key) });
    if (response.status !== 401) return null;
  } catch {
    return null;
  }
  return key
    ? "Authentication failed: the server refused this API key (HTTP 401)"
    : "Authentication failed: the server needs an API key (HTTP 401): enter it above";
}

// Calls onKey(key) once typing in the key field pauses (and on change), each time the key differs from the last.
export function watchKey(input, onKey, pauseMs = 400) {
  let last = input.value.trim();
  let timer = null;
  const check = () => {
    clearTimeout(timer);
    const key = input.value.trim();
    if (key === last) return;
    last = key;
    onKey(key);
  };
  input.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(check, pauseMs);
  });
  input.addEventListener("change", check);
  return () => input.value.trim();
}
