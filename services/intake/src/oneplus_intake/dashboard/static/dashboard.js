// OnePlus dashboard: plain JS, no build step. Views by location hash: #/ (cluster), #/queue, #/job/<id>,
// #/node/<name>.
// Everything on screen comes from /ui/api/*, polled every POLL_MS; text goes in as text, never as HTML.
"use strict";

const POLL_MS = 1500;
const state = { cluster: null, queue: null, job: null, node: null, explains: new Map(), timer: null, busy: false };

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "style") el.style.cssText = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k.startsWith("data-")) el.setAttribute(k, String(v));
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// replaceChildren that skips empty parts (null, false) and flattens lists.
function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

async function api(path) {
  const res = await fetch("/ui/api/" + path, { cache: "no-store" });
  let body;
  try {
    body = await res.json();
  } catch (e) {
    throw new Error(`${path}: HTTP ${res.status}`);
  }
  if (!body.ok) throw new Error(body.error || `${path}: HTTP ${res.status}`);
  return body.result;
}

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  if (hash.startsWith("/job/")) return { view: "job", id: decodeURIComponent(hash.slice(5)) };
  if (hash.startsWith("/node/")) return { view: "node", id: decodeURIComponent(hash.slice(6)) };
  if (hash.startsWith("/queue")) return { view: "queue" };
  return { view: "cluster" };
}

