// Submit: a form built from what the API offers (/api/catalog), with a GPU picker; the
// API's validation errors appear next to the field they name. `?clone=ID` fills it in.
// The form is three sections (what, hyperparameters, where and when); each builds its
// fields, fills them from a spec, and reads them back into one.
import { ApiError, api, duration, durationOf, el, expectedStart, localMoment, toast } from "../lib.js";
import { inputFor, jsonText, parseJson, readValue, setValue, shellWord, splitCommand } from "./form-fields.js";

const HIDDEN_HYPERPARAMETERS = new Set(["model_options"]);

export async function render(main, params) {
  const [catalog, gpus] = await Promise.all([api("api/catalog"), api("api/gpus")]);
  const source = params.clone ? (await api(`api/jobs/${Number(params.clone)}`)).spec : null;
  const form = el("form", { class: "submit", novalidate: true });
  const errors = new FieldErrors(form);
  const hyper = hyperSection(catalog, errors);
  const where = whereSection(catalog, gpus, errors);
  // What runs decides which fields apply: a program or a session has no hyperparameters or towers.
  const what = whatSection(catalog, errors, (kind) => {
    hyper.node.hidden = kind !== "model";
    where.forModel(kind === "model");
  });
  const sections = [what, hyper, where];
  form.append(
    el("h1", {}, source ? `Submit (clone of job ${params.clone})` : "Submit a job"),
    errors.formError,
    ...sections.map((s) => s.node),
    el(
      "p",
      { class: "actions" },
      el("button", { type: "submit", id: "submit" }, "Submit"),
      " ",
      el("button", { type: "button", id: "estimate", class: "quiet" }, "When would it start?"),
    ),
    el("p", { id: "estimate-answer", "aria-live": "polite" }),
  );
  main.replaceChildren(form);
  for (const section of sections) section.start?.();
  if (source) for (const section of sections) section.fill(source);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    send(form, sections, errors, false);
  });
  form.querySelector("#estimate").addEventListener("click", () => send(form, sections, errors, true));
}

// Submit the form's spec; with `dryRun`, store nothing and say when it would start.
async function send(form, sections, errors, dryRun) {
  errors.clear();
  const answerBox = form.querySelector("#estimate-answer");
  answerBox.textContent = "";
  const spec = { hyperparameters: {} };
  try {
    for (const section of sections) section.read(spec);
    if (spec.command || spec.kind === "notebook") delete spec.hyperparameters;
  } catch (error) {
    errors.show(error.field, error.message);
    return;
  }
  const button = form.querySelector(dryRun ? "#estimate" : "#submit");
  button.disabled = true;
  try {
    const file = spec.codeFile;
    delete spec.codeFile;
    if (dryRun) {
      const answer = await api("api/jobs?dry_run=true", { method: "POST", body: spec });
      answerBox.textContent = estimateText(answer);
      return;
    }
    if (file) spec.code = await uploadCode(file, errors);
    if (spec.code === null) return;
    const job = await api("api/jobs", { method: "POST", body: spec });
    toast(`Job ${job.id} submitted`);
    location.hash = `#/jobs/${job.id}`;
  } catch (error) {
    if (error instanceof ApiError && Array.isArray(error.detail)) {
      for (const problem of error.detail) errors.show(problem.loc.slice(1).join("."), problem.msg);
    } else {
      errors.formError.textContent = error.message;
    }
  } finally {
    button.disabled = false;
  }
}

function estimateText(answer) {
  if (answer.starts_now) return `Submitted now, it would start at once on ${answer.expected_host}.`;
  if (!answer.queue_position && answer.reason) {
    // held back: on hold, waiting for a job, or its begin ahead (after which the replay may see it start)
    const then = answer.expected_start_at ? `; then likely start ${expectedStart(answer)}` : "";
    return `It would not start yet: ${answer.reason}${then}.`;
  }
  const where = answer.queue_position ? `#${answer.queue_position} in the queue` : "queued";
  const why = answer.reason ? ` (${answer.reason})` : "";
  if (!answer.expected_start_at) return `It would wait, ${where}${why}; no estimate of when it would start.`;
  return `It would wait, ${where}${why}, and likely start ${expectedStart(answer)}.`;
}

