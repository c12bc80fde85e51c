// Charts and the metric series behind them, shared by the job and compare pages.

import { api } from "./lib.js";
import uPlot from "./vendor/uplot/uPlot.esm.js";

export const COLORS = ["#2563eb", "#dc2626", "#059669", "#7c3aed", "#d97706", "#0891b2", "#be185d", "#4b5563"];
const METRICS_PAGE = 20000; // the most points the API gives per call

// A job's whole series of one split, a page at a time.
export async function allMetrics(id, split) {
  const points = [];
  for (let after = -1; ; ) {
    const page = await api(`api/jobs/${id}/metrics?split=${split}&after_step=${after}&limit=${METRICS_PAGE}`);
    points.push(...page);
    if (page.length < METRICS_PAGE) return points;
    after = page[page.length - 1].step;
  }
}

// A line chart over steps: `lines` = [{ label, color, points? }]; `data` = [steps, ...columns].
export function lineChart(holder, { width, height, yLabel, lines, log = false, precise = false }, data) {
  const options = {
    width,
    height,
    scales: { x: { time: false }, y: log ? { distr: 3 } : {} },
    axes: [{ label: "step" }, { label: yLabel, size: 72, values: precise ? (_u, ticks) => ticks.map((v) => v.toPrecision(3)) : undefined }],
    series: [
      { label: "step" },
      ...lines.map((l) => ({ label: l.label, stroke: l.color, width: 1.5, spanGaps: true, points: { show: !!l.points } })),
    ],
    cursor: { drag: { x: true, y: false } },
    legend: { live: true },
  };
  return new uPlot(options, data, holder);
}

// Keep `plots()` as wide as `box` (one column, or two on a wide screen when `halves`).
export function fitToWidth(box, plots, height, halves = false) {
  const width = () => {
    const full = box.clientWidth || 800;
    return halves && full > 900 ? Math.floor((full - 24) / 2) : full;
  };
  const resize = () => {
    for (const plot of plots()) plot.setSize({ width: width(), height });
  };
  window.addEventListener("resize", resize);
  return { width, stop: () => window.removeEventListener("resize", resize) };
}