function fmtTime(ts) {
  if (!ts) return "";
  const d = new Date(ts * 1000);
  return d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

function jobLink(id, colour) {
  return h("a", { href: "#/job/" + encodeURIComponent(id), class: "job-link", "data-job": id },
    colour ? h("span", { class: "swatch", style: `background:${colour}` }) : null, id);
}

function setError(msg) {
  const el = document.getElementById("error");
  el.hidden = !msg;
  el.textContent = msg || "";
}

function setLive(ok, when) {
  const el = document.getElementById("live");
  el.className = "live " + (ok ? "ok" : "stale");
  el.textContent = ok ? `live · ${fmtTime(when)}` : "not updating";
}

function counts(c, extra) {
  return h("span", { class: "counts" },
    h("span", { class: "c-free", title: "free GPUs" }, `${c.free} free`), " · ",
    h("span", { class: "c-held", title: "GPUs held by jobs" }, `${c.held} held`),
    c.fragmented ? [" · ", h("span", { class: "c-frag", title: "free GPUs in a domain a job uses part of" }, `${c.fragmented} fragmented`)] : null,
    c.shared ? [" · ", h("span", { class: "c-shared", title: "held GPUs whose shares leave room for a fractional job" }, `${c.shared} shared`)] : null,
    c.unhealthy ? [" · ", h("span", { class: "c-bad" }, `${c.unhealthy} unhealthy`)] : null,
    c.unavailable ? [" · ", h("span", { class: "c-off" }, `${c.unavailable} unavailable`)] : null,
    c.mig ? [" · ", h("span", { class: "c-mig", title: "GPUs split into MIG instances, none held: their instances are free, the GPU is not free whole" }, `${c.mig} MIG`)] : null,
    extra || null);
}

// ---- cluster ---------------------------------------------------------------------------------------

function gpuTitle(node, dom, g, jobs) {
  const lines = [`${node.name} GPU ${g.index} (${dom.id}, ${dom.kind})`, `state: ${g.state}`];
  if (g.mig_enabled) lines.push(`MIG mode: ${g.mig_instances} instance${g.mig_instances === 1 ? "" : "s"} (see the node's page)`);
  for (const hd of g.holders) {
    const j = jobs[hd.job_id] || {};
    lines.push(`job ${hd.job_id} ${j.name ? "(" + j.name + ")" : ""} rank ${hd.rank} token ${hd.token} ${hd.state}` +
      (hd.mig ? ` MIG ${hd.mig}` : hd.milli < 1000 ? ` ${hd.milli / 10}%` : ""));
  }
  if (g.health !== "ok") lines.push(`health: ${g.health}${g.health_reason ? " — " + g.health_reason : ""}`);
  return lines.join("\n");
}

// A GPU held by shares is filled from the bottom as far as its holders hold it, each in its job's colour: a
// 0.5-GPU job fills half the tile, not all of it.
function gpuFill(g, jobs) {
  const whole = g.holders.length === 1 && (g.holders[0].milli ?? 1000) >= 1000;
  if (!g.holders.length) return { style: null, shared: false };
  if (whole) {
    const job = jobs[g.holders[0].job_id];
    return { style: job ? `background:${job.colour}` : null, shared: false };
  }
  let at = 0;
  const stops = [];
  for (const hd of g.holders) {
    const colour = (jobs[hd.job_id] || {}).colour || "#7a8bb8";
    const part = Math.min(100 - at, (hd.milli ?? 1000) / 10);
    stops.push(`${colour} ${at}% ${at + part}%`);
    at += part;
  }
  if (at < 100) stops.push(`var(--free) ${at}% 100%`);
  return { style: `background:linear-gradient(to top, ${stops.join(", ")})`, shared: true };
}

function renderGpu(node, dom, g, jobs, focus) {
  const fillOf = gpuFill(g, jobs);
  const dim = focus && !g.holders.some((hd) => hd.job_id === focus);
  const cls = ["gpu", g.state, fillOf.shared ? "shared" : "", g.health !== "ok" ? "h-" + g.health : "",
    g.mig_enabled ? "mig" : "", dim ? "dim" : ""].join(" ");
  const el = h("span", {
    class: cls, "data-gpu": g.index, "data-state": g.state, "data-health": g.health, "data-job": g.job_id,
    "data-held-milli": g.held_milli ?? null, "data-mig": g.mig_enabled ? g.mig_instances : null,
    style: fillOf.style, title: gpuTitle(node, dom, g, jobs),
  }, String(g.index));
  if (g.job_id) el.addEventListener("click", () => { location.hash = "#/job/" + encodeURIComponent(g.job_id); });
  return el;
}

function renderDomain(node, dom, jobs, focus) {
  const label = dom.kind === "nvlink" ? "NVLink " + dom.id.split("/").pop() : "PCIe only";
  const extra = dom.kind === "nvlink" && dom.free ? ` · largest free NVLink group ${dom.largest_free_nvlink_group}` : "";
  return h("div", { class: `domain ${dom.kind} s-${dom.state}`, "data-domain": dom.id, "data-state": dom.state,
    "data-free": dom.free, "data-held": dom.held, "data-fragmented": dom.fragmented },
  h("div", { class: "domain-head" }, h("b", {}, label), ` ${dom.gpus.length} GPUs `,
    h("span", { class: "badge s-" + dom.state }, dom.state)),
  h("div", { class: "gpus" }, dom.gpus.map((g) => renderGpu(node, dom, g, jobs, focus))),
  h("div", { class: "domain-foot" }, counts(dom, extra)));
}

function renderNode(node, jobs, focus) {
  const status = node.cordoned ? "cordoned" : node.draining ? "draining" : node.status;
  return h("div", { class: `node st-${status}`, "data-node": node.name },
    h("div", { class: "node-head" }, h("a", { href: "#/node/" + encodeURIComponent(node.name), class: "node-link" },
      h("b", {}, node.name)), " ", h("span", { class: "model" }, node.gpu_model),
      node.mig_layout && node.mig_layout.length ? h("span", { class: "badge mig-badge", title: "GPUs in MIG mode: the node's page lists the instances" },
        `MIG ×${node.mig_layout.filter((g) => g.mig_enabled).length}`) : null,
      node.nvlink_domain ? h("span", { class: "model" }, ` · NVL domain ${node.nvlink_domain}`) : null,
      " ", h("span", { class: "badge st-" + status, title: node.reason || "" }, status)),
    h("div", { class: "domains" }, node.domains.map((d) => renderDomain(node, d, jobs, focus))),
    h("div", { class: "node-foot" }, counts(node, node.free ? ` · ${node.frag_pct}% of free fragmented` : "")));
}

// The site's level tree (the one placement searches: zone → spine → leaf → rack → NVLink domain → node, whatever
// levels the site names), each domain with its GPUs in use; a multi-node NVLink domain frames its trays.
const LEVEL_WORDS = { nvlink: "NVLink domain", cluster: "cluster" };

function nodesByName(c) {
  const out = new Map();
  for (const leaf of c.leaves) for (const n of leaf.nodes) out.set(n.name, n);
  return out;
}

function renderGroup(g, byName, jobs, focus) {
  const leaf = g.level === "leaf";
  const unit = g.level === "nvlink" ? "tray" : "node";
  const kids = g.children.map((ch) => renderGroup(ch, byName, jobs, focus));
  const nodes = g.nodes.map((n) => byName.get(n)).filter(Boolean).map((n) => renderNode(n, jobs, focus));
  return h("section", {
    class: `group lvl-${g.level}${leaf ? " leaf" : ""}`, "data-level": g.level, "data-group": g.name,
    "data-leaf": leaf ? g.name : null, "data-gpus": g.gpus, "data-in-use": g.gpus_in_use, "data-nodes": g.node_count,
  },
  h("h3", { class: "group-head" }, h("span", { class: "level" }, LEVEL_WORDS[g.level] || g.level), " ", g.name, " ",
    h("span", { class: "model in-use" }, `· ${g.node_count} ${unit}${g.node_count === 1 ? "" : "s"} · ` +
      `${g.gpus_in_use}/${g.gpus} GPUs in use`), " ",
    focus ? h("span", { class: "model" }, "· the job's nodes") : counts(g)),
  kids.length ? h("div", { class: "groups" }, kids) : null,
  nodes.length ? h("div", { class: "nodes" }, nodes) : null);
}

// The tree cut down to the domains that hold one of `names` (a job's nodes), each keeping only those nodes.
function pruneTree(groups, names) {
  const out = [];
  for (const g of groups) {
    const children = pruneTree(g.children, names);
    const nodes = g.nodes.filter((n) => names.includes(n));
    if (children.length || nodes.length) out.push({ ...g, children, nodes });
  }
  return out;
}

function renderTree(c, groups, focus) {
  const byName = nodesByName(c);
  return groups.map((g) => renderGroup(g, byName, c.jobs, focus));
}

function renderCluster(c) {
  const s = c.summary;
  const doms = Object.entries(s.domains).map(([k, v]) => `${v} ${k}`).join(", ");
  fill(document.getElementById("cluster-summary"),
    h("span", { class: "big" }, `${s.nodes} nodes · ${s.leaves} leaves · ${s.total} GPUs`), " ",
    counts(s, ` · ${s.frag_pct}% of free GPUs fragmented`),
    h("div", { class: "model levels", "data-levels": (c.levels || []).join(",") },
      "levels: ", ["cluster", ...(c.levels || []).slice().reverse(), "node"].join(" → ")),
    h("div", { class: "model" }, "NVLink/PCIe domains in nodes: ", doms));
  const jobs = Object.values(c.jobs).sort((a, b) => a.job_id.localeCompare(b.job_id));
  fill(document.getElementById("cluster-legend"),
    h("span", { class: "model" }, jobs.length ? "holding GPUs: " : "no job holds a GPU"),
    ...jobs.map((j) => h("span", { class: "legend-item", "data-job": j.job_id, title: `${j.state}, ${j.team}/${j.user}` },
      jobLink(j.job_id, j.colour), ` ${j.name} · ${j.gpus} GPU${j.gpus === 1 ? "" : "s"} · ${j.state}`)));
  fill(document.getElementById("cluster-leaves"), ...renderTree(c, c.tree || [], null));
}

// ---- queue -----------------------------------------------------------------------------------------

function fmtWait(s) {
  const t = Math.max(0, Math.floor(s));
  const hms = [Math.floor(t / 3600), Math.floor((t % 3600) / 60), t % 60];
  return hms[0] ? `${hms[0]}:${String(hms[1]).padStart(2, "0")}:${String(hms[2]).padStart(2, "0")}`
    : `${hms[1]}:${String(hms[2]).padStart(2, "0")}`;
}

function explainFacts(id, r) {
  const facts = [
    ["message", r.message], ["reason", r.reason], ["blocked at", r.level], ["constraint", r.constraint],
    ["needs GPUs", r.needed_gpus], ["best candidate", r.best_candidate], ["fits now", r.fits_now],
    ["jobs ahead", (r.ahead || []).join(", ")], ["preempting would fit", (r.preempt_to_fit || []).join(", ")],
  ].filter(([, v]) => v !== undefined && v !== null && v !== "");
  return h("div", { class: "explain", "data-job": id }, h("dl", {}, facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, String(v))])));
}

