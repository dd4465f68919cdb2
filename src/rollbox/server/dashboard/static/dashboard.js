// The live dashboard: polls the server's dashboard routes with the token kept in this tab's sessionStorage
// (sent as a bearer header, never in a URL) and updates the page in place. A server without tokens says so
// (/dashboard/api/access), and its page asks for none.

import { LineChart } from "./chart.js";
import { byId, bytes, duration, el, number, setText, showRows } from "./dom.js";
import { Viewer } from "./viewer.js";

const TOKEN_KEY = "rollbox-token";
const PAUSE_MS = 1000; // between an answer and the next call: updates stay under 2 s apart while answers are fast
const PAGE_SIZE = 100;

const state = { token: sessionStorage.getItem(TOKEN_KEY), open: false, generation: 0, page: 0, selected: null,
  admin: false, rows: new Map(), cpu: new Map(), updates: 0 };

class Unauthorized extends Error {}

async function api(path) {
  const headers = state.token ? { Authorization: `Bearer ${state.token}` } : {};
  const answer = await fetch(path, { headers, cache: "no-store", credentials: "omit" });
  if (answer.status === 401) throw new Unauthorized((await answer.json()).error.message);
  if (!answer.ok) throw new Error(`${path}: ${answer.status}`);
  return answer.json();
}

// -- sign-in ---------------------------------------------------------------------------------------

function showSignIn(message) {
  state.generation += 1;
  state.open = false;
  byId("fleet").hidden = true;
  byId("sign-out").hidden = true;
  byId("sign-in").hidden = false;
  setText(byId("sign-in-error"), message || "");
  setText(byId("who"), "");
}

function signIn() {
  const token = byId("token").value.trim();
  if (!token) return;
  byId("token").value = "";
  state.token = token;
  sessionStorage.setItem(TOKEN_KEY, token);
  start();
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  showSignIn("");
}

// -- the fleet ---------------------------------------------------------------------------------

const charts = {};

function renderNode(overview) {
  setText(byId("who"), `${overview.tenant}${overview.admin ? " (admin: every tenant)" : ""}`
    + `${state.open ? "; an open server: no token needed" : ""}`);
  setText(byId("node-sandboxes"), overview.node.sandboxes ?? "–");
  setText(byId("node-max"), overview.node.max_sandboxes ?? "–");
  setText(byId("node-claims"), overview.node.claims ?? "–");
  setText(byId("sandbox-count"), overview.sandboxes.length);
  const nodes = Object.entries(overview.nodes || {});
  byId("nodes-section").hidden = nodes.length === 0;
  showRows(byId("nodes").tBodies[0], nodes.map(([name, node]) => el("tr", { "data-name": name },
    el("td", { text: name }), el("td", { text: node.status ?? "" }), el("td", { class: "num", text: node.sandboxes ?? "" }),
    el("td", { class: "num", text: node.claims ?? "" }), el("td", { class: "num", text: node.max_sandboxes ?? "" }),
    el("td", { text: node.url ?? "" }))));
  showRows(byId("pools").tBodies[0], overview.pools.map((pool) => el("tr", { "data-name": pool.name },
    el("td", { text: pool.name }), el("td", { text: pool.template }), el("td", { class: "num ready", text: pool.ready }),
    el("td", { class: "num target", text: pool.target }), el("td", { class: "num starting", text: pool.starting }))));
}

function renderLatency(overview) {
  const now = overview.now;
  for (const kind of ["claim", "exec"]) {
    charts[kind] ||= new LineChart(byId(`chart-${kind}`), [{ name: "p50", color: "#2b6cb0" }, { name: "p99", color: "#c53030" }],
      { xLabel: (x) => (x >= now - 1 ? "now" : `-${Math.round((now - x) / 60)} min`), yLabel: (y) => y.toFixed(y < 10 ? 1 : 0) });
    const points = overview.latency[kind].map((p) => ({ x: p.t, p50: p.p50 * 1000, p99: p.p99 * 1000 }));
    charts[kind].draw(points, [now - 600, now]);
    byId(`chart-${kind}`).dataset.calls = String(overview.latency[kind].reduce((sum, p) => sum + p.count, 0));
  }
}

function sandboxRow(id) {
  let row = state.rows.get(id);
  if (!row) {
    const cells = {};
    const tr = el("tr", { "data-id": id });
    for (const name of ["id", "tenant", "state", "template", "age", "cpu", "memory", "cost", "labels"]) {
      cells[name] = el("td", { class: name });
      tr.append(cells[name]);
    }
    setText(cells.id, id);
    tr.addEventListener("click", () => selectSandbox(id));
    row = { tr, cells };
    state.rows.set(id, row);
  }
  return row;
}

function renderSandboxes(overview) {
  const all = overview.sandboxes;
  const pages = Math.max(1, Math.ceil(all.length / PAGE_SIZE));
  state.page = Math.min(state.page, pages - 1);
  const shown = all.slice(state.page * PAGE_SIZE, (state.page + 1) * PAGE_SIZE);
  setText(byId("page-info"), `${all.length ? state.page * PAGE_SIZE + 1 : 0}–${state.page * PAGE_SIZE + shown.length} of ${all.length}`);
  const keep = new Set(shown.map((info) => info.id));
  for (const id of state.rows.keys()) if (!keep.has(id)) { state.rows.delete(id); state.cpu.delete(id); }
  showRows(byId("sandboxes").tBodies[0], shown.map((info) => {
    const { tr, cells } = sandboxRow(info.id);
    tr.classList.toggle("selected", info.id === state.selected);
    setText(cells.tenant, info.tenant);
    setText(cells.state, info.state);
    setText(cells.template, info.warmpool ? `${info.template} / ${info.warmpool}` : info.template);
    setText(cells.age, duration(overview.now - info.created_at));
    setText(cells.labels, Object.entries(info.labels || {}).map(([k, v]) => `${k}=${v}`).join(", "));
    return tr;
  }));
  if (state.selected && !state.rows.has(state.selected) && !all.some((info) => info.id === state.selected)) {
    state.selected = null;
  }
  return shown.map((info) => info.id);
}