// A code bundle from the form's file field: its id, or null (the error shown at "code").
async function uploadCode(file, errors) {
  const body = new FormData();
  body.append("file", file, file.name);
  const response = await fetch("api/code", { method: "POST", body });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) {
    const detail = Array.isArray(answer.detail) ? answer.detail.map((d) => d.msg).join("; ") : answer.detail;
    errors.show("code", detail || `upload failed (${response.status})`);
    return null;
  }
  return answer.id;
}

// The fields of the form by spec path, and the error shown beside each.
class FieldErrors {
  constructor(form) {
    this.form = form;
    this.fields = {};
    this.formError = el("p", { class: "error", id: "form-error", role: "alert" });
  }

  field(id, label, input, help = "") {
    this.fields[id] = input;
    input.id = `f-${id}`;
    input.setAttribute("aria-describedby", `err-${id}`);
    return el(
      "div",
      { class: "field" },
      el("label", { for: input.id }, label),
      input,
      help ? el("small", { class: "muted" }, help) : null,
      el("span", { class: "field-error", id: `err-${id}`, "aria-live": "polite" }),
    );
  }

  clear() {
    this.formError.textContent = "";
    for (const box of this.form.querySelectorAll(".field-error")) box.textContent = "";
    for (const input of this.form.querySelectorAll("[aria-invalid]")) input.removeAttribute("aria-invalid");
  }

  // The error of `path` (e.g. "hyperparameters.learning_rate") beside the nearest field.
  show(path, message) {
    const parts = path.split(".");
    const key = [path, parts.slice(0, 2).join("."), parts[0]].find((k) => k in this.fields);
    const box = key && this.form.querySelector(`#err-${CSS.escape(key)}`);
    if (!box) {
      this.formError.textContent = `${this.formError.textContent} ${message}`.trim();
      return;
    }
    box.textContent = message;
    this.fields[key].setAttribute("aria-invalid", "true");
    if (!this.form.querySelector("[aria-invalid]:focus")) this.fields[key].focus();
  }
}