function renderExplain(id) {
  const ex = state.explains.get(id);
  if (!ex) return null;
  if (ex.loading) return h("div", { class: "explain", "data-job": id }, "asking the solver…");
  if (ex.error) return h("div", { class: "explain error", "data-job": id }, ex.error);
  return explainFacts(id, ex.result);
}

// A pending job's page: why it waits (the solver's reason and message), for how long, and the whole explanation.
function renderPending(j, pd) {
  return h("div", { class: "pending", "data-job": j.job_id },
    h("p", {}, h("b", {}, "pending"), ` · waiting ${fmtWait(pd.waiting_s)} since submission · reason `,
      h("span", { class: "badge pending-reason", "data-reason": pd.reason || "None" }, pd.reason || "None")),
    pd.message && !pd.explain ? h("p", { class: "pending-message" }, pd.message) : null,  // else it is the first fact
    pd.explain ? explainFacts(j.job_id, pd.explain)
      : h("p", { class: "model pending-error" }, pd.error ? `the solver did not explain: ${pd.error}` : "the solver has not decided yet"));
}

// "ring 0 GB/s" says nothing of a job on one GPU or a share of one.
function ringWords(p) {
  if (p.ring_gbps) return `ring ${p.ring_gbps} GB/s`;
  const share = p.ranks.find((r) => r.gpu_milli);
  return share ? `a share of one GPU (${share.gpu_milli / 10}%), no ring` : "one GPU, no ring";
}

