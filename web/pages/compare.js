// Compare: find jobs by name or id, overlay one of their curves, and a table of final
// metrics and settings. The chosen jobs and curve live in the address.
import { allMetrics, COLORS, fitToWidth, lineChart } from "../charts.js";
import { api, badge, dataTable, el, number, percent, problemLine, reportError } from "../lib.js";

const METRICS = { loss: "train loss", eval_loss: "eval loss", accuracy: "train accuracy", eval_accuracy: "eval accuracy" };
const HYPERPARAMETERS = ["learning_rate", "batch_size", "optimizer", "steps", "weight_decay", "ema_decay", "seed"];
const SEARCH_LIMIT = 20;
const CHART_HEIGHT = 320;

export async function render(main, params) {
  const chosen = (params.ids || "").split(",").map(Number).filter(Boolean);
  const jobs = await Promise.all(chosen.map((id) => api(`api/jobs/${id}`)));
  // The user models' own metrics (a run's names are fixed: its first point has them all).
  const firsts = await Promise.all(chosen.map((id) => api(`api/jobs/${id}/metrics?split=train&limit=1`)));
  const customNames = [...new Set(firsts.flatMap((page) => Object.keys(page[0]?.custom || {})))].sort();
  const curves = { ...METRICS };
  for (const name of customNames) {
    curves[`custom_${name}`] = `train ${name}`;
    curves[`eval_custom_${name}`] = `eval ${name}`;
  }
  const key = params.metric in curves ? params.metric : "loss";
  const go = (ids, metric = key) => {
    location.hash = `#/compare?ids=${ids.join(",")}&metric=${metric}`;
  };
  const chartBox = el("div", { class: "chart wide", id: "compare-chart" });
  const metric = el(
    "select",
    { id: "metric", onchange: () => go(chosen, metric.value) },
    Object.entries(curves).map(([k, label]) => el("option", { value: k, selected: k === key }, label)),
  );
  main.replaceChildren(
    el("h1", {}, "Compare"),
    picker(jobs, go),
    el("p", {}, el("label", { for: "metric" }, "Curve "), metric),
    chartBox,
    el("div", { class: "scroll" }, dataTable(COLUMNS, jobs, { caption: "Final metrics and settings" }).table),
  );
  if (chosen.length < 2) chartBox.append(el("p", { class: "muted" }, "Pick two or more jobs."));
  if (!chosen.length) return null;

  const split = key.startsWith("eval_") ? "eval" : "train";
  const field = key.replace("eval_", "");
  const pick = field.startsWith("custom_") ? (m) => m.custom?.[field.slice(7)] : (m) => m[field];
  const series = await Promise.all(chosen.map((id) => allMetrics(id, split)));
  const steps = [...new Set(series.flat().map((m) => m.step))].sort((a, b) => a - b);
  const columns = series.map((points) => {
    const byStep = new Map(points.map((m) => [m.step, pick(m)]));
    return steps.map((s) => byStep.get(s) ?? null);
  });
  let plot = null;
  const fit = fitToWidth(chartBox, () => (plot ? [plot] : []), CHART_HEIGHT);
  const lines = jobs.map((job, i) => ({ label: `#${job.id} ${job.name}`, color: COLORS[i % COLORS.length] }));
  plot = lineChart(chartBox, { width: fit.width(), height: CHART_HEIGHT, yLabel: curves[key], lines }, [steps, ...columns]);
  chartBox.dataset.series = String(jobs.length);
  return () => {
    fit.stop();
    plot.destroy();
  };
}

const COLUMNS = [
  { title: "Job", cell: (job) => el("a", { href: `#/jobs/${job.id}` }, `#${job.id} ${job.name}`) },
  { title: "State", cell: (job) => badge(job.state) },
  { title: "Model", cell: (job) => job.spec.model ?? (job.spec.command || []).join(" ") },
  { title: "Dataset", cell: (job) => job.spec.dataset ?? "–" },
  { title: "GPUs", cell: (job) => job.gpu_count },
  { title: "Final eval loss", class: "num", cell: (job) => number(job.latest.eval_loss) },
  { title: "Final eval accuracy", class: "num", cell: (job) => percent(job.latest.eval_accuracy) },
  ...HYPERPARAMETERS.map((k) => ({ title: k, cell: (job) => String(job.spec.hyperparameters?.[k] ?? "–") })),
];

// The chosen jobs (each removable) and a search box that finds more by name or id.
function picker(jobs, go) {
  const ids = jobs.map((j) => j.id);
  const chips = el(
    "ul",
    { class: "chips", "aria-label": "Jobs compared" },
    jobs.map((job) =>
      el(
        "li",
        { dataset: { job: job.id } },
        `#${job.id} ${job.name} `,
        el(
          "button",
          { type: "button", class: "quiet", "aria-label": `Remove job ${job.id}`, onclick: () => go(ids.filter((i) => i !== job.id)) },
          "×",
        ),
      ),
    ),
  );
  const status = el("p", { class: "muted", "aria-live": "polite" });
  const problem = problemLine();
  const results = el("ul", { class: "search-results", id: "compare-results" });
  const search = el("input", { id: "compare-search", type: "search", placeholder: "job name or id", maxlength: 128, autocomplete: "off" });
  const find = async () => {
    const query = new URLSearchParams({ limit: SEARCH_LIMIT });
    if (search.value.trim()) query.set("q", search.value.trim());
    const page = await api(`api/jobs?${query}`);
    const found = page.items.filter((job) => !ids.includes(job.id));
    results.replaceChildren(
      ...found.map((job) =>
        el(
          "li",
          { dataset: { job: job.id } },
          el("button", { type: "button", class: "quiet", onclick: () => go([...ids, job.id]) }, `+ #${job.id} ${job.name}`),
          " ",
          badge(job.state),
        ),
      ),
    );
    status.textContent = found.length ? "" : "No other job matches.";
  };
  const findReporting = () => find().then(() => (problem.textContent = ""), reportError("Searching jobs", problem));
  let pending = null;
  search.addEventListener("input", () => {
    clearTimeout(pending);
    pending = setTimeout(findReporting, 200);
  });
  findReporting();
  return el(
    "section",
    { class: "compare-picker", "aria-label": "Pick jobs" },
    chips,
    el("label", { for: "compare-search" }, "Add a job "),
    search,
    status,
    problem,
    results,
  );
}