// What runs: a model in towerq's trainer (built in, or a function of your code), your own
// program (a command over your code: PyTorch, JAX, a script), or a JupyterLab session.
function whatSection(catalog, errors, onKind) {
  const OWN = "";
  const kind = el(
    "select",
    {},
    el("option", { value: "model" }, "a model, trained by towerq's trainer"),
    el("option", { value: "command" }, "your own program (PyTorch, JAX, a script) over your code"),
    el("option", { value: "notebook" }, "a notebook session (JupyterLab)"),
  );
  const model = el(
    "select",
    {},
    catalog.models.map((m) => el("option", { value: m.name, title: m.description }, `${m.name} — ${m.description}`)),
    el("option", { value: OWN }, "your own code — module:function in a file you upload"),
  );
  // Your own model: a function in an uploaded .py / .zip / .tar.gz (or the bundle of a clone).
  const entry = el("input", { maxlength: 256, placeholder: "nets:build" });
  const codeFile = el("input", { type: "file", accept: ".py,.zip,.tar.gz,.tgz" });
  const kept = el("small", { class: "muted", id: "code-kept" });
  let keptCode = null;
  const entryField = errors.field("entry", "Function (module:function)", entry, "e.g. nets:build for build() in nets.py");
  const code = el(
    "div",
    { class: "own-code", hidden: true },
    entryField,
    errors.field("code", "Code (.py, or a .zip / .tar.gz of a folder)", codeFile, "the folder's root is first on the import path"),
    kept,
  );
  const program = programFields(errors);
  const session = sessionFields(errors);
  const packages = packagesField(errors);
  const dataset = el("input", { list: "datasets", maxlength: 1024, value: "digits" });
  const datasets = el(
    "datalist",
    { id: "datasets" },
    catalog.datasets.map((d) => el("option", { value: d.name }, d.description)),
  );
  const datasetOptions = el("textarea", { rows: 2, placeholder: '{"shape": [28, 28, 3], "classes": 10}' });
  const datasetHelp = {
    model: "a name, or npz:PATH, tfrecord:PATTERN, images:FOLDER under the data folder",
    other: "optional: an upload (npz:PATH, tfrecord:PATTERN, images:FOLDER, as towerq data list shows it), read only",
  };
  const datasetField = errors.field("dataset", "Dataset", dataset, datasetHelp.model);
  const optionsField = errors.field("dataset_options", "Dataset options (JSON)", datasetOptions);
  const name = el("input", { maxlength: 128, placeholder: "model-dataset" });
  const show = () => {
    const isModel = kind.value === "model";
    model.closest(".field").hidden = !isModel;
    optionsField.hidden = !isModel;
    entryField.hidden = !isModel;
    code.hidden = isModel && model.value !== OWN;
    program.node.hidden = kind.value !== "command";
    session.node.hidden = kind.value !== "notebook";
    packages.node.hidden = isModel;
    name.placeholder = { model: "model-dataset", command: "the command", notebook: "notebook" }[kind.value];
    dataset.placeholder = isModel ? "" : "none";
    datasetField.querySelector("small").textContent = isModel ? datasetHelp.model : datasetHelp.other;
    onKind(kind.value);
  };
  kind.addEventListener("change", () => {
    if (kind.value !== "model" && dataset.value === "digits") dataset.value = ""; // a program reads an upload, if any
    show();
  });
  model.addEventListener("change", show);
  const node = el(
    "fieldset",
    {},
    el("legend", {}, "What"),
    errors.field("kind", "What runs", kind),
    errors.field("name", "Name", name),
    errors.field("model", "Model", model),
    program.node,
    session.node,
    packages.node,
    code,
    datasetField,
    datasets,
    optionsField,
  );
  return {
    node,
    start: show,
    fill(spec) {
      kind.value = spec.kind === "notebook" ? "notebook" : spec.command ? "command" : "model";
      name.value = spec.name ?? "";
      const builtin = catalog.models.some((m) => m.name === spec.model);
      model.value = builtin || !spec.model ? (spec.model ?? catalog.models[0]?.name) : OWN;
      entry.value = builtin || !spec.model ? "" : spec.model;
      keptCode = spec.code ?? null;
      kept.textContent = keptCode ? `Uses code bundle ${keptCode.slice(0, 12)}… of the cloned job; choose a file to replace it.` : "";
      program.fill(spec);
      session.fill(spec);
      packages.fill(spec);
      dataset.value = spec.dataset ?? "";
      datasetOptions.value = jsonText(Object.fromEntries(Object.entries(spec.dataset_options || {}).filter(([, v]) => v !== null)));
      show();
    },
    read(spec) {
      const chosen = kind.value;
      if (name.value.trim()) spec.name = name.value.trim();
      if (dataset.value.trim() || chosen === "model") spec.dataset = dataset.value.trim();
      const takeCode = (needed) => {
        if (codeFile.files.length) spec.codeFile = codeFile.files[0];
        else if (keptCode) spec.code = keptCode;
        else if (needed) throw Object.assign(new Error("choose the file with your code"), { field: "code" });
      };
      if (chosen === "command") {
        takeCode(true);
        program.read(spec);
        packages.read(spec);
        return;
      }
      if (chosen === "notebook") {
        takeCode(false);
        session.read(spec);
        packages.read(spec);
        return;
      }
      spec.model = model.value;
      if (model.value === OWN) {
        spec.model = entry.value.trim();
        if (!spec.model.includes(":")) throw Object.assign(new Error("name the function as module:function"), { field: "entry" });
        takeCode(true);
      }
      spec.dataset_options = parseJson(datasetOptions.value, "dataset_options");
    },
  };
}

