// satdar dashboard: the coordinator's jobs, workers and, per job, live charts drawn on canvas
// from /api/jobs/<id> (no libraries). Each chart records how much it drew in data-points or
// data-cells, which the tests read. The comparison of jobs (#compare=...) is in compare.js.
"use strict";

const COLORS = ["#2457c5", "#d9661f", "#1b7f3b", "#8e44ad", "#b3261e"];
const PHASES = ["data", "compute", "comm_wait", "pipeline_bubble", "optimizer"];
const REFRESH_MS = 2000;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function fmt(v, digits) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(2) + "M";
  if (Math.abs(v) >= 1e4) return (v / 1e3).toFixed(1) + "k";
  return Number(v).toFixed(digits === undefined ? 3 : digits);
}

function ago(ms) {
  if (!ms) return "–";
  const s = Math.max(0, (Date.now() - Number(ms)) / 1000);
  if (s < 60) return s.toFixed(0) + " s ago";
  if (s < 3600) return (s / 60).toFixed(0) + " min ago";
  return new Date(Number(ms)).toLocaleString();
}

async function getJson(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

// ---- charts ----

function setupCanvas(canvas) {
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.font = "11px system-ui, sans-serif";
  return ctx;
}

function noData(canvas, ctx, why) {
  ctx.fillStyle = "#6b7385";
  ctx.fillText(why, 12, canvas.height / 2);
}

// series: [{xs, ys, color}], stacked: draw cumulative areas. Returns the chart's geometry
// (plot margins, ranges, px and py from data to canvas coordinates), or null when it drew no
// data.
function lineChart(canvas, series, opts) {
  opts = opts || {};
  const ctx = setupCanvas(canvas);
  const W = canvas.width, H = canvas.height, L = 52, R = 10, T = 10, B = 22;
  let n = 0, xmin = Infinity, xmax = -Infinity, ymin = Infinity, ymax = -Infinity;
  for (const s of series) {
    for (let i = 0; i < s.xs.length; i++) {
      const y = s.ys[i];
      if (y === null || !Number.isFinite(y)) continue;
      n++;
      xmin = Math.min(xmin, s.xs[i]); xmax = Math.max(xmax, s.xs[i]);
      ymin = Math.min(ymin, y); ymax = Math.max(ymax, y);
    }
  }
  canvas.dataset.points = String(n);
  if (n === 0) { noData(canvas, ctx, "no data yet"); return null; }
  if (opts.zero) ymin = Math.min(0, ymin);
  if (ymax === ymin) { ymax += Math.abs(ymax) * 0.05 + 1e-9; ymin -= Math.abs(ymin) * 0.05 + 1e-9; }
  if (xmax === xmin) xmax = xmin + 1;
  const px = x => L + (x - xmin) / (xmax - xmin) * (W - L - R);
  const py = y => H - B - (y - ymin) / (ymax - ymin) * (H - T - B);
  ctx.strokeStyle = "#e2e5ec"; ctx.fillStyle = "#6b7385"; ctx.lineWidth = 1;
  for (let k = 0; k <= 4; k++) {
    const y = ymin + (ymax - ymin) * k / 4;
    ctx.beginPath(); ctx.moveTo(L, py(y)); ctx.lineTo(W - R, py(y)); ctx.stroke();
    ctx.fillText(fmt(y, opts.digits), 4, py(y) + 4);
  }
  ctx.fillText("step " + xmin, L, H - 6);
  const last = "step " + xmax;
  ctx.fillText(last, W - R - ctx.measureText(last).width, H - 6);
  for (const s of series) {
    ctx.strokeStyle = s.color; ctx.fillStyle = s.color; ctx.lineWidth = 1.6;
    if (s.base) {  // a stacked area between s.base and s.ys
      ctx.beginPath();
      let started = false;
      for (let i = 0; i < s.xs.length; i++) {
        if (s.ys[i] === null) continue;
        if (!started) { ctx.moveTo(px(s.xs[i]), py(s.ys[i])); started = true; } else ctx.lineTo(px(s.xs[i]), py(s.ys[i]));
      }
      for (let i = s.xs.length - 1; i >= 0; i--) if (s.ys[i] !== null) ctx.lineTo(px(s.xs[i]), py(s.base[i]));
      ctx.globalAlpha = 0.55; ctx.fill(); ctx.globalAlpha = 1;
      continue;
    }
    ctx.beginPath();
    let started = false;
    for (let i = 0; i < s.xs.length; i++) {
      const y = s.ys[i];
      if (y === null || !Number.isFinite(y)) continue;
      if (!started) { ctx.moveTo(px(s.xs[i]), py(y)); started = true; } else ctx.lineTo(px(s.xs[i]), py(y));
    }
    ctx.stroke();
    if (s.dots) for (let i = 0; i < s.xs.length; i++) {
      if (s.ys[i] === null) continue;
      ctx.beginPath(); ctx.arc(px(s.xs[i]), py(s.ys[i]), 2.5, 0, 2 * Math.PI); ctx.fill();
    }
  }
  return { ctx, W, H, L, R, T, B, xmin, xmax, ymin, ymax, px, py };
}

// matrix: rows of numbers; colour from white (lo) to blue (hi).
function heatmap(canvas, matrix, rowLabel, colLabel, lo, hi, empty) {
  const ctx = setupCanvas(canvas);
  const rows = (matrix || []).length;
  const cols = rows ? Math.max(...matrix.map(r => (r || []).length)) : 0;
  let cells = 0;
  if (!rows || !cols) { canvas.dataset.cells = "0"; return noData(canvas, ctx, empty); }
  const vals = matrix.flat().filter(v => Number.isFinite(v));
  if (lo === undefined) lo = Math.min(...vals);
  if (hi === undefined) hi = Math.max(...vals);
  if (hi <= lo) hi = lo + 1e-9;
  const L = 64, T = 8, R = 60, B = 20;
  const cw = (canvas.width - L - R) / cols, ch = (canvas.height - T - B) / rows;
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < (matrix[r] || []).length; c++) {
      const v = matrix[r][c];
      if (!Number.isFinite(v)) continue;
      const t = Math.max(0, Math.min(1, (v - lo) / (hi - lo)));
      ctx.fillStyle = `rgb(${Math.round(255 - 219 * t)},${Math.round(255 - 168 * t)},${Math.round(255 - 58 * t)})`;
      ctx.fillRect(L + c * cw, T + r * ch, Math.max(1, cw - 1), Math.max(1, ch - 1));
      cells++;
    }
  }
  ctx.fillStyle = "#6b7385";
  const every = Math.max(1, Math.ceil(rows / 12));
  for (let r = 0; r < rows; r += every) ctx.fillText(rowLabel(r), 4, T + r * ch + ch / 2 + 4);
  const everyC = Math.max(1, Math.ceil(cols / 16));
  for (let c = 0; c < cols; c += everyC) ctx.fillText(colLabel(c), L + c * cw + 2, canvas.height - 6);
  ctx.fillText(fmt(hi, 2), canvas.width - R + 6, T + 10);
  ctx.fillText(fmt(lo, 2), canvas.width - R + 6, canvas.height - B);
  canvas.dataset.cells = String(cells);
}