async function toggleExplain(id) {
  if (state.explains.has(id) && !state.explains.get(id).loading) {
    state.explains.delete(id);
    if (state.queue) renderQueue(state.queue);
    return;
  }
  state.explains.set(id, { loading: true });
  if (state.queue) renderQueue(state.queue);
  try {
    state.explains.set(id, { result: await api("explain/" + encodeURIComponent(id)) });
  } catch (e) {
    state.explains.set(id, { error: String(e.message || e) });
  }
  if (state.queue) renderQueue(state.queue);
}

function renderQueue(q) {
  document.getElementById("pending-count").textContent = `(${q.pending.length})`;
  document.getElementById("holding-count").textContent = `(${q.holding.length})`;
  const rows = [];
  for (const r of q.pending) {
    const open = state.explains.has(r.job_id);
    rows.push(h("tr", { "data-job": r.job_id, class: "pending-row" },
      h("td", {}, jobLink(r.job_id)), h("td", {}, r.name), h("td", {}, r.queue), h("td", {}, r.user),
      h("td", {}, r.gpus), h("td", {}, r.time), h("td", { class: "reason" }, r.reason || ""),
      h("td", { class: "message" }, r.message || ""),
      h("td", {}, h("button", { class: "explain-btn", "data-job": r.job_id, onclick: () => toggleExplain(r.job_id) },
        open ? "hide" : "explain"))));
    if (open) rows.push(h("tr", { class: "explain-row" }, h("td", { colspan: 9 }, renderExplain(r.job_id))));
  }
  if (!q.pending.length) rows.push(h("tr", {}, h("td", { colspan: 9, class: "model" }, "nothing pending")));
  fill(document.querySelector("#pending tbody"), ...rows);
  fill(document.querySelector("#holding tbody"), ...q.holding.map((r) => h("tr", { "data-job": r.job_id },
    h("td", {}, jobLink(r.job_id, r.colour)), h("td", {}, r.name), h("td", {}, r.queue), h("td", {}, r.user),
    h("td", {}, r.st), h("td", {}, r.gpus), h("td", {}, r.time), h("td", {}, r.where))));
  renderReservations(q.reservations || []);
}

