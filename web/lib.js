// Helpers shared by the pages: API calls, building DOM safely, formatting.

export class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : `HTTP ${status}`);
    this.status = status;
    this.detail = detail;
  }
}

// The session cookie (set by POST /api/session) authenticates every call and stream.
export async function api(path, { method = "GET", body, headers = {}, etag } = {}) {
  const init = { method, headers: { ...headers } };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  if (etag) init.headers["If-None-Match"] = etag;
  let response;
  try {
    response = await fetch(path, init);
  } catch {
    throw new UnreachableError(); // no answer at all: the service stopped, or the network is down
  }
  if ([502, 503, 504].includes(response.status) && !response.headers.get("content-type")?.includes("json")) {
    throw new UnreachableError(); // a proxy in front of towerq says it does not answer
  }
  if (response.status === 304) return { notModified: true };
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (!response.ok) throw new ApiError(response.status, data && data.detail !== undefined ? data.detail : text);
  if (etag !== undefined) return { data, etag: response.headers.get("ETag") };
  return data;
}

// el("a", {href: "#/x", class: "y"}, "text", child, ...): children are text nodes or
// elements, never parsed HTML, so names and logs from users cannot inject markup.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Number.POSITIVE_INFINITY)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function toast(message) {
  const box = document.getElementById("toast");
  box.textContent = message;
  box.classList.add("shown");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => box.classList.remove("shown"), 5000);
}

export const session = { me: null, ready: Promise.resolve() };

export function badge(state) {
  return el("span", { class: `badge state-${state}` }, state);
}

// One formatter each, made once: toLocaleString() builds a new one per call, which costs
// more than drawing the row it is for.
const integers = new Intl.NumberFormat();
const dates = new Intl.DateTimeFormat(undefined, { dateStyle: "short", timeStyle: "medium" });

export function count(value) {
  return integers.format(value);
}

export function number(value, digits = 4) {
  if (value === null || value === undefined) return "–";
  if (Math.abs(value) >= 1000) return integers.format(Math.round(value));
  return Number(value)
    .toPrecision(digits)
    .replace(/\.?0+$/, "");
}