// ---- views ----

function renderJobs(jobs) {
  const tbody = document.querySelector("#jobs tbody");
  tbody.replaceChildren();
  const counts = {};
  for (const j of jobs) {
    counts[j.state] = (counts[j.state] || 0) + 1;
    const tr = el("tr");
    tr.dataset.jobId = j.job_id;
    tr.appendChild(compareCell(j.job_id));  // compare.js
    const link = el("a", j.job_id);
    link.href = "#job=" + encodeURIComponent(j.job_id);
    const id = el("td"); id.appendChild(link); tr.appendChild(id);
    tr.appendChild(el("td", j.name));
    const state = el("td", j.state, "state-" + j.state);
    if (j.pending_reason) state.title = j.pending_reason;  // why it waits
    tr.appendChild(state);
    tr.appendChild(el("td", j.design || ""));
    const l = j.layout || {};
    tr.appendChild(el("td", `dp${l.dp} tp${l.tp} pp${l.pp} ep${l.ep} ${j.device || ""}`));
    tr.appendChild(el("td", `${j.step}/${j.steps}`));
    const running = j.state !== "PENDING" && j.step > 0;  // a waiting job has no loss
    tr.appendChild(el("td", fmt(running ? j.loss : null, 4)));
    tr.appendChild(el("td", fmt(running ? j.tokens_per_second : null, 0)));
    tr.appendChild(el("td", j.attempts));
    tr.appendChild(el("td", ago(j.submit_time_ms)));
    tbody.appendChild(tr);
  }
  updateCompareButton();
  document.getElementById("summary").textContent =
    Object.entries(counts).map(([k, v]) => `${v} ${k.toLowerCase()}`).join(" · ") || "no jobs yet";
}