// Advance reservations active or to come (oneplus reservation list), with the pending jobs waiting on each.
function renderReservations(list) {
  document.getElementById("reservations-count").textContent = `(${list.length})`;
  const admits = (r) => [r.users && `users ${r.users}`, r.teams && `teams ${r.teams}`,
    r.accounts && `accounts ${r.accounts}`].filter(Boolean).join("; ");
  const rows = list.map((r) => h("tr", { "data-reservation": r.name, class: "reservation-row" },
    h("td", {}, r.name), h("td", { class: "reservation-state" }, r.state), h("td", {}, r.nodes),
    h("td", {}, r.gpus == null ? "" : String(r.gpus)), h("td", {}, r.start), h("td", {}, r.end),
    h("td", {}, admits(r)), h("td", {}, r.maint ? "maint" : ""), h("td", { class: "waiting" }, String(r.waiting))));
  if (!list.length) rows.push(h("tr", {}, h("td", { colspan: 9, class: "model" }, "no reservation active or to come")));
  fill(document.querySelector("#reservations tbody"), ...rows);
}

// ---- job -------------------------------------------------------------------------------------------

function renderJob(v) {
  const j = v.job;
  const spec = j.spec;
  fill(document.getElementById("job-head"),
    h("h2", { "data-job": j.job_id }, h("span", { class: "swatch big", style: `background:${v.colour}` }), j.job_id,
      " ", h("span", { class: "badge job-state", "data-state": j.state }, j.state)),
    h("p", {}, `${spec.name} · team ${spec.team} · user ${spec.user} · queue ${spec.queue} · priority ${spec.priority}` +
      ` · attempt ${j.attempt} · token ${j.token ?? "-"} · preemptions ${j.preemptions}`),
    j.reason ? h("p", { class: "reason" }, j.reason) : null);
  const p = v.placement;
  fill(document.getElementById("job-placement"),
    p.ranks.length
      ? h("div", {},
        h("p", {}, `${p.ranks.length} rank${p.ranks.length === 1 ? "" : "s"} in one ${p.domain} · ${ringWords(p)} · ${p.solver}` +
          (v.holding ? "" : " (last placement; GPUs no longer held)")),
        h("table", { class: "rows placement" }, h("thead", {}, h("tr", {}, h("th", {}, "rank"), h("th", {}, "node"), h("th", {}, "GPUs"))),
          h("tbody", {}, p.ranks.map((r) => h("tr", { "data-rank": r.rank }, h("td", {}, r.rank), h("td", {}, r.node),
            h("td", {}, r.gpus.join(", ") + (r.gpu_milli ? ` (${r.gpu_milli / 10}% each)` : "")))))))
      : v.pending ? renderPending(j, v.pending) : h("p", { class: "model" }, "not placed"));
  // The nodes it runs on, from the cluster picture, with its GPUs lit and the rest dimmed.
  const map = state.cluster && p.nodes.length
    ? renderTree(state.cluster, pruneTree(state.cluster.tree || [], p.nodes), j.job_id) : [];
  fill(document.getElementById("job-map"), ...map);
  fill(document.getElementById("job-timeline"), ...v.timeline.map((m) =>
    h("li", { "data-step": m.step }, h("b", {}, m.step), ` ${fmtTime(m.ts)} `, h("span", { class: "model" }, `+${m.after_s}s`))));
  fill(document.querySelector("#job-events tbody"), ...v.events.map((e) =>
    h("tr", { "data-type": e.type, class: "event" }, h("td", {}, e.seq ?? ""), h("td", {}, fmtTime(e.ts)),
      h("td", {}, e.after_s ?? ""), h("td", {}, h("b", {}, e.type)), h("td", { class: "message" }, e.summary))));
}

// ---- node ------------------------------------------------------------------------------------------

