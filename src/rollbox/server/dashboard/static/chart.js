// A small SVG line chart: a few series over a shared x axis, redrawn in place (one <svg> per chart, its
// children replaced), so a page that redraws every two seconds keeps a constant number of nodes.

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 560;
const HEIGHT = 180;
const PAD = { left: 48, right: 12, top: 10, bottom: 22 };

function svg(tag, attributes, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

export class LineChart {
  // `series`: [{name, color}]; points given to draw() carry x and one y per series name.
  constructor(container, series, { xLabel = (x) => String(x), yLabel = (y) => String(y) } = {}) {
    this.series = series;
    this.xLabel = xLabel;
    this.yLabel = yLabel;
    this.root = svg("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, class: "line-chart", role: "img" });
    container.replaceChildren(this.root);
  }

  draw(points, xRange) {
    const xs = points.map((p) => p.x);
    const [x0, x1] = xRange || [Math.min(...xs), Math.max(...xs)];
    const top = niceMax(Math.max(0, ...points.flatMap((p) => this.series.map((s) => p[s.name] ?? 0))));
    const w = WIDTH - PAD.left - PAD.right;
    const h = HEIGHT - PAD.top - PAD.bottom;
    const sx = (x) => PAD.left + (x1 > x0 ? ((x - x0) / (x1 - x0)) * w : w / 2);
    const sy = (y) => PAD.top + h - (y / top) * h;
    const parts = [];
    for (const fraction of [0, 0.5, 1]) {
      const y = sy(top * fraction);
      parts.push(svg("line", { x1: PAD.left, x2: WIDTH - PAD.right, y1: y, y2: y, class: "grid" }));
      parts.push(svg("text", { x: PAD.left - 4, y: y + 4, "text-anchor": "end", class: "tick" }, this.yLabel(top * fraction)));
    }
    if (points.length) {
      parts.push(svg("text", { x: PAD.left, y: HEIGHT - 6, class: "tick" }, this.xLabel(x0)));
      parts.push(svg("text", { x: WIDTH - PAD.right, y: HEIGHT - 6, "text-anchor": "end", class: "tick" }, this.xLabel(x1)));
    } else {
      parts.push(svg("text", { x: WIDTH / 2, y: HEIGHT / 2, "text-anchor": "middle", class: "tick" }, "no calls yet"));
    }
    this.series.forEach((s, index) => {
      const line = points.filter((p) => p[s.name] !== undefined && p[s.name] !== null)
        .map((p) => `${sx(p.x).toFixed(1)},${sy(p[s.name]).toFixed(1)}`).join(" ");
      if (line) {
        parts.push(svg("polyline", { points: line, fill: "none", stroke: s.color, "stroke-width": 1.5, "data-series": s.name }));
        const last = points.filter((p) => p[s.name] !== undefined && p[s.name] !== null).at(-1);
        parts.push(svg("circle", { cx: sx(last.x), cy: sy(last[s.name]), r: 2.5, fill: s.color })); // the latest figure
      }
      parts.push(svg("text", { x: PAD.left + 8 + index * 90, y: PAD.top + 10, fill: s.color, class: "legend" }, s.name));
    });
    this.root.replaceChildren(...parts);
  }
}