function renderWorkers(workers) {
  const tbody = document.querySelector("#workers tbody");
  tbody.replaceChildren();
  for (const w of workers) {
    const tr = el("tr");
    for (const v of [w.name, w.host, w.device, w.slots, w.busy_slots]) tr.appendChild(el("td", v));
    tr.appendChild(el("td", w.state, w.state === "ALIVE" ? "state-RUNNING" : "state-FAILED"));
    tr.appendChild(el("td", ago(w.last_heartbeat_ms)));
    tbody.appendChild(tr);
  }
}

function column(series, name) {
  const i = series.fields.indexOf(name);
  return series.points.map(p => (i < 0 ? null : p[i]));
}

function renderJob(data) {
  const job = data.job, s = data.series;
  document.getElementById("job-title").textContent =
    `${job.job_id} ${job.name ? "· " + job.name : ""} · ${job.state}` +
    (job.pending_reason ? ` · ${job.pending_reason}` : "");  // why it waits
  const l = job.layout || {};
  document.getElementById("job-facts").textContent =
    `${job.design || ""} · dp${l.dp} tp${l.tp} pp${l.pp} ep${l.ep} on ${job.device || "cpu"} · step ${job.step}/${job.steps}` +
    ` · attempt ${job.attempts}` + (job.reason ? ` · ${job.reason}` : "");
  const steps = column(s, "step");
  lineChart(document.getElementById("chart-loss"), [
    { xs: steps, ys: column(s, "loss"), color: COLORS[0] },
    { xs: steps, ys: column(s, "val_loss"), color: COLORS[1], dots: true },
  ], { digits: 3 });
  lineChart(document.getElementById("chart-tps"), [{ xs: steps, ys: column(s, "tokens_per_second"), color: COLORS[0] }], { zero: true, digits: 0 });
  lineChart(document.getElementById("chart-mfu"), [{ xs: steps, ys: column(s, "mfu").map(v => (v === null ? null : 100 * v)), color: COLORS[2] }], { zero: true, digits: 1 });
  // Step time: stacked phases.
  const stacked = [];
  let base = steps.map(() => 0);
  PHASES.forEach((p, k) => {
    const ys = column(s, "phase_" + p);
    const top = ys.map((v, i) => (v === null ? null : base[i] + v));
    if (ys.some(v => v !== null)) stacked.push({ xs: steps, ys: top, base: base.slice(), color: COLORS[k] });
    base = top.map((v, i) => (v === null ? base[i] : v));
  });
  lineChart(document.getElementById("chart-phases"), stacked, { zero: true, digits: 3 });
  const key = document.getElementById("phase-key");
  key.replaceChildren();
  PHASES.forEach((p, k) => { key.appendChild(el("i", null, "c" + k)); key.appendChild(document.createTextNode(p)); });
  const st = s.stats || {};
  heatmap(document.getElementById("heat-gates"), st.gate_zero, r => "layer " + (r + 1), c => "h" + c, 0, 1,
          "no SATFormer gates (or no statistics yet: train.stats_every)");
  heatmap(document.getElementById("heat-depth"), st.depth_entropy, r => "sub " + r, c => "stream " + c, 0, undefined,
          "no depth retrievals (or no statistics yet)");
  const load = (st.expert_load || []).map(row => {
    const sum = row.reduce((a, b) => a + b, 0);
    return row.map(v => (sum > 0 ? v / sum : 0));
  });
  heatmap(document.getElementById("heat-experts"), load, r => "layer " + r, c => "e" + c, 0, undefined,
          "no MoE layers (or no statistics yet)");
  document.getElementById("stats-note").textContent = s.stats_step
    ? `statistics from step ${s.stats_step}; series of ${s.points.length} points (every ${s.stride} step(s))`
    : `series of ${s.points.length} points; statistics appear with train.stats_every`;
}

async function refresh() {
  const m = location.hash.match(/^#job=(.+)$/);
  const compare = parseCompareHash(location.hash);  // compare.js
  document.getElementById("jobs-view").hidden = !!m || !!compare;
  document.getElementById("job-view").hidden = !m;
  document.getElementById("compare-view").hidden = !compare;
  try {
    if (m) {
      renderJob(await getJson("/api/jobs/" + m[1]));
    } else if (compare) {
      await renderCompare(compare);
    } else {
      renderJobs((await getJson("/api/jobs")).jobs);
      renderWorkers((await getJson("/api/workers")).workers);
    }
    document.getElementById("status").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.loaded = "true";
  } catch (e) {
    document.getElementById("status").textContent = "cannot reach the coordinator: " + e.message;
  }
}

window.addEventListener("hashchange", refresh);
refresh();
setInterval(refresh, REFRESH_MS);
