// One episode of a run as a timeline: per step the model calls that chose the action (when the trajectory has
// them), the action, its exit code and time, and the observation; then the verdict's tests, failed ones first.
// Everything shown goes through textContent (dom.js): actions, observations and model text are untrusted.

import { el, number } from "./dom.js";

const OUTLINE = new Set(["episode_id", "schema_version", "observation", "steps", "verdict"]);
const STEP_FIELDS = new Set(["action", "observation", "reward", "terminated", "truncated", "error", "exit_code",
  "policy_ms", "sandbox_ms", "model_calls"]);

export function show(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(3);
  if (typeof value === "string") return value;
  return JSON.stringify(value, null, 2);
}

function details(summary, ...body) {
  return el("details", {}, el("summary", { text: summary }), ...body);
}

// A tool call as a person reads it: the command, the file and the edit; what is not a tool call, as JSON.
function action(call) {
  const tool = call?.tool;
  if (tool === "bash") return [el("pre", { class: "action", text: `$ ${call.command}` })];
  if (tool === "submit") return [el("pre", { class: "action", text: "submit" })];
  if (tool === "read_file") return [el("pre", { class: "action", text: `read_file ${call.path}` })];
  if (tool === "write_file") {
    return [el("pre", { class: "action", text: `write_file ${call.path}` }), el("pre", { class: "content", text: call.content })];
  }
  if (tool === "str_replace") {
    const lines = (text, mark) => String(text).split("\n").map((line) => `${mark} ${line}`).join("\n");
    return [el("pre", { class: "action", text: `str_replace ${call.path}` }),
      el("pre", { class: "diff", text: `${lines(call.old, "-")}\n${lines(call.new, "+")}` })];
  }
  return [el("pre", { class: "action", text: show(call) })];
}

function replyText(response) {
  if (typeof response === "string") return response;
  const text = response?.choices?.[0]?.message?.content ?? response?.content ?? response?.output_text;
  return typeof text === "string" ? text : null;
}

function usageText(usage) {
  if (!usage || typeof usage !== "object") return "";
  return Object.entries(usage).filter(([, v]) => typeof v === "number").map(([k, v]) => `${k} ${v}`).join(" · ");
}

// A model call: {request, response, usage}, as a model gateway records it on the step whose action it chose.
function modelCall(call, index) {
  const request = call?.request;
  const messages = Array.isArray(request?.messages) ? request.messages : null;
  const usage = usageText(call?.usage);
  const head = [`model call ${index + 1}`, request?.model, usage].filter(Boolean).join(" · ");
  const reply = replyText(call?.response);
  return el("div", { class: "model-call", "data-call": String(index) },
    el("div", { class: "label", text: head }),
    details(messages ? `request: ${messages.length} messages` : "request",
      ...(messages
        ? messages.map((message) => el("div", { class: "message" }, el("span", { class: "role", text: message?.role ?? "?" }),
          el("pre", { text: show(message?.content) })))
        : [el("pre", { text: show(request) })])),
    el("div", { class: "label", text: "response" }),
    el("pre", { class: "response", text: reply ?? show(call?.response) }),
    ...(reply !== null && typeof call?.response === "object" ? [details("the whole response", el("pre", { text: show(call.response) }))] : []));
}

function badges(step) {
  const shown = [el("span", { class: "tool", text: step.action?.tool ?? "invalid" })];
  if (typeof step.exit_code === "number") {
    shown.push(el("span", { class: `exit ${step.exit_code === 0 ? "ok" : "failed"}`, text: `exit ${step.exit_code}` }));
  }
  if (step.error) shown.push(el("span", { class: "exit failed", text: `error ${step.error}` }));
  if (step.terminated || step.truncated) {
    shown.push(el("span", { class: "ending", text: `${step.terminated ? "terminated" : "truncated"}, reward ${show(step.reward)}` }));
  }
  return shown;
}

function step(record, index, startMs) {
  const calls = Array.isArray(record.model_calls) ? record.model_calls : [];
  const extra = Object.entries(record).filter(([key]) => !STEP_FIELDS.has(key)); // fields newer than this page
  return el("li", { class: "step", "data-step": String(index) },
    el("div", { class: "step-head" }, el("span", { class: "index", text: String(index + 1) }), ...badges(record),
      el("span", { class: "muted time", text: `at ${number(startMs / 1000, 2)} s · policy ${number(record.policy_ms, 1)} ms · `
        + `sandbox ${number(record.sandbox_ms, 1)} ms` })),
    ...(calls.length ? [el("div", { class: "model-calls" }, ...calls.map(modelCall))] : []),
    ...action(record.action),
    el("div", { class: "label", text: "observation" }),
    el("pre", { class: "observation", text: show(record.observation) }),
    ...extra.map(([key, value]) => el("div", {}, el("span", { class: "label", text: `${key}: ` }), el("code", { text: show(value) }))));
}

function testRows(verdict) {
  const rows = [];
  for (const [kind, tests] of [["FAIL_TO_PASS", verdict.fail_to_pass], ["PASS_TO_PASS", verdict.pass_to_pass]]) {
    for (const [name, outcome] of Object.entries(tests || {})) rows.push({ name, kind, outcome });
  }
  return rows.sort((a, b) => Number(a.outcome === "passed") - Number(b.outcome === "passed"));
}

function verdictSection(verdict) {
  if (!verdict || typeof verdict !== "object") return [];
  const rows = testRows(verdict);
  const passed = rows.filter((row) => row.outcome === "passed").length;
  return [el("section", { class: "verdict" },
    el("h4", { text: `Verdict: reward ${show(verdict.reward)}, ${verdict.resolved ? "resolved" : "not resolved"}; `
      + `${passed} of ${rows.length} tests passed in ${number(verdict.duration_ms, 0)} ms` }),
    el("table", { class: "tests" }, el("thead", {}, el("tr", {}, ...["Test", "Kind", "Outcome"].map((h) => el("th", { text: h })))),
      el("tbody", {}, ...rows.map((row) => el("tr", { "data-outcome": row.outcome },
        el("td", { class: "test", text: row.name }), el("td", { text: row.kind }),
        el("td", { class: `outcome ${row.outcome}`, text: row.outcome }))))),
    ...(verdict.log ? [details("test log", el("pre", { class: "log", text: verdict.log }))] : []))];
}

export function episodeTimeline(episode) {
  const outline = Object.entries(episode).filter(([key]) => !OUTLINE.has(key));
  let at = 0;
  const steps = episode.steps.map((record, index) => {
    const shown = step(record, index, at + (Number(record.policy_ms) || 0));
    at += (Number(record.policy_ms) || 0) + (Number(record.sandbox_ms) || 0);
    return shown;
  });
  const cpu = episode.cost?.cpu_seconds ?? episode.cpu_seconds;
  const summary = [`reward ${show(episode.reward)}`, episode.resolved ? "resolved" : "not resolved",
    `${episode.steps.length} steps`, `${number(episode.wall_s, 2)} s`, `${number(cpu, 3)} CPU-seconds`,
    ...(episode.error ? [`error: ${episode.error}`] : [])].join(" · ");
  return [
    el("h3", { text: episode.episode_id }),
    el("p", { class: "episode-summary", text: summary }),
    details("every field of the episode", el("table", { class: "fields" }, el("tbody", {}, ...outline.map(([key, value]) =>
      el("tr", {}, el("th", { text: key }), el("td", {}, el("pre", { text: show(value) }))))))),
    details("first observation (the task)", el("pre", { class: "observation", text: show(episode.observation) })),
    el("ol", { class: "timeline" }, ...steps),
    ...verdictSection(episode.verdict),
  ];
}
