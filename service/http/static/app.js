// The try-it page: search the catalogue, build a history, compare the retriever's and the reranker's orders.
// Plain DOM, no build step. API paths are relative, so the page also works behind a path prefix.
"use strict";

const $ = (id) => document.getElementById(id);
// loaded: the stored user whose history was last loaded (or saved and shown again), with the entries loaded and
// the newest stored timestamp; null before any load. keyRetry: the load, save or recommend a 401 stopped
// (`askForKey`).
const state = {history: [], apiKey: null, keyRetry: null, last: null, loaded: null};

class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

async function api(path, options = {}) {
  const headers = {...(options.headers || {})};
  if (options.body !== undefined) headers["content-type"] = "application/json";
  if (state.apiKey) headers.authorization = `Bearer ${state.apiKey}`;
  let response;
  try {
    response = await fetch(path, {...options, headers});
  } catch (err) {
    throw new ApiError(0, `the service is unreachable (${err.message})`);
  }
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch { body = null; }
  if (!response.ok) {
    const detail = body && typeof body.detail === "string" ? body.detail : text || response.statusText;
    throw new ApiError(response.status, detail);
  }
  return body;
}

function showError(message) {
  const box = $("error");
  box.textContent = message || "";
  box.hidden = !message;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function label(item) {
  const title = item.title || `item ${item.item_id}`;
  return item.year ? `${title} (${item.year})` : title;
}

function tags(item) {
  const all = [...(item.genres || []), ...(item.attributes || [])];
  return all.length ? el("span", {class: "tags"}, all.join(" · ")) : null;
}

// --- search ---

async function search(event) {
  event.preventDefault();
  showError("");
  const query = $("search").value;
  $("search-results").replaceChildren();
  $("search-status").textContent = "Searching…";
  try {
    const body = await api(`items?query=${encodeURIComponent(query)}&limit=20`);
    const list = $("search-results");
    list.replaceChildren(...body.items.map((item) => el("li", {},
      el("button", {type: "button", class: "pick", "data-item-id": item.item_id,
                    "aria-label": `Add ${label(item)} to the history`, onclick: () => addToHistory(item)},
         el("span", {class: "title"}, label(item)), " ", tags(item),
         el("span", {class: "muted id"}, ` id ${item.item_id} · popularity #${item.popularity_rank}`)))));
    const shown = body.items.length;
    $("search-status").textContent = shown === 0 ? `Nothing matches “${query}”.`
      : `${shown}${body.more ? "+" : ""} item${shown === 1 ? "" : "s"} found; click one to add it to the history.`;
  } catch (err) {
    showError(`Search failed: ${err.message}`);
  }
}

// --- history ---

function addToHistory(item) {
  state.history.push(item);
  renderHistory(`Added ${label(item)}.`);
}

function move(index, by) {
  const target = index + by;
  if (target < 0 || target >= state.history.length) return;
  const [item] = state.history.splice(index, 1);
  state.history.splice(target, 0, item);
  renderHistory(`Moved ${label(item)} to position ${target + 1}.`, target, by < 0 ? "up" : "down");
}

function removeAt(index) {
  const [item] = state.history.splice(index, 1);
  renderHistory(`Removed ${label(item)}.`);
}

function renderHistory(message, focusIndex = null, focusWhich = null) {
  const list = $("history");
  list.replaceChildren(...state.history.map((item, i) => el("li", {"data-item-id": item.item_id},
    el("span", {class: "rank"}, `${i + 1}.`), el("span", {class: "title"}, label(item)), tags(item),
    el("span", {class: "controls"},
      el("button", {type: "button", class: "up", "aria-label": `Move ${label(item)} up`, onclick: () => move(i, -1)},
         "↑"),
      el("button", {type: "button", class: "down", "aria-label": `Move ${label(item)} down`,
                    onclick: () => move(i, 1)}, "↓"),
      el("button", {type: "button", class: "remove", "aria-label": `Remove ${label(item)}`,
                    onclick: () => removeAt(i)}, "✕")))));
  if (focusIndex !== null) list.children[focusIndex]?.querySelector(`button.${focusWhich}`)?.focus();
  const n = state.history.length;
  $("history-status").textContent = `${message || ""} ${n} item${n === 1 ? "" : "s"} in the history.`.trim();
  renderSource();
}

// The stored user whose history the page shows unchanged, or null: the history was edited, or none was loaded.
// Recommend asks for that user, so the service reads the stored history and, with "Exclude", leaves out every
// item the user has seen, not only the last max_len events the page shows.
function loadedUser() {
  const loaded = state.loaded;
  if (!loaded || loaded.ids.length !== state.history.length) return null;
  return state.history.every((item, i) => item.item_id === loaded.ids[i]) ? loaded.user : null;
}

function renderSource() {
  const user = loadedUser();
  const source = $("rec-source");
  if (user !== null) {
    source.textContent = `Recommend asks for the stored user ${user}: the service reads ${user}'s stored history`
      + " and, with “Exclude”, leaves out every item the user has seen, beyond the events shown here.";
  } else if (state.loaded) {
    source.textContent = `The history is edited: Recommend sends the history shown (${state.loaded.user}'s other`
      + ` stored items are not excluded); Save history under ${state.loaded.user} stores only the items added`
      + " since loading.";
  } else {
    source.textContent = "Recommend sends the history shown.";
  }
}

async function describe(itemId) {
  try {
    return await api(`items/${encodeURIComponent(itemId)}`);
  } catch (err) {
    if (err.status === 404) return {item_id: itemId, title: `${itemId} (unknown to this model)`};
    throw err;
  }
}

// Shows `user`'s stored history (the newest max_len events) and remembers it as loaded.
async function showStored(user, message) {
  const body = await api(`users/${encodeURIComponent(user)}/history`);
  // Copies, so that each loaded entry is its own object (told apart from items added later).
  const items = (await Promise.all(body.items.map((e) => describe(e.item_id)))).map((item) => ({...item}));
  const times = body.items.map((e) => e.timestamp).filter((t) => typeof t === "number");
  state.history = items;
  state.loaded = {user, ids: items.map((item) => item.item_id), entries: new Set(items),
                  newest: times.length ? Math.max(...times) : null};
  renderHistory(message || (items.length ? `Loaded the history of ${user}.` : `${user} has no stored history.`));
}

// A service with an API key needs it to save and to read a stored history (a load, or a recommend for a loaded
// user). Its 401 (no key sent, or a wrong one) shows the key row; the row's button, or Enter in it, runs `retry`
// again with the key typed.
function askForKey(doing, button, retry) {
  state.apiKey = null;
  state.keyRetry = retry;
  $("retry-with-key").textContent = button;
  $("key-row").hidden = false;
  $("api-key").focus();
  showError(`${doing} needs the service's API key: type it below.`);
}

function retryWithKey(event) {
  event?.preventDefault();  // Enter in the key field would submit the form, a load without the key
  state.apiKey = $("api-key").value || null;
  state.keyRetry?.();
}

async function loadUser(event) {
  event?.preventDefault();
  showError("");
  const user = $("user-id").value.trim();
  if (!user) return showError("Type a user id first.");
  try {
    await showStored(user);
  } catch (err) {
    if (err.status === 401) return askForKey("Loading a stored history", "Load with key", loadUser);
    showError(`Loading the history failed: ${err.message}`);
    return;
  }
  $("key-row").hidden = true;
}

async function saveUser() {
  showError("");
  const user = $("user-id").value.trim();
  if (!user) return showError("Type the user id to save the history under.");
  // Saved under the user it was loaded from, the loaded events are stored already: only the items added since go.
  const loaded = state.loaded && state.loaded.user === user ? state.loaded : null;
  const fresh = loaded ? state.history.filter((item) => !loaded.entries.has(item)) : state.history;
  if (loaded && !fresh.length) {
    return showError(`Nothing new to save: the loaded events of ${user} are stored already. Add items first.`);
  }
  if (!fresh.length) return showError("The history is empty: nothing to save.");
  const kept = loaded ? state.history.filter((item) => loaded.entries.has(item)).map((item) => item.item_id) : [];
  const edited = loaded && kept.join("\n") !== loaded.ids.join("\n");
  // Timestamps keep the order; events are appended to what the user already has stored (after its newest one).
  const now = Date.now() / 1000;
  const first = Math.max(now - fresh.length, loaded && loaded.newest !== null ? loaded.newest + 1 : 0);
  const events = fresh.map((item, i) => ({user_id: user, item_id: item.item_id, timestamp: first + i}));
  let body;
  try {
    body = await api("events", {method: "POST", body: JSON.stringify({events})});
  } catch (err) {
    if (err.status === 401) return askForKey("Saving", "Save with key", saveUser);
    showError(`Saving failed: ${err.message}`);
    return;
  }
  $("key-row").hidden = true;
  const saved = `Saved ${body.stored} ${loaded ? "new " : ""}event${body.stored === 1 ? "" : "s"} for ${user}`
    + (edited ? " (removing or moving loaded items changes no stored event)." : ".");
  try {
    await showStored(user, `${saved} The history shown is ${user}'s stored one.`);
  } catch (err) {
    $("history-status").textContent = saved;
    showError(`Reading the saved history back failed: ${err.message}`);
  }
}

// --- recommendations ---

function request(rerank, user) {
  const k = Number($("k").value);
  // A loaded, unedited history is asked for by user: the service then reads the whole stored history (its seen
  // set), which the page's window of the last max_len events does not carry.
  const source = user !== null ? {user_id: user} : {history: state.history.map((item) => item.item_id)};
  return {...source, k: Number.isInteger(k) ? k : 10, rerank,
          exclude_seen: $("exclude-seen").checked, personalize: $("personalize").checked};
}

async function recommend(event) {
  event?.preventDefault();
  showError("");
  if (!state.history.length) {
    $("rec-status").textContent = "The history is empty: these are the most popular items.";
  }
  const button = $("recommend");
  button.disabled = true;
  try {
    // One after the other: sent together they would share a micro-batch, and its stage timings.
    const user = loadedUser();
    const retrieved = await api("recommend", {method: "POST", body: JSON.stringify(request(false, user))});
    const reranked = await api("recommend", {method: "POST", body: JSON.stringify(request(true, user))});
    state.last = {retrieved, reranked, user, excluded: $("exclude-seen").checked};
    if (user !== null) $("key-row").hidden = true;  // asked by user, the key (if any) was right
    renderResults();
  } catch (err) {
    // A loaded user is asked for by id, which needs the key too: normally known from the load, unless it changed.
    if (err.status === 401) return askForKey("Recommending for a stored user", "Recommend with key", recommend);
    showError(`Recommend failed: ${err.message}`);
  } finally {
    button.disabled = false;
  }
}

function timing(response) {
  const t = response.timing_ms;
  const ms = (x) => `${x.toFixed(1)} ms`;
  return `queue ${ms(t.queue)} · encode ${ms(t.encode)} · search ${ms(t.search)} · rerank ${ms(t.rerank)}`
    + ` · total ${ms(t.total)}`;
}

function movement(item, other) {
  const before = other.findIndex((o) => o.item_id === item.item_id);
  if (before < 0) return el("span", {class: "moved new", title: "not in the other list"}, "new");
  const places = before + 1 - item.rank;
  if (places > 0) return el("span", {class: "moved up", title: `${places} places higher than in the other list`},
                            `↑${places}`);
  if (places < 0) return el("span", {class: "moved down", title: `${-places} places lower than in the other list`},
                            `↓${-places}`);
  return el("span", {class: "moved same", title: "same place in both lists"}, "=");
}

function renderList(list, response, other) {
  list.replaceChildren(...response.items.map((item) => el("li", {"data-item-id": item.item_id},
    el("span", {class: "rank"}, `${item.rank}.`), " ", movement(item, other.items), " ",
    el("span", {class: "title"}, label(item)), " ", tags(item),
    el("span", {class: "muted scores"},
       ` id ${item.item_id} · score ${item.score.toFixed(3)} · retrieval ${item.retrieval_score.toFixed(3)}`),
    " ",
    el("button", {type: "button", class: "add", "aria-label": `Add ${label(item)} to the history`,
                  onclick: () => addToHistory(item)}, "+ history"))));
}

function renderResults() {
  if (!state.last) return;
  const {retrieved, reranked, user, excluded} = state.last;
  const compare = $("rerank").checked;
  renderList($("retrieved"), retrieved, reranked);
  renderList($("reranked"), reranked, retrieved);
  $("retrieved-timing").textContent = timing(retrieved);
  $("reranked-timing").textContent = timing(reranked);
  $("retrieved-col").hidden = false;
  $("reranked-col").hidden = !compare;
  const notes = [`Model ${retrieved.model_version}; the model read ${retrieved.history_used} history items.`];
  if (user !== null) {
    notes.push(`Asked for the stored user ${user}${excluded ? ", every item it has seen excluded" : ""}.`);
  }
  if (retrieved.fallback) notes.push("No known history item: the most popular items.");
  if (retrieved.unknown_items.length) notes.push(`Unknown to the model: ${retrieved.unknown_items.join(", ")}.`);
  if (compare && !reranked.reranked && !reranked.fallback) notes.push("This bundle has no ranker: no reranking.");
  notes.push(compare ? "Marks compare each list with the other." : "Rerank is off: the retriever's order alone.");
  $("rec-status").textContent = notes.join(" ");
}

async function describeModel() {
  try {
    const ready = await api("readyz");
    $("model").textContent = `Model ${ready.model_version} (${ready.backbone}, ${ready.n_items} items, `
      + `${ready.ranker ? `${ready.ranker} ranker` : "no ranker"}).`;
    // The bundle's repeat policy is the default: history items are shown only where it was evaluated so.
    $("exclude-seen").checked = ready.repeats !== "allow";
  } catch (err) {
    $("model").textContent = `The service is not ready: ${err.message}`;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("search-form").addEventListener("submit", search);
  $("user-form").addEventListener("submit", loadUser);
  $("save-user").addEventListener("click", saveUser);
  $("retry-with-key").addEventListener("click", retryWithKey);
  $("api-key").addEventListener("keydown", (event) => { if (event.key === "Enter") retryWithKey(event); });
  $("clear-history").addEventListener("click", () => { state.history = []; renderHistory("Cleared."); });
  $("rec-form").addEventListener("submit", recommend);
  $("rerank").addEventListener("change", renderResults);
  describeModel();
  renderHistory("");
});