function holderCell(holders, jobs) {
  if (!holders.length) return h("span", { class: "model" }, "free");
  return holders.map((hd) => [jobLink(hd.job_id, (jobs[hd.job_id] || {}).colour), ` rank ${hd.rank} · ${hd.state} `]);
}

// A node's page: where it sits in the level tree, its GPUs, and each GPU's MIG mode and instances with their holders.
function renderNodePage(v) {
  const n = v.node;
  const status = n.cordoned ? "cordoned" : n.draining ? "draining" : n.status;
  fill(document.getElementById("node-head"),
    h("h2", { "data-node": n.name }, n.name, " ", h("span", { class: "badge st-" + status, title: n.reason || "" }, status)),
    h("p", {}, `${n.gpu_model} · ${n.total} GPUs · ${n.held} held · ${n.free} free` +
      (n.mig ? ` · ${n.mig} split into MIG instances, none held` : "")),
    h("p", { class: "path" }, v.path.length ? v.path.map((p, i) => [i ? " → " : "",
      h("span", { class: "path-step", "data-level": p.level, "data-group": p.name },
        h("span", { class: "level" }, LEVEL_WORDS[p.level] || p.level), ` ${p.name} (${p.gpus_in_use}/${p.gpus} GPUs in use)`)])
      : h("span", { class: "model" }, "in no named domain")));
  fill(document.getElementById("node-card"), renderNode(n, v.jobs, null));
  const rows = [];
  for (const g of n.mig_layout) {
    if (!g.mig_enabled) {
      rows.push(h("tr", { class: "mig-gpu off", "data-gpu": g.index }, h("td", {}, g.index), h("td", {}, "disabled"),
        h("td", { colspan: 4, class: "model" }, "whole GPU")));
      continue;
    }
    if (!g.instances.length) {
      rows.push(h("tr", { class: "mig-gpu", "data-gpu": g.index }, h("td", {}, g.index), h("td", {}, "enabled"),
        h("td", { colspan: 4, class: "model" }, "no instance created")));
    }
    g.instances.forEach((m, k) => rows.push(h("tr", { class: "mig-instance", "data-gpu": g.index, "data-uuid": m.uuid,
      "data-profile": m.profile, "data-job": m.job_id },
    h("td", {}, k ? "" : g.index), h("td", {}, k ? "" : "enabled"),
    h("td", {}, m.device), h("td", {}, m.profile), h("td", { class: "uuid" }, m.uuid), h("td", {}, holderCell(m.holders, v.jobs)))));
  }
  const sec = document.getElementById("node-mig");
  sec.hidden = !n.mig_layout.length;
  fill(document.querySelector("#node-mig tbody"), ...rows);
}

// ---- loop ------------------------------------------------------------------------------------------

async function refresh() {
  if (state.busy) return;
  state.busy = true;
  const r = route();
  try {
    if (r.view === "cluster") {
      state.cluster = await api("cluster");
      renderCluster(state.cluster);
    } else if (r.view === "queue") {
      state.queue = await api("queue");
      renderQueue(state.queue);
    } else if (r.view === "node") {
      state.node = await api("node/" + encodeURIComponent(r.id));
      renderNodePage(state.node);
    } else {
      const [job, cluster] = await Promise.all([api("job/" + encodeURIComponent(r.id)), api("cluster")]);
      state.cluster = cluster;
      state.job = job;
      renderJob(job);
    }
    setError("");
    setLive(true, Date.now() / 1000);
  } catch (e) {
    setError(String(e.message || e));
    setLive(false);
  } finally {
    state.busy = false;
  }
}

function show() {
  const r = route();
  for (const v of ["cluster", "queue", "job", "node"]) document.getElementById("view-" + v).hidden = v !== r.view;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.nav === r.view);
  document.body.dataset.view = r.view;
  refresh();
}

document.getElementById("job-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const id = document.getElementById("job-input").value.trim();
  if (id) location.hash = "#/job/" + encodeURIComponent(id);
});
window.addEventListener("hashchange", show);
show();
state.timer = setInterval(refresh, POLL_MS);
