// Builds elements from text only: nothing shown is ever parsed as HTML, so a label or a command holding
// markup shows as the characters it is.

export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("data-")) node.dataset[name.slice(5).replace(/-(\w)/g, (_, c) => c.toUpperCase())] = value;
    else if (name === "title" || name === "colspan" || name === "type") node.setAttribute(name, value);
    else throw new Error(`el: unsupported attribute ${name}`);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

export function setText(node, text) {
  const value = String(text);
  if (node.textContent !== value) node.textContent = value;
}

export function byId(id) {
  return document.getElementById(id);
}

export function bytes(value) {
  if (value === null || value === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let size = value;
  let unit = 0;
  while (size >= 1024 && unit < units.length - 1) { size /= 1024; unit += 1; }
  return `${size.toFixed(unit ? 1 : 0)} ${units[unit]}`;
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  if (seconds < 60) return `${Math.floor(seconds)}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${Math.floor(seconds % 60)}s`;
  return `${Math.floor(seconds / 3600)}h ${Math.floor((seconds % 3600) / 60)}m`;
}

export function number(value, digits = 2) {
  return typeof value === "number" && Number.isFinite(value) ? value.toFixed(digits) : "–";
}

// Replaces a table body's rows with `rows` (existing row elements are moved, not rebuilt).
export function showRows(tbody, rows) {
  const current = tbody.children;
  let same = current.length === rows.length;
  for (let i = 0; same && i < rows.length; i += 1) same = current[i] === rows[i];
  if (!same) tbody.replaceChildren(...rows);
}
