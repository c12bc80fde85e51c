// GPUs: one card per host, one row per GPU, who holds it; refreshed every 2 s.
import { api, duration, el, session, toast } from "/lib.js";

const POLL_MS = 2000;

export async function render(main) {
  await session.ready;
  const cards = el("div", { class: "hosts" });
  main.replaceChildren(el("h1", {}, "GPUs"), cards);
  let stopped = false;

  async function refresh() {
    const [gpus, workers] = await Promise.all([api("/api/gpus"), api("/api/workers")]);
    if (stopped) return;
    if (!workers.length) {
      cards.replaceChildren(el("p", { class: "muted" }, "No worker has registered yet: start `towerq worker` on a GPU host."));
      return;
    }
    cards.replaceChildren(...workers.map((w) => card(w, gpus.filter((g) => g.host === w.name), refresh)));
  }
  await refresh();
  const timer = setInterval(() => refresh().catch(() => {}), POLL_MS);
  return () => {
    stopped = true;
    clearInterval(timer);
  };
}

function card(worker, gpus, refresh) {
  const down = worker.state !== "up";
  return el("section", { class: `card host${down ? " down" : ""}`, "aria-label": `host ${worker.name}`, dataset: { host: worker.name } },
    el("h2", {}, worker.name, " ",
      el("span", { class: `badge host-${worker.state}` }, worker.state),
      worker.simulated ? el("span", { class: "badge sim", title: "no NVIDIA driver: GPUs are logical CPU devices" }, "simulated") : null),
    el("p", { class: "muted" }, `${worker.gpus} GPUs · ${worker.running_jobs} job${worker.running_jobs === 1 ? "" : "s"} · heartbeat ${duration(worker.heartbeat_age_s)} ago`),
    el("div", { class: "scroll" }, el("table", { class: "gpus" },
      el("thead", {}, el("tr", {}, ["GPU", "Model", "Memory", "Utilization", "Held by", ""].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, gpus.map((g) => gpuRow(g, down, refresh))))),
  );
}

function gpuRow(gpu, hostDown, refresh) {
  const used = gpu.memory_total_mb ? gpu.memory_used_mb / gpu.memory_total_mb : 0;
  const badges = [
    gpu.drained ? el("span", { class: "badge drained" }, "drained") : null,
    hostDown ? el("span", { class: "badge host-down" }, "down") : null,
    gpu.simulated ? el("span", { class: "badge sim" }, "simulated") : null,
  ];
  const holders = gpu.holders.length
    ? gpu.holders.map((h) => el("div", {}, el("a", { href: `#/jobs/${h.job_id}` }, `job ${h.job_id}`), ` ${h.user}`, h.fraction < 1 ? ` ×${h.fraction}` : "", el("span", { class: "muted" }, ` ${h.job_name}`)))
    : el("span", { class: "muted" }, "free");
  const admin = session.me && session.me.is_admin;
  const action = admin
    ? el("button", {
      type: "button", class: "quiet",
      onclick: async () => {
        const verb = gpu.drained ? "undrain" : "drain";
        try {
          await api(`/api/gpus/${encodeURIComponent(gpu.host)}/${gpu.index}/${verb}`, { method: "POST" });
          refresh();
        } catch (error) {
          toast(`${verb} failed: ${error.message}`);
        }
      },
    }, gpu.drained ? "Undrain" : "Drain")
    : "";
  return el("tr", { dataset: { gpu: gpu.index, free: gpu.free_fraction } },
    el("td", {}, gpu.index, " ", badges),
    el("td", {}, gpu.name),
    el("td", {}, el("div", { class: "membar", title: `${gpu.memory_used_mb} of ${gpu.memory_total_mb} MB` },
      el("span", { style: `width:${(100 * used).toFixed(1)}%` })),
      el("span", { class: "muted" }, `${(gpu.memory_used_mb / 1024).toFixed(1)} / ${(gpu.memory_total_mb / 1024).toFixed(1)} GiB`)),
    el("td", { class: "num" }, gpu.utilization_pct === null ? "–" : `${gpu.utilization_pct}%`),
    el("td", { class: "holders" }, holders),
    el("td", {}, action),
  );
}
