// The trajectory viewer: parses a trajectories.jsonl (one episode a line, docs/tasks.md) and shows the run's
// reward curve, its episodes by task and reward, and the chosen one as a timeline (episode.js).
// Everything shown goes through textContent (dom.js): observations are untrusted program output.

import { LineChart } from "./chart.js";
import { el, number } from "./dom.js";
import { episodeTimeline, show } from "./episode.js";

export function parseRun(text) {
  const episodes = [];
  const problems = [];
  const lines = text.split("\n");
  lines.forEach((line, index) => {
    if (!line.trim()) return;
    if (index === lines.length - 1) { problems.push(`line ${index + 1}: cut short (no newline), skipped`); return; }
    try {
      const episode = JSON.parse(line);
      if (typeof episode !== "object" || episode === null || !Array.isArray(episode.steps)) throw new Error("not an episode");
      episodes.push(episode);
    } catch (error) {
      problems.push(`line ${index + 1}: ${error.message}`);
    }
  });
  return { episodes, problems };
}

// The iteration an episode belongs to: the tag its id starts with (`it3/<task>/<group>/<member>`).
function tagOf(episode) {
  return String(episode.episode_id ?? "").split("/")[0];
}

// The reward curve: the mean reward per iteration, or the running mean over episodes when the run has one tag.
export function rewardCurve(episodes) {
  const tags = [];
  const sums = new Map();
  for (const episode of episodes) {
    const tag = tagOf(episode);
    if (!sums.has(tag)) { tags.push(tag); sums.set(tag, { total: 0, count: 0 }); }
    const sum = sums.get(tag);
    sum.total += Number(episode.reward) || 0;
    sum.count += 1;
  }
  if (tags.length > 1) {
    return { unit: "iteration", labels: tags, points: tags.map((tag, x) => ({ x, mean: sums.get(tag).total / sums.get(tag).count })) };
  }
  let total = 0;
  return { unit: "episode", labels: episodes.map((_, i) => String(i + 1)),
    points: episodes.map((episode, x) => { total += Number(episode.reward) || 0; return { x, mean: total / (x + 1) }; }) };
}

// The CPU-seconds an episode's claim used (its `cost`, from the cgroups), or the older `cpu_seconds` field.
function cpuOf(episode) {
  const seconds = episode.cost?.cpu_seconds ?? episode.cpu_seconds;
  return typeof seconds === "number" ? seconds : null;
}

function memoryOf(episode) {
  const gbSeconds = episode.cost?.memory_gb_seconds;
  return typeof gbSeconds === "number" ? gbSeconds : null;
}

export class Viewer {
  constructor(root) {
    this.root = root;
    this.episodes = [];
    this.selected = null;
  }

  load(text, name) {
    const { episodes, problems } = parseRun(text);
    this.episodes = episodes;
    this.name = name;
    this.selected = null;
    const tasks = [...new Set(episodes.map((e) => e.task_id))].sort();
    this.task = el("select", { "data-role": "task" }, el("option", { text: `every task (${tasks.length})` }));
    this.task.firstChild.value = "";
    for (const task of tasks) { const option = el("option", { text: task }); option.value = task; this.task.append(option); }
    this.order = el("select", { "data-role": "order" });
    for (const [value, label] of [["file", "in file order"], ["reward-desc", "reward, highest first"],
      ["reward-asc", "reward, lowest first"], ["cost-desc", "CPU-seconds, most first"]]) {
      const option = el("option", { text: label });
      option.value = value;
      this.order.append(option);
    }
    this.task.addEventListener("change", () => this.renderList());
    this.order.addEventListener("change", () => this.renderList());
    const resolved = episodes.filter((e) => e.resolved).length;
    const mean = episodes.reduce((sum, e) => sum + (Number(e.reward) || 0), 0) / (episodes.length || 1);
    const cpu = episodes.reduce((sum, e) => sum + (cpuOf(e) ?? 0), 0);
    const memory = episodes.reduce((sum, e) => sum + (memoryOf(e) ?? 0), 0);
    this.list = el("tbody");
    this.detail = el("div", { class: "episode", "data-role": "episode" });
    const chart = el("div", { class: "chart", "data-role": "reward-curve" });
    this.root.replaceChildren(
      el("p", { class: "summary", "data-role": "summary",
        text: `${name}: ${episodes.length} episodes of ${tasks.length} tasks; mean reward ${number(mean, 3)}; `
          + `${resolved} resolved; ${number(cpu, 1)} CPU-seconds, ${number(memory, 3)} memory GB-seconds` }),
      ...problems.map((problem) => el("p", { class: "error", text: problem })),
      el("figure", {}, el("figcaption", { text: "Reward curve" }), chart),
      el("div", { class: "filters" }, el("label", {}, "Task ", this.task), el("label", {}, "Order ", this.order)),
      el("div", { class: "split" },
        el("table", { class: "episodes" }, el("thead", {}, el("tr", {}, ...["Episode", "Task", "Reward", "Resolved", "Steps",
          "Wall s", "CPU-s", "Mem GB-s"].map((h) => el("th", { text: h })))), this.list),
        this.detail));
    const curve = rewardCurve(episodes);
    chart.dataset.points = String(curve.points.length);
    new LineChart(chart, [{ name: "mean", color: "#2f855a" }], {
      xLabel: (x) => `${curve.unit} ${curve.labels[Math.round(x)] ?? ""}`, yLabel: (y) => y.toFixed(2),
    }).draw(curve.points, curve.points.length > 1 ? undefined : [-1, 1]);
    this.renderList();
  }

  renderList() {
    const task = this.task.value;
    const shown = this.episodes.filter((e) => !task || e.task_id === task);
    const order = this.order.value;
    const key = order.startsWith("reward") ? (e) => Number(e.reward) || 0 : (e) => cpuOf(e) ?? 0;
    if (order !== "file") shown.sort((a, b) => (order.endsWith("desc") ? key(b) - key(a) : key(a) - key(b)));
    this.list.replaceChildren(...shown.map((episode) => {
      const row = el("tr", { "data-id": episode.episode_id },
        el("td", { text: episode.episode_id }), el("td", { text: episode.task_id }),
        el("td", { class: "num reward", text: show(episode.reward) }), el("td", { text: episode.resolved ? "yes" : "no" }),
        el("td", { class: "num steps", text: episode.steps.length }), el("td", { class: "num", text: number(episode.wall_s, 2) }),
        el("td", { class: "num cpu", text: number(cpuOf(episode), 3) }),
        el("td", { class: "num memory", text: number(memoryOf(episode), 4) }));
      row.classList.toggle("selected", episode === this.selected);
      row.addEventListener("click", () => this.select(episode));
      return row;
    }));
    if (!this.selected && shown.length) this.select(shown[0]);
  }

  select(episode) {
    this.selected = episode;
    for (const row of this.list.children) row.classList.toggle("selected", row.dataset.id === episode.episode_id);
    this.detail.replaceChildren(...episodeTimeline(episode));
  }
}
