// Compare: pick jobs, overlay their curves, and a table of final metrics and settings.
import uPlot from "/vendor/uplot/uPlot.esm.js";
import { api, badge, el, number, percent } from "/lib.js";

const COLORS = ["#2563eb", "#dc2626", "#059669", "#7c3aed", "#d97706", "#0891b2", "#be185d", "#4b5563"];
const METRICS = { loss: "train loss", eval_loss: "eval loss", accuracy: "train accuracy", eval_accuracy: "eval accuracy" };

export async function render(main, params) {
  const chosen = (params.ids || "").split(",").map(Number).filter(Boolean);
  const recent = (await api("/api/jobs?limit=50")).items;
  const picker = el("fieldset", { class: "compare-picker" }, el("legend", {}, "Jobs"),
    recent.map((job) => {
      const box = el("input", { type: "checkbox", value: job.id, id: `pick-${job.id}`, checked: chosen.includes(job.id) });
      return el("label", { for: box.id, class: "gpu-choice" }, box, ` #${job.id} ${job.name} `, badge(job.state));
    }));
  const metric = el("select", { id: "metric" }, Object.entries(METRICS).map(([k, label]) => el("option", { value: k, selected: k === (params.metric || "loss") }, label)));
  const apply = el("button", { type: "button" }, "Compare");
  apply.addEventListener("click", () => {
    const ids = [...picker.querySelectorAll("input:checked")].map((b) => b.value);
    location.hash = `#/compare?ids=${ids.join(",")}&metric=${metric.value}`;
  });
  const chartBox = el("div", { class: "chart wide", id: "compare-chart" });
  const table = el("div", { class: "scroll" });
  main.replaceChildren(el("h1", {}, "Compare"), picker, el("p", {}, el("label", { for: "metric" }, "Curve "), metric, " ", apply), chartBox, table);
  if (!chosen.length) {
    chartBox.append(el("p", { class: "muted" }, "Pick two or more jobs."));
    return null;
  }
  const jobs = await Promise.all(chosen.map((id) => api(`/api/jobs/${id}`)));
  const metrics = await Promise.all(chosen.map((id) => api(`/api/jobs/${id}/metrics`)));
  const key = params.metric in METRICS ? params.metric : "loss";
  const split = key.startsWith("eval_") ? "eval" : "train";
  const field = key.replace("eval_", "");
  const steps = [...new Set(metrics.flat().filter((m) => m.split === split).map((m) => m.step))].sort((a, b) => a - b);
  const columns = metrics.map((points) => {
    const byStep = new Map(points.filter((m) => m.split === split).map((m) => [m.step, m[field]]));
    return steps.map((s) => (byStep.has(s) ? byStep.get(s) : null));
  });
  const plot = new uPlot({
    width: chartBox.clientWidth || 800,
    height: 320,
    scales: { x: { time: false } },
    axes: [{ label: "step" }, { label: METRICS[key], size: 60 }],
    series: [{ label: "step" }, ...jobs.map((job, i) => ({ label: `#${job.id} ${job.name}`, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true }))],
  }, [steps, ...columns], chartBox);
  chartBox.dataset.series = String(jobs.length);

  const hp = ["learning_rate", "batch_size", "optimizer", "steps", "weight_decay", "ema_decay", "seed"];
  table.append(el("table", {},
    el("thead", {}, el("tr", {}, ["Job", "State", "Model", "Dataset", "GPUs", "Final eval loss", "Final eval accuracy", ...hp].map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, jobs.map((job) => el("tr", {},
      el("td", {}, el("a", { href: `#/jobs/${job.id}` }, `#${job.id} ${job.name}`)),
      el("td", {}, badge(job.state)),
      el("td", {}, job.spec.model),
      el("td", {}, job.spec.dataset),
      el("td", {}, job.gpu_count),
      el("td", { class: "num" }, number(job.latest.eval_loss)),
      el("td", { class: "num" }, percent(job.latest.eval_accuracy)),
      ...hp.map((k) => el("td", {}, String(job.spec.hyperparameters[k] ?? "–"))),
    )))));
  const resize = () => plot.setSize({ width: chartBox.clientWidth || 800, height: 320 });
  window.addEventListener("resize", resize);
  return () => {
    window.removeEventListener("resize", resize);
    plot.destroy();
  };
}