export function percent(value) {
  return value === null || value === undefined ? "–" : `${(100 * value).toFixed(1)}%`;
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

// Seconds from a duration as people write it (null: it is none): 5400, 90m, 1h 30m, 1.5h,
// 1:30:00, Slurm's 2-12:00:00 (days-hours:minutes:seconds); what `duration` writes reads back.
export function parseDuration(text) {
  const t = text.trim().toLowerCase();
  const units = { s: 1, m: 60, h: 3600, d: 86400, w: 604800 };
  if (/^\d+(\.\d+)?$/.test(t)) return Number(t);
  if (/^(\d+(\.\d+)?\s*[smhdw]\s*)+$/.test(t)) {
    return [...t.matchAll(/([\d.]+)\s*([smhdw])/g)].reduce((sum, [, n, unit]) => sum + Number(n) * units[unit], 0);
  }
  const clock = t.match(/^(?:(\d+)-)?(\d+):([0-5]\d):([0-5]\d)$/);
  if (!clock) return null;
  const [days, hours, minutes, seconds] = clock.slice(1).map((part) => Number(part ?? 0));
  return ((days * 24 + hours) * 60 + minutes) * 60 + seconds;
}

// A duration field's whole seconds; an Error for its `field` (said after `label`) when it says none.
export function durationOf(text, field, label = "") {
  const seconds = parseDuration(text);
  if (seconds === null || Math.round(seconds) < 1) {
    const said = `${label}${JSON.stringify(text.trim())} is no duration: give 5400 (seconds), 90m, 1h 30m or 1:30:00`;
    throw Object.assign(new Error(said), { field });
  }
  return Math.round(seconds);
}

export function age(iso) {
  return iso ? duration((Date.now() - Date.parse(iso)) / 1000) : "–";
}

export function when(iso) {
  return iso ? dates.format(new Date(iso)) : "–";
}

export function gpusOf(job) {
  const a = job.allocation;
  // A job over several hosts: every host's GPUs, by rank.
  if (a?.ranks?.length > 1) return a.ranks.map((r) => `${r.host}:${r.gpus.join(",")}`).join(" + ");
  // An elastic job: how many of its GPUs it holds now, or the sizes it may start at.
  const elastic = job.min_gpu_count != null;
  if (a) {
    const size = elastic ? ` (${a.gpus.length} of ${job.gpu_count}, elastic)` : "";
    return `${a.host}:${a.gpus.join(",")}${a.fraction < 1 ? ` ×${a.fraction}` : ""}${size}`;
  }
  if (elastic) return `${job.min_gpu_count} to ${job.gpu_count} GPUs (elastic)`;
  const asked = job.spec.gpus ? `GPUs ${job.spec.gpus.join(",")}` : `${job.gpu_count} GPU${job.gpu_count > 1 ? "s" : ""}`;
  return job.spec.host ? `${job.spec.host}: ${asked}` : asked;
}

// Seconds left: to the end the API expects at the job's wall-clock pace (its evaluations and
// checkpoints included), not the training-only time per step, which was 3-4x too soon.
export function eta(job) {
  if (job.state !== "running" || !job.expected_end_at) return null;
  return Math.max(0, (Date.parse(job.expected_end_at) - Date.now()) / 1000);
}

// Examples a second over wall time: a step's examples (the trainer's rate while training
// times its step time) over the job's pace, evaluations and checkpoints included.
export function wallRate(job) {
  const { examples_per_sec: rate, step_time_s: stepTime } = job.latest || {};
  if (job.state !== "running" || !job.pace_s || !rate || !stepTime) return null;
  return (rate * stepTime) / job.pace_s;
}

export function speed(job) {
  const rate = job.latest?.examples_per_sec;
  if (!rate) return null;
  const wall = wallRate(job);
  return wall === null ? `${number(rate, 5)} while training` : `${number(wall, 5)} (${number(rate, 5)} while training)`;
}

export function progress(job) {
  if (job.step == null && !job.total_steps) {
    // Nothing reported: a notebook, or a program that does not call towerq.report (as towerq jobs says it).
    return el("span", { class: "muted", title: "no steps reported (a program reports them with towerq.report)" }, "–");
  }
  const done = job.step || 0;
  if (!job.total_steps) {
    // A command job's or a notebook's total is its program's: the steps so far, no bar.
    return el(
      "div",
      { class: "progress", title: `${done} steps (its program decides how many)` },
      el("span", { class: "steps" }, `${integers.format(done)} steps`),
    );
  }
  const fraction = Math.min(1, done / job.total_steps);
  const left = eta(job);
  return el(
    "div",
    { class: "progress", title: `${done} of ${job.total_steps} steps` },
    el(
      "div",
      { class: "bar", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": job.total_steps, "aria-valuenow": done },
      el("span", { style: `width:${(100 * fraction).toFixed(1)}%` }),
    ),
    el(
      "span",
      { class: "steps" },
      `${integers.format(done)}/${integers.format(job.total_steps)}`,
      left !== null ? ` · ETA ${duration(left)}` : "",
    ),
  );
}

// A stream of server-sent events that the caller can close; named events are dispatched to
// `handlers[type]`, and `handlers.open()` is called each time it (re)connects: what changed
// before then was not streamed. It reconnects by itself (EventSource does).
export function stream(path, handlers) {
  const source = new EventSource(path);
  for (const [type, handler] of Object.entries(handlers)) {
    if (type === "open") source.addEventListener("open", () => handler());
    else source.addEventListener(type, (event) => handler(JSON.parse(event.data)));
  }
  return () => source.close();
}

// What went wrong, shown to the person: in `problem` (an element that shows it until the
// next success empties it) when given, else as a toast. Nothing fails silently.
// towerq did not answer: what the page shows may be out of date (a job "running" may have
// stopped with the service), so say so rather than what failed to load.
export class UnreachableError extends Error {
  constructor() {
    super("towerq does not answer (the service stopped, or the network is down): what you see may be out of date; retrying");
    this.name = "UnreachableError";
  }
}

export function reportError(what, problem) {
  return (error) => {
    const message = error instanceof UnreachableError ? error.message : `${what} failed: ${error.message || error}`;
    if (problem) problem.textContent = message;
    else toast(message);
    console.warn(message);
  };
}

// A danger button's click: asks `question` (a function: it may read the page as it is now),
// then does as `actThen` does.
export function confirmThen(question, act, failed, after = () => {}) {
  const click = actThen(act, failed, after);
  return async () => {
    if (confirm(question())) await click();
  };
}

// A button's click: runs `act`, which says what it did (toasted, where it says something),
// then `after` (the page redrawn); a refusal is toasted after `failed`, in the API's words.
export function actThen(act, failed, after = () => {}) {
  return async () => {
    let said;
    try {
      said = await act();
    } catch (error) {
      toast(`${failed} failed: ${problemText(error)}`);
      return;
    }
    if (said) toast(said);
    await after();
  };
}

// What the API said was wrong, in words: each field's own message (they name the field).
export function problemText(error) {
  return Array.isArray(error.detail) ? error.detail.map((d) => d.msg).join("; ") : error.message;
}

// A form field: its label (for the input's id), the input, and a hint under it.
export function formField(label, input, help = "") {
  return el("div", { class: "field" }, el("label", { for: input.id }, label), input, help ? el("small", { class: "muted" }, help) : null);
}

// An element for `reportError` and `poll` to show a failure in.
export function problemLine() {
  return el("p", { class: "error problem", role: "alert" });
}

// Call `refresh` every `ms`; a failure is shown in `problem` and cleared by the next success.
// Returns { now, stop }: `now()` refreshes at once (same reporting), `stop()` ends it.
export function poll(refresh, ms, problem, what = "Refreshing") {
  const failed = reportError(what, problem);
  const run = async () => {
    try {
      await refresh();
      problem.textContent = "";
    } catch (error) {
      failed(error);
    }
  };
  const timer = setInterval(run, ms);
  return { now: run, stop: () => clearInterval(timer) };
}

// A table from a `columns` definition: [{ title, cell: (row) => node|text, class? }].
// `attrs(row)` gives each <tr> its attributes; `empty` is shown when there are no rows.
export function dataTable(columns, rows, { caption, tableClass, attrs = () => ({}), empty = "None." } = {}) {
  const body = el("tbody");
  const table = el(
    "table",
    { class: tableClass },
    caption ? el("caption", { class: "visually-hidden" }, caption) : null,
    el(
      "thead",
      {},
      el(
        "tr",
        {},
        columns.map((c) => el("th", { scope: "col", class: c.class }, c.title)), // a number's heading stands over it
      ),
    ),
    body,
  );
  const fill = (items) => {
    body.replaceChildren(
      ...items.map((row) =>
        el(
          "tr",
          attrs(row),
          columns.map((c) => el("td", { class: c.class }, c.cell(row))),
        ),
      ),
    );
    if (!items.length) body.replaceChildren(el("tr", {}, el("td", { colspan: columns.length, class: "muted" }, empty)));
  };
  fill(rows);
  return { table, fill };
}

// "~14:05 on lab-a (in 12 min)": a queued job's start as the scheduler's replay expects it.
export function expectedStart(job) {
  const at = new Date(job.expected_start_at);
  const seconds = Math.max(0, (at.getTime() - Date.now()) / 1000);
  const where = job.expected_host ? ` on ${job.expected_host}` : "";
  return `~${clockOf(at)}${where} (in ${duration(seconds)})`;
}

// A moment's hour and minute, with its day when it is not today: "08:11 PM", "Dec 6 08:11 AM".
export function clockOf(at) {
  const sameDay = at.toDateString() === new Date().toDateString();
  const clock = at.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  return sameDay ? clock : `${at.toLocaleDateString([], { month: "short", day: "numeric" })} ${clock}`;
}

// A moment as a datetime-local input holds it, to the minute in the browser's zone:
// "2026-12-06T22:00". `new Date(value)` reads it back.
export function localMoment(at) {
  const minute = new Date(at.getTime());
  minute.setSeconds(0, 0);
  return new Date(minute.getTime() - minute.getTimezoneOffset() * 60000).toISOString().slice(0, 16);
}

// A field of an `actionForm`: its label, its input (named: the form gives it its id), a hint.
export const formInput = (label, input, help = "") => ({ label, input, help });

// A form whose submit calls `send(FormData)`, says in a toast what it returned (words), and
// refreshes the page; what the API refused is said beside the form, in its words.
export function actionForm(title, id, fields, submitLabel, send, refresh) {
  const said = el("p", { class: "error", role: "alert" });
  const form = el(
    "form",
    { class: "admin-form", id, novalidate: true },
    el("h3", {}, title),
    // Ids by form: two forms have a field of the same name.
    ...fields.map(({ label, input, help }) => formField(label, Object.assign(input, { id: `${id}-${input.name}` }), help)),
    el("button", { type: "submit" }, submitLabel),
    said,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    said.textContent = "";
    try {
      const done = await send(new FormData(form));
      toast(done);
      form.reset();
      await refresh();
    } catch (error) {
      said.textContent = problemText(error);
    }
  });
  return form;
}
