// Form fields built from a JSON schema (the API's catalog), and reading them back.
import { el } from "../lib.js";

export function inputFor(schema) {
  const types = schema.anyOf ? schema.anyOf.map((s) => s.type) : [schema.type];
  const base = schema.anyOf ? schema.anyOf.find((s) => s.type !== "null") : schema;
  if (schema.enum || base.enum) {
    return el(
      "select",
      {},
      (schema.enum || base.enum).map((v) => el("option", { value: v, selected: v === schema.default }, v)),
    );
  }
  if (types.includes("boolean")) return el("input", { type: "checkbox", checked: schema.default === true });
  const input = el("input", { type: "number", step: types.includes("integer") ? 1 : "any" });
  if (base.minimum !== undefined) input.setAttribute("min", base.minimum);
  if (base.maximum !== undefined) input.setAttribute("max", base.maximum);
  if (schema.default !== null && schema.default !== undefined) input.value = schema.default;
  else input.placeholder = "auto";
  return input;
}

export function readValue(input) {
  if (input.type === "checkbox") return input.checked;
  if (input.tagName === "SELECT") return input.value;
  if (input.value === "") return undefined;
  return Number(input.value);
}

export function setValue(input, value) {
  if (input.type === "checkbox") input.checked = Boolean(value);
  else input.value = value ?? "";
}

export function jsonText(value) {
  return Object.keys(value).length ? JSON.stringify(value) : "";
}

export function parseJson(text, fieldName) {
  if (!text.trim()) return {};
  try {
    return JSON.parse(text);
  } catch {
    throw Object.assign(new Error("not valid JSON"), { field: fieldName });
  }
}

// A command line's words, as a shell splits them: spaces part words, quotes ('…' as
// written, "…" with \" and \\) and a backslash keep them together.
export function splitCommand(text) {
  const words = [];
  let word = null;
  let quote = null;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quote === "'") {
      if (c === "'") quote = null;
      else word += c;
    } else if (quote === '"') {
      if (c === '"') quote = null;
      else if (c === "\\" && (text[i + 1] === '"' || text[i + 1] === "\\")) word += text[++i];
      else word += c;
    } else if (c === "'" || c === '"') {
      quote = c;
      word = word ?? "";
    } else if (c === "\\" && i + 1 < text.length) {
      word = (word ?? "") + text[++i];
    } else if (/\s/.test(c)) {
      if (word !== null) words.push(word);
      word = null;
    } else {
      word = (word ?? "") + c;
    }
  }
  if (quote) throw Object.assign(new Error(`a ${quote} quote is not closed`), { field: "command" });
  if (word !== null) words.push(word);
  if (!words.length) throw Object.assign(new Error("give the command to run, e.g. python train.py"), { field: "command" });
  return words;
}

// A word as a shell would need it written (a clone's command shown as it was split).
export function shellWord(word) {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replaceAll("'", "'\\''")}'`;
}