function renderStats(stats, now) {
  for (const [id, row] of state.rows) {
    const figures = stats[id];
    if (!figures) continue;
    const before = state.cpu.get(id);
    state.cpu.set(id, { seconds: figures.cpu_seconds, at: now });
    const share = before && now > before.at ? (100 * (figures.cpu_seconds - before.seconds)) / (now - before.at) : null;
    setText(row.cells.cpu, `${number(figures.cpu_seconds, 2)} s${share === null ? "" : ` (${share.toFixed(0)}%)`}`);
    row.cells.cpu.dataset.seconds = String(figures.cpu_seconds);
    setText(row.cells.memory, bytes(figures.memory_bytes));
    row.cells.memory.dataset.bytes = String(figures.memory_bytes);
    const cost = figures.cost;
    setText(row.cells.cost, cost ? `${number(cost.cpu_seconds, 2)}, ${number(cost.memory_gb_seconds, 3)}` : "–");
  }
}

async function renderCommands() {
  const section = byId("commands-section");
  section.hidden = !(state.admin && state.selected);
  if (section.hidden) return;
  const id = state.selected;
  const entries = await api(`/dashboard/api/sandboxes/${encodeURIComponent(id)}/commands`);
  setText(byId("commands-sandbox"), id);
  showRows(byId("commands").tBodies[0], entries.slice().reverse().map((entry) => el("tr", {},
    el("td", { text: new Date(entry.at * 1000).toLocaleTimeString() }), el("td", { text: entry.tenant }),
    el("td", { class: "num", text: entry.exit_code ?? "timeout" }), el("td", { class: "num", text: entry.duration_ms.toFixed(1) }),
    el("td", { class: "command", text: entry.command }))));
}

function selectSandbox(id) {
  if (!state.admin) return;
  state.selected = state.selected === id ? null : id;
  for (const [rowId, row] of state.rows) row.tr.classList.toggle("selected", rowId === state.selected);
  renderCommands().catch(() => {});
}

async function refresh() {
  const overview = await api("/dashboard/api/overview");
  state.admin = overview.admin;
  renderNode(overview);
  renderLatency(overview);
  const ids = renderSandboxes(overview);
  if (ids.length) renderStats(await api(`/dashboard/api/stats?ids=${ids.map(encodeURIComponent).join(",")}`), overview.now);
  await renderCommands();
  state.updates += 1;
  if (state.updates === 1) performance.mark("rollbox-first-update"); // once: marks would pile up
  document.body.dataset.updates = String(state.updates);
  setText(byId("updated"), `updated ${new Date(overview.now * 1000).toLocaleTimeString()}`);
}

async function poll(generation) {
  while (generation === state.generation) {
    try {
      await refresh();
      byId("updated").classList.remove("error");
    } catch (error) {
      if (error instanceof Unauthorized) {
        sessionStorage.removeItem(TOKEN_KEY);
        state.token = null;
        showSignIn(error.message);
        return;
      }
      setText(byId("updated"), `no answer: ${error.message}`);
      byId("updated").classList.add("error");
    }
    await new Promise((resolve) => setTimeout(resolve, PAUSE_MS));
  }
}

function start() {
  if (!state.token && !state.open) { showSignIn(""); return; }
  state.generation += 1;
  byId("sign-in").hidden = true;
  byId("fleet").hidden = !byId("trajectories").hidden;
  byId("sign-out").hidden = state.open;
  poll(state.generation);
}

// Asks the server whether it needs a token at all; if it cannot say, the page asks for one as before.
async function begin() {
  if (!state.token) {
    try {
      const answer = await fetch("/dashboard/api/access", { cache: "no-store", credentials: "omit" });
      state.open = answer.ok && (await answer.json()).token_required === false;
    } catch {
      state.open = false;
    }
  }
  start();
}

function showTab(name) {
  byId("tab-fleet").classList.toggle("active", name === "fleet");
  byId("tab-trajectories").classList.toggle("active", name === "trajectories");
  byId("trajectories").hidden = name !== "trajectories";
  byId("fleet").hidden = name !== "fleet" || !byId("sign-in").hidden;
}

function page(step) {
  state.page = Math.max(0, state.page + step);
}

const viewer = new Viewer(byId("viewer"));
byId("run-file").addEventListener("change", async (event) => {
  const file = event.target.files[0];
  if (file) viewer.load(await file.text(), file.name);
});
byId("sign-in-button").addEventListener("click", signIn);
byId("token").addEventListener("keydown", (event) => { if (event.key === "Enter") signIn(); });
byId("sign-out").addEventListener("click", signOut);
byId("tab-fleet").addEventListener("click", () => showTab("fleet"));
byId("tab-trajectories").addEventListener("click", () => showTab("trajectories"));
byId("page-prev").addEventListener("click", () => page(-1));
byId("page-next").addEventListener("click", () => page(1));
begin();