// Your own program's fields: its command line (over the code), environment, processes.
function programFields(errors) {
  const command = el("input", { maxlength: 4096, placeholder: "python train.py --lr 0.1", class: "mono" });
  const env = el("textarea", { rows: 2, placeholder: '{"SEED": "1"}' });
  const perGpu = el("input", { type: "checkbox" });
  const resumable = el("input", { type: "checkbox" });
  const node = el(
    "div",
    { class: "program", hidden: true },
    errors.field("command", "Command", command, "run in a copy of your code; quote as in a shell"),
    errors.field("env", "Environment (JSON)", env),
    errors.field("processes", "One process per GPU", perGpu, "RANK, WORLD_SIZE, MASTER_ADDR for each (torch DDP, TF_CONFIG)"),
    errors.field("resumable", "Resumable", resumable, "it resumes from $TOWERQ_CHECKPOINT_DIR: towerq may stop and restart it"),
  );
  return {
    node,
    fill(spec) {
      command.value = spec.command ? spec.command.map(shellWord).join(" ") : "";
      env.value = jsonText(spec.env || {});
      perGpu.checked = spec.processes === "per_gpu";
      resumable.checked = Boolean(spec.resumable);
    },
    read(spec) {
      spec.command = splitCommand(command.value);
      const own = parseJson(env.value, "env");
      if (Object.keys(own).length) spec.env = own;
      if (perGpu.checked) spec.processes = "per_gpu";
      if (resumable.checked) spec.resumable = true;
    },
  };
}

