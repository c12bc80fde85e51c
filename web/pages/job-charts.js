// A job's Training section: its metric series (train and eval rows merged by step), and the
// charts drawn from them (loss, accuracy, learning rate, speed, the model's own metrics),
// with zoom, a log-scale loss, and words instead of empty frames while there is no point.
import { fitToWidth, lineChart } from "../charts.js";
import { el, reportError } from "../lib.js";

const CHART_HEIGHT = 220;

export class Series {
  constructor() {
    this.byStep = new Map();
    this.steps = [];
    this.customNames = new Set(); // the user model's own metrics seen so far
  }

  add(points) {
    for (const p of points) {
      const row = this.byStep.get(p.step) || {};
      const prefix = p.split === "eval" ? "eval_" : "";
      row[`${prefix}loss`] = p.loss;
      row[`${prefix}accuracy`] = p.accuracy;
      for (const [name, value] of Object.entries(p.custom || {})) {
        this.customNames.add(name);
        row[`${prefix}custom_${name}`] = value;
      }
      if (p.split !== "eval") {
        row.learning_rate = p.learning_rate;
        row.examples_per_sec = p.examples_per_sec;
      }
      this.byStep.set(p.step, row);
    }
    this.steps = [...this.byStep.keys()].sort((x, y) => x - y);
  }

  column(key) {
    return this.steps.map((s) => {
      const v = this.byStep.get(s)[key];
      return v === undefined ? null : v;
    });
  }

  get trainPoints() {
    return this.steps.filter((s) => this.byStep.get(s).loss !== undefined).length;
  }
}

const CHARTS = [
  {
    id: "loss",
    title: "Loss",
    keys: [
      ["loss", "train", "#2563eb"],
      ["eval_loss", "eval", "#dc2626"],
    ],
    log: true,
  },
  {
    id: "accuracy",
    title: "Accuracy",
    keys: [
      ["accuracy", "train", "#2563eb"],
      ["eval_accuracy", "eval", "#dc2626"],
    ],
  },
  { id: "lr", title: "Learning rate", keys: [["learning_rate", "lr", "#7c3aed"]], precise: true },
  { id: "speed", title: "Examples/s", keys: [["examples_per_sec", "examples/s", "#059669"]] },
];

// What the Training section says while a job has no metric to chart.
function noMetricsText(job) {
  if (job.state === "failed") return "No metrics: the job failed before it logged a step. Its log below says why.";
  if (job.state === "cancelled") return "No metrics: the job was cancelled before it logged a step.";
  if (job.state === "succeeded") return "No metrics were logged.";
  const every = job.spec.hyperparameters?.log_every;
  return `The charts start with the first logged step${every ? ` (every ${every} steps)` : ""}.`;
}

export class Charts {
  constructor(series, onZoom, job) {
    this.series = series;
    this.onZoom = onZoom;
    this.job = job;
    this.empty = el("p", { class: "muted", id: "no-metrics", hidden: true });
    this.zoomed = new Set(); // charts showing a range the user chose: new data keeps it
    this.logScale = false;
    this.plots = {};
    this.box = el("div", { class: "charts", id: "charts" });
    this.fit = fitToWidth(this.box, () => Object.values(this.plots), CHART_HEIGHT, true);
  }

  controls() {
    const toggle = el("input", { type: "checkbox", id: "log-scale" });
    toggle.addEventListener("change", () => {
      this.logScale = toggle.checked;
      this.plots.loss?.destroy();
      delete this.plots.loss;
      this.draw();
    });
    return el(
      "p",
      { class: "chart-controls" },
      el("label", {}, toggle, " log-scale loss"),
      el("span", { class: "muted" }, " · drag across a chart to zoom, double-click to reset"),
    );
  }

  draw() {
    const steps = this.series.steps;
    this.box.dataset.points = String(this.series.trainPoints);
    this.empty.hidden = steps.length > 0;
    if (!steps.length) {
      this.empty.textContent = noMetricsText(this.job());
      return; // no frames without a point to put in them
    }
    const custom = [...this.series.customNames].sort().map((name) => ({
      id: `custom-${name}`,
      title: `${name} (from the model's metrics())`,
      keys: [
        [`custom_${name}`, "train", "#2563eb"],
        [`eval_custom_${name}`, "eval", "#dc2626"],
      ],
    }));
    for (const chart of [...CHARTS, ...custom]) {
      const data = [steps, ...chart.keys.map(([key]) => this.series.column(key))];
      if (!this.plots[chart.id]) {
        const holder = el("figure", { class: "chart", id: `chart-${chart.id}` }, el("figcaption", {}, chart.title));
        const existing = this.box.querySelector(`#chart-${chart.id}`);
        if (existing) existing.replaceWith(holder);
        else this.box.append(holder);
        const lines = chart.keys.map(([, label, color]) => ({ label, color, points: label === "eval" }));
        const look = {
          width: this.fit.width(),
          height: CHART_HEIGHT,
          lines,
          log: chart.log && this.logScale,
          precise: chart.precise,
          onZoom: (range) => {
            this.zoomed.add(chart.id);
            this.onZoom(range).catch(reportError("Loading the zoomed range"));
          },
          onReset: () => this.zoomed.delete(chart.id),
          marks: () => this.marks(),
        };
        this.plots[chart.id] = lineChart(holder, look, data);
      } else {
        this.plots[chart.id].setData(data, !this.zoomed.has(chart.id));
      }
    }
    this.box.dataset.marks = JSON.stringify(this.marks());
    window.__towerqChartDrawnAt = Date.now();
  }

  // Where each attempt after the first started (a resize, a preemption, a crash), and on how many GPUs.
  marks() {
    const held = this.job().held || [];
    const marks = [];
    for (let i = 1; i < held.length; i++) {
      const [was, now] = [held[i - 1], held[i]];
      if (now.from_step <= 0) continue;
      marks.push({ step: now.from_step, label: was.gpus !== now.gpus ? `${was.gpus}→${now.gpus} GPUs` : `attempt ${now.attempt}` });
    }
    return marks;
  }

  destroy() {
    this.fit.stop();
    for (const plot of Object.values(this.plots)) plot.destroy();
    this.plots = {};
  }
}
