// GPUs: one card per host, one row per GPU, who holds it; refreshed every 2 s.
import { api, dataTable, duration, el, poll, problemLine, reportError, session } from "../lib.js";

const POLL_MS = 2000;

export async function render(main) {
  await session.ready;
  const cards = el("div", { class: "hosts" });
  const problem = problemLine();
  main.replaceChildren(el("h1", {}, "GPUs"), problem, cards);
  let stopped = false;

  async function refresh() {
    const [gpus, workers] = await Promise.all([api("api/gpus"), api("api/workers")]);
    if (stopped) return;
    if (!workers.length) {
      cards.replaceChildren(el("p", { class: "muted" }, "No worker has registered yet: start `towerq worker` on a GPU host."));
      return;
    }
    const actions = { refresh: poller.now, problem };
    cards.replaceChildren(
      ...workers.map((w) =>
        card(
          w,
          gpus.filter((g) => g.host === w.name),
          actions,
        ),
      ),
    );
  }
  const poller = poll(refresh, POLL_MS, problem, "Refreshing the GPUs");
  await refresh();
  return () => {
    stopped = true;
    poller.stop();
  };
}

function card(worker, gpus, actions) {
  const down = worker.state !== "up";
  const columns = [
    { title: "GPU", cell: (gpu) => [gpu.index, " ", badgesOf(gpu, down, worker.simulated)] },
    { title: "Model", cell: (gpu) => gpu.name },
    { title: "Memory", cell: memoryOf },
    { title: "Utilization", class: "num", cell: (gpu) => (gpu.utilization_pct === null ? "–" : `${gpu.utilization_pct}%`) },
    { title: "Held by", class: "holders", cell: holdersOf },
    { title: "", cell: (gpu) => drainButton(gpu, actions) },
  ];
  const jobs = `${worker.running_jobs} job${worker.running_jobs === 1 ? "" : "s"}`;
  return el(
    "section",
    { class: `card host${down ? " down" : ""}`, "aria-label": `host ${worker.name}`, dataset: { host: worker.name } },
    el(
      "h2",
      {},
      worker.name,
      " ",
      el("span", { class: `badge host-${worker.state}` }, worker.state),
      worker.simulated ? el("span", { class: "badge sim", title: "no NVIDIA driver: GPUs are logical CPU devices" }, "simulated") : null,
      worker.sandboxed === false
        ? el(
            "span",
            { class: "badge unsandboxed", title: "TOWERQ_SANDBOX=none: members' code runs with the worker's files, processes and network" },
            "no sandbox",
          )
        : null,
      worker.no_notebooks
        ? el("span", { class: "badge no-notebooks", title: `runs no notebook sessions: ${worker.no_notebooks}` }, "no notebooks")
        : null,
      worker.job_disk === "measure"
        ? el(
            "span",
            {
              class: "badge measured",
              title:
                "TOWERQ_JOB_DISK: job folders are measured while jobs run, not disk images of their limit: a job may write about a second past it, and its sandbox sees the folder's host path",
            },
            "folders measured",
          )
        : null,
    ),
    el("p", { class: "muted" }, `${worker.gpus} GPUs · ${jobs} · heartbeat ${duration(worker.heartbeat_age_s)} ago`),
    el(
      "div",
      { class: "scroll" },
      dataTable(columns, gpus, { tableClass: "gpus", attrs: (gpu) => ({ dataset: { gpu: gpu.index, free: gpu.free_fraction } }) }).table,
    ),
  );
}

// A simulated GPU on a simulated host says so once, on the host's card.
function badgesOf(gpu, hostDown, hostSimulated) {
  return [
    gpu.drained ? el("span", { class: "badge drained" }, "drained") : null,
    hostDown ? el("span", { class: "badge host-down" }, "down") : null,
    gpu.simulated && !hostSimulated ? el("span", { class: "badge sim" }, "simulated") : null,
  ];
}

function memoryOf(gpu) {
  const used = gpu.memory_total_mb ? gpu.memory_used_mb / gpu.memory_total_mb : 0;
  return [
    el(
      "div",
      { class: "membar", title: `${gpu.memory_used_mb} of ${gpu.memory_total_mb} MB` },
      el("span", { style: `width:${(100 * used).toFixed(1)}%` }),
    ),
    el("span", { class: "muted" }, `${(gpu.memory_used_mb / 1024).toFixed(1)} / ${(gpu.memory_total_mb / 1024).toFixed(1)} GiB`),
  ];
}

function holdersOf(gpu) {
  const kept = gpu.reserved ? reservationOf(gpu.reserved) : "";
  if (!gpu.holders.length) return kept || el("span", { class: "muted" }, "free");
  const held = gpu.holders.map((h) =>
    el(
      "div",
      {},
      el("a", { href: `#/jobs/${h.job_id}` }, `job ${h.job_id}`),
      ` ${h.user}`,
      h.fraction < 1 ? ` ×${h.fraction}` : "",
      el("span", { class: "muted" }, ` ${h.job_name}`),
    ),
  );
  return kept ? [...held, kept] : held;
}

// A GPU kept for a group is not free to everyone: in its window only the group's jobs take
// it, before it only jobs sure to end in time.
function reservationOf(r) {
  const clock = (at) => new Date(at).toLocaleString([], { weekday: "short", hour: "2-digit", minute: "2-digit" });
  const window = r.now ? `until ${clock(r.end_at)}` : `from ${clock(r.start_at)} to ${clock(r.end_at)}`;
  return el("div", { class: "reserved", dataset: { reservation: r.id } }, `reserved for ${r.group} ${window}`);
}

function drainButton(gpu, { refresh, problem }) {
  if (!session.me?.is_admin) return "";
  const verb = gpu.drained ? "undrain" : "drain";
  const act = () =>
    api(`api/gpus/${encodeURIComponent(gpu.host)}/${gpu.index}/${verb}`, { method: "POST" }).then(refresh, reportError(verb, problem));
  return el("button", { type: "button", class: "quiet", onclick: act }, gpu.drained ? "Undrain" : "Drain");
}