// A program's or a session's packages besides the lab's, one a line as in requirements.txt.
function packagesField(errors) {
  const packages = el("textarea", { rows: 2, class: "mono", placeholder: "einops\ntransformers==4.46.1" });
  return {
    node: errors.field(
      "requirements",
      "Packages",
      packages,
      "besides the lab's, one a line, as in requirements.txt: installed once per host",
    ),
    fill(spec) {
      packages.value = (spec.requirements || []).join("\n");
    },
    read(spec) {
      const listed = packages.value
        .split("\n")
        .map((line) => line.replace(/(^|\s)#.*$/, "").trim())
        .filter(Boolean);
      if (listed.length) spec.requirements = listed;
    },
  };
}

// A notebook session's fields: when it ends idle.
function sessionFields(errors) {
  const idle = el("input", { placeholder: "the lab's default", inputmode: "text" });
  const node = el(
    "div",
    { class: "session", hidden: true },
    errors.field("idle_timeout_s", "Ends when idle for", idle, "no browser connected, no kernel busy: 30m, 2h"),
  );
  return {
    node,
    fill(spec) {
      idle.value = spec.idle_timeout_s ? duration(spec.idle_timeout_s) : "";
    },
    read(spec) {
      spec.kind = "notebook";
      if (idle.value.trim()) spec.idle_timeout_s = durationOf(idle.value, "idle_timeout_s");
    },
  };
}

function hyperSection(catalog, errors) {
  const hyper = Object.entries(catalog.hyperparameters).filter(([key]) => !HIDDEN_HYPERPARAMETERS.has(key));
  const inputs = Object.fromEntries(hyper.map(([key, schema]) => [key, inputFor(schema)]));
  const modelOptions = el("textarea", { rows: 2, placeholder: '{"hidden": [128, 64]}' });
  const node = el(
    "fieldset",
    {},
    el("legend", {}, "Hyperparameters"),
    ...hyper.map(([key, schema]) =>
      errors.field(`hyperparameters.${key}`, key.replaceAll("_", " "), inputs[key], schema.description || ""),
    ),
    errors.field("hyperparameters.model_options", "Model options (JSON)", modelOptions),
  );
  return {
    node,
    fill(spec) {
      const given = spec.hyperparameters || {};
      for (const [key] of hyper) setValue(inputs[key], given[key]);
      modelOptions.value = jsonText(given.model_options || {});
    },
    read(spec) {
      for (const [key] of hyper) {
        const value = readValue(inputs[key]);
        if (value !== undefined) spec.hyperparameters[key] = value;
      }
      spec.hyperparameters.model_options = parseJson(modelOptions.value, "hyperparameters.model_options");
    },
  };
}

function whereSection(catalog, gpus, errors) {
  const hosts = [...new Set(gpus.map((g) => g.host))];
  const host = el(
    "select",
    {},
    hosts.map((h) => el("option", { value: h }, h)),
  );
  const picker = gpuPicker(gpus, host);
  errors.fields.gpus = picker.node;
  const gpuCount = el("input", { type: "number", min: 1, max: 64, value: 1 });
  const fraction = el("input", { type: "number", min: 0.05, max: 1, step: 0.05, value: 1 });
  const priority = el(
    "select",
    {},
    catalog.priorities.map((p) => el("option", { value: p, selected: p === "normal" }, p)),
  );
  const timeLimit = el("input", { placeholder: "none", inputmode: "text" });
  const variableDevice = el(
    "select",
    {},
    catalog.variable_devices.map((d) => el("option", { value: d }, d)),
  );
  const towerWeights = el("input", { placeholder: "e.g. 2,1", pattern: "[0-9., ]*" });
  const precision = el(
    "select",
    {},
    catalog.precisions.map((p) => el("option", { value: p.name, title: p.description }, p.name)),
  );
  const jitCompile = el("input", { type: "checkbox" });
  const hold = el("input", { type: "checkbox" }); // never a clone's: a hold is the submitter's choice
  const beginAt = el("input", { type: "datetime-local" }); // a clone's only while it is ahead
  const switchMode = () => {
    picker.enable(picker.mode.pick.checked);
    gpuCount.disabled = picker.mode.pick.checked;
  };
  host.addEventListener("change", () => {
    picker.draw();
    switchMode();
  });
  picker.mode.pick.addEventListener("change", switchMode);
  picker.mode.count.addEventListener("change", switchMode);
  // The trainer's own: its towers, where its variables live, its maths (not a program's or a session's).
  const trainerOnly = [
    errors.field("tower_weights", "Tower weights", towerWeights, "unequal batch slices for unequal GPUs"),
    errors.field("variable_device", "Variables on", variableDevice),
    errors.field("precision", "Precision", precision, "mixed: float16 or bfloat16 maths, float32 weights"),
    errors.field("jit_compile", "Compile with XLA", jitCompile, "each tower's step, on its own GPU"),
  ];
  let forModel = true;
  const node = el(
    "fieldset",
    {},
    el("legend", {}, "Where and when"),
    errors.field("host", "Host", host),
    el(
      "div",
      { class: "field" },
      el("span", { class: "label" }, "GPU choice"),
      el("label", { for: "mode-pick", class: "inline" }, picker.mode.pick, " these GPUs"),
      el("label", { for: "mode-count", class: "inline" }, picker.mode.count, " any GPUs"),
    ),
    picker.node,
    errors.field("gpu_count", "How many GPUs", gpuCount),
    errors.field("gpu_memory_fraction", "Memory fraction of each GPU", fraction, "below 1: GPUs may be shared with other such jobs"),
    ...trainerOnly,
    errors.field("priority", "Priority", priority),
    errors.field("time_limit_s", "Time limit", timeLimit, "stops it after this long: 2h, 90m, 1:30:00"),
    errors.field("begin_at", "Not before", beginAt, "it starts no earlier than this, your clock (empty: as soon as it can)"),
    errors.field("hold", "Queue it on hold", hold, "it starts once you release it (its page's Release)"),
  );
  return {
    node,
    start() {
      picker.draw();
      switchMode();
    },
    forModel(on) {
      forModel = on;
      for (const field of trainerOnly) field.hidden = !on;
    },
    fill(spec) {
      if (spec.host) host.value = spec.host;
      picker.draw();
      picker.mode[spec.gpus ? "pick" : "count"].checked = true;
      if (spec.gpus) picker.choose(spec.gpus);
      else gpuCount.value = spec.gpu_count;
      switchMode();
      fraction.value = spec.gpu_memory_fraction ?? 1;
      towerWeights.value = spec.tower_weights ? spec.tower_weights.join(",") : "";
      variableDevice.value = spec.variable_device ?? catalog.variable_devices[0];
      precision.value = spec.precision || "float32";
      jitCompile.checked = Boolean(spec.jit_compile);
      priority.value = spec.priority ?? "normal";
      timeLimit.value = spec.time_limit_s ? duration(spec.time_limit_s) : "";
      const begin = spec.begin_at ? new Date(spec.begin_at) : null;
      beginAt.value = begin && begin > new Date() ? localMoment(begin) : "";
    },
    read(spec) {
      if (hosts.length) spec.host = host.value;
      if (picker.mode.pick.checked) {
        spec.gpus = picker.chosen();
        if (!spec.gpus.length) throw Object.assign(new Error("pick at least one GPU"), { field: "gpus" });
      } else {
        spec.gpu_count = Number(gpuCount.value);
      }
      spec.gpu_memory_fraction = Number(fraction.value);
      if (forModel) {
        if (towerWeights.value.trim()) spec.tower_weights = towerWeights.value.split(",").map((w) => Number(w.trim()));
        spec.variable_device = variableDevice.value;
        spec.precision = precision.value;
        spec.jit_compile = jitCompile.checked;
      }
      spec.priority = priority.value;
      if (timeLimit.value.trim()) spec.time_limit_s = durationOf(timeLimit.value, "time_limit_s");
      if (beginAt.value) spec.begin_at = new Date(beginAt.value).toISOString();
      if (hold.checked) spec.hold = true;
    },
  };
}

// A checkbox per GPU of the chosen host (a free one preselected), or "any N GPUs".
function gpuPicker(gpus, host) {
  const node = el("fieldset", { class: "gpu-picker", id: "gpu-picker", tabindex: -1 }, el("legend", {}, "GPUs"));
  const mode = {
    pick: el("input", { type: "radio", name: "gpu-mode", value: "pick", id: "mode-pick", checked: true }),
    count: el("input", { type: "radio", name: "gpu-mode", value: "count", id: "mode-count" }),
  };
  const boxes = () => [...node.querySelectorAll("input")];
  return {
    node,
    mode,
    draw() {
      const onHost = gpus.filter((g) => g.host === host.value);
      node.replaceChildren(el("legend", {}, `GPUs on ${host.value || "—"}`), ...onHost.map(gpuChoice));
      node.append(el("span", { class: "field-error", id: "err-gpus", "aria-live": "polite" }));
      const free = onHost.find((g) => g.free_fraction >= 1 && !g.drained && g.host_state === "up");
      const first = node.querySelector(free ? `#gpu-${free.index}` : "input:not([disabled])");
      if (first && !node.querySelector("input:checked")) first.checked = true;
    },
    enable(on) {
      for (const box of boxes()) box.disabled = !on || box.dataset.unusable === "1";
    },
    choose(indices) {
      for (const box of boxes()) box.checked = indices.includes(Number(box.value));
    },
    chosen: () =>
      boxes()
        .filter((box) => box.checked)
        .map((box) => Number(box.value)),
  };
}

function gpuChoice(gpu) {
  const unusable = gpu.drained || gpu.host_state !== "up";
  const box = el("input", {
    type: "checkbox",
    value: gpu.index,
    id: `gpu-${gpu.index}`,
    disabled: unusable,
    dataset: { unusable: unusable ? "1" : "0" },
  });
  const who = gpu.holders.length
    ? gpu.holders.map((h) => `job ${h.job_id} (${h.user}${h.fraction < 1 ? `, ${h.fraction}` : ""})`).join(", ")
    : "free";
  return el(
    "label",
    { class: "gpu-choice", for: box.id },
    box,
    ` GPU ${gpu.index} `,
    el(
      "span",
      { class: "muted" },
      `${gpu.simulated && /simulated/i.test(gpu.name) ? gpu.name : `${gpu.name}${gpu.simulated ? " (simulated)" : ""}`} · ${who}`,
    ),
  );
}
