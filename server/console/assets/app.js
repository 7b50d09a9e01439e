// Berth console. Polls the admin JSON of the node that served it and
// draws everything with the DOM and SVG; no library, nothing fetched from
// anywhere else. Names from the broker are always set as text, never
// parsed as HTML.
"use strict";

(function () {
  const POLL_MS = 2000;        // status and queue stats
  const CONN_POLL_MS = 4000;   // connections (each costs a callback per connection on the event loops)
  const INFO_POLL_MS = 30000;  // build info and uptime
  const WINDOW_MS = 5 * 60 * 1000; // the charts show the last five minutes
  const RING_MAX = Math.ceil(WINDOW_MS / POLL_MS) + 10;
  const ACTION_HEADER = "X-Berth-Action";

  const $ = (id) => document.getElementById(id);

  // A bounded ring of chart points, oldest first.
  class Ring {
    constructor(max) { this.max = max; this.items = []; }
    push(p) {
      this.items.push(p);
      if (this.items.length > this.max) this.items.splice(0, this.items.length - this.max);
    }
    clear() { this.items = []; }
  }

  const state = {
    paused: false,
    role: "",
    queues: [],            // rows of the last /v1/queues/stats, with rates
    prev: null,            // previous stats answer, for rates
    sortKey: "name",
    sortDir: 1,
    filter: "",
    chartQueue: "",        // "" = totals
    ring: new Ring(RING_MAX),      // totals
    queueRing: new Ring(RING_MAX), // the selected queue
    info: null,
    infoAt: 0,
    renders: 0,
  };

  // ---- formatting ----
  const nf = new Intl.NumberFormat("en-US");
  function plural(n, what) { return n + " " + what + (n === 1 ? "" : "s"); }
  function fmtInt(n) { return n == null ? "–" : nf.format(n); }
  function fmtRate(r) {
    if (r == null || !isFinite(r)) return "–";
    if (r === 0) return "0";
    if (r < 10) return r.toFixed(1);
    return nf.format(Math.round(r));
  }
  function fmtShort(v) {
    const a = Math.abs(v);
    if (a >= 1e9) return trim(v / 1e9) + "G";
    if (a >= 1e6) return trim(v / 1e6) + "M";
    if (a >= 1e3) return trim(v / 1e3) + "k";
    return trim(v);
  }
  function trim(v) { return (Math.round(v * 10) / 10).toString(); }
  function fmtBytes(b) {
    if (b == null) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
    return (i === 0 ? b : b.toFixed(b < 10 ? 1 : 0)) + " " + units[i];
  }
  function fmtDuration(s) {
    s = Math.max(0, Math.floor(s));
    const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60), sec = s % 60;
    if (d) return d + "d " + h + "h";
    if (h) return h + "h " + m + "m";
    if (m) return m + "m " + sec + "s";
    return sec + "s";
  }
  function fmtMs(ms) {
    if (ms == null) return "–";
    if (ms < 1000) return ms + " ms";
    return fmtDuration(ms / 1000) + " ago";
  }

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    if (attrs) for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text != null) e.textContent = text;
    return e;
  }
  function setText(id, text) { $(id).textContent = text; }

  function toast(msg, isError) {
    const t = el("div", { class: "toast" + (isError ? " error" : "") }, msg);
    $("toasts").appendChild(t);
    setTimeout(() => t.remove(), isError ? 8000 : 4000);
  }

  // ---- HTTP ----
  async function getJSON(path) {
    const r = await fetch(path, { cache: "no-store" });
    if (!r.ok) throw new Error(path + ": " + r.status + " " + (await r.text()).trim());
    return r.json();
  }
  async function action(path, body) {
    const r = await fetch(path, {
      method: "POST",
      headers: { "Content-Type": "application/json", [ACTION_HEADER]: "console" },
      body: JSON.stringify(body),
    });
    let out = {};
    try { out = await r.json(); } catch (e) { out = { error: r.status + " " + r.statusText }; }
    if (!r.ok) throw new Error(out.error || (r.status + " " + r.statusText));
    return out;
  }

  // ---- polling ----
  let statusFails = 0;
  // One poll at a time, so a slow broker does not pile requests up; a
  // poll asked for meanwhile (after an action) runs when it ends.
  let polling = false, pollAgain = false;
  async function pollMain() {
    if (state.paused) return;
    if (polling) { pollAgain = true; return; }
    polling = true;
    try {
      const [status, stats] = await Promise.all([
        getJSON("../v1/status"),
        state.role === "controller" ? Promise.resolve(null) : getJSON("../v1/queues/stats").catch((e) => ({ error: e })),
      ]);
      renderStatus(status);
      if (stats && !stats.error) {
        takeStats(stats);
      } else if (stats && stats.error) {
        pushGap();
      }
      statusFails = 0;
      const ps = $("poll-state");
      ps.classList.remove("error");
      ps.textContent = "live · updated " + new Date().toLocaleTimeString();
    } catch (e) {
      statusFails++;
      pushGap();
      const ps = $("poll-state");
      ps.classList.add("error");
      ps.textContent = "cannot reach the broker (" + statusFails + ")";
    } finally {
      polling = false;
    }
    drawCharts();
    if (pollAgain) {
      pollAgain = false;
      pollMain();
    }
  }

  async function pollInfo() {
    try {
      state.info = await getJSON("../v1/info");
      state.infoAt = Date.now();
      renderInfo();
    } catch (e) { /* the main poll reports the broker unreachable */ }
  }

  async function pollConnections() {
    if (state.paused || state.role === "controller") return;
    try {
      renderConnections(await getJSON("../v1/connections"));
    } catch (e) { /* shown by the main poll */ }
  }

  function every(ms, f) {
    f();
    setInterval(f, ms);
  }

  // ---- overview ----
  function renderStatus(st) {
    state.role = st.role || "broker";
    document.body.classList.toggle("controller-only", state.role === "controller");
    setText("hdr-server", st.server + (st.clients ? " · " + st.clients : ""));
    const badge = $("hdr-ready");
    badge.textContent = st.ready ? "ready" : "not ready";
    badge.className = "badge " + (st.ready ? "ok" : "bad");
    badge.title = st.unready ? st.unready.join("\n") : "";
    setText("ov-server", st.server);
    let role = state.role;
    if (st.broker_id) role += " · broker id " + st.broker_id + (st.broker_registered ? "" : " (unregistered)");
    setText("ov-role", role);
    const c = st.controller;
    if (!c) {
      setText("ov-leader", "none");
      setText("ov-term", "no controller: wiring in a local file");
    } else if (!c.leader) {
      setText("ov-leader", "no leader");
      setText("ov-term", "term " + c.term + " · this member " + c.id);
    } else {
      setText("ov-leader", "member " + c.leader);
      setText("ov-term", (c.is_leader ? "this node · " : "") + "term " + c.term + " · applied " + fmtInt(c.applied));
    }
    setText("ov-conns", st.connections == null ? "–" : fmtInt(st.connections));
    setText("ov-shards", st.shards ? plural(st.shards, "shard") + " · " + plural(st.loops, "event loop") : "");
  }

  function renderInfo() {
    const i = state.info;
    if (!i) return;
    const up = i.uptime_seconds + (Date.now() - state.infoAt) / 1000;
    setText("ov-uptime", fmtDuration(up));
    const b = i.build || {};
    let v = b.version || "unknown";
    if (b.revision) v += " " + b.revision.slice(0, 12) + (b.modified ? "+" : "");
    setText("ov-version", v + " · " + (b.go || ""));
  }

  // ---- queues ----
  function takeStats(stats) {
    const prev = state.prev;
    const dt = prev ? (stats.time_ms - prev.time_ms) / 1000 : 0;
    const before = new Map();
    if (prev) for (const q of prev.queues) before.set(q.name, q);
    const rate = (now, was) => (dt > 0 && was != null && now >= was) ? (now - was) / dt : null;
    for (const q of stats.queues) {
      const p = before.get(q.name);
      q.pubRate = p ? rate(q.published, p.published) : null;
      q.delRate = p ? rate(q.delivered, p.delivered) : null;
      q.accRate = p ? rate(q.accepted, p.accepted) : null;
    }
    // The totals' rates are the queues' summed, over the queues in both
    // samples: a deleted queue takes its counters with it and must not
    // show as a negative rate.
    const t = stats.totals;
    const totalRates = { pub: null, del: null, acc: null };
    if (prev && dt > 0) {
      totalRates.pub = totalRates.del = totalRates.acc = 0;
      for (const q of stats.queues) {
        if (q.pubRate == null) continue;
        totalRates.pub += q.pubRate;
        totalRates.del += q.delRate;
        totalRates.acc += q.accRate;
      }
    }
    state.prev = stats;
    state.queues = stats.queues;
    clockSkew = stats.time_ms - Date.now();

    state.ring.push({ t: stats.time_ms, pub: totalRates.pub, del: totalRates.del, acc: totalRates.acc, ready: t.ready, unacked: t.unacked });
    if (state.chartQueue) {
      const q = stats.queues.find((x) => x.name === state.chartQueue);
      state.queueRing.push(q
        ? { t: stats.time_ms, pub: q.pubRate, del: q.delRate, acc: q.accRate, ready: q.ready, unacked: q.unacked }
        : { t: stats.time_ms, gap: true });
    }

    setText("ov-queues", fmtInt(t.queues));
    setText("ov-msgs", fmtInt(t.depth) + " messages · " + fmtBytes(t.bytes));
    setText("ov-rates", [totalRates.pub, totalRates.del, totalRates.acc].map(fmtRate).join(" · "));
    renderQueues();
    updateQueueSelect();
  }

  // pushGap breaks the chart lines where a poll failed. Points carry the
  // server's clock; clockSkew maps the local one to it.
  let clockSkew = 0;
  function pushGap() {
    const t = Date.now() + clockSkew;
    state.ring.push({ t, gap: true });
    if (state.chartQueue) state.queueRing.push({ t, gap: true });
    state.prev = null;
  }

  function sortValue(q, key) {
    if (key === "name") return q.name;
    if (key === "durable") return q.durable ? 1 : 0;
    const v = q[key];
    return v == null ? -1 : v;
  }

  function renderQueues() {
    const f = state.filter.toLowerCase();
    const rows = state.queues.filter((q) => !f || q.name.toLowerCase().includes(f));
    const k = state.sortKey, dir = state.sortDir;
    rows.sort((a, b) => {
      const x = sortValue(a, k), y = sortValue(b, k);
      if (x < y) return -dir;
      if (x > y) return dir;
      return a.name < b.name ? -1 : a.name > b.name ? 1 : 0;
    });
    const tbody = document.querySelector("#queue-table tbody");
    const frag = document.createDocumentFragment();
    for (const q of rows) {
      const tr = el("tr", { "data-queue": q.name });
      if (q.name === state.chartQueue) tr.className = "selected";
      const name = el("td", { class: "text name", "data-col": "name", title: q.name }, q.name);
      tr.appendChild(name);
      const dur = el("td", { class: "text", "data-col": "durable" });
      if (q.durable) dur.appendChild(el("span", { class: "tag" }, "durable"));
      tr.appendChild(dur);
      const num = (col, v, text) => {
        const td = el("td", { "data-col": col }, text);
        if (v === 0) td.classList.add("zero");
        tr.appendChild(td);
      };
      num("depth", q.depth, fmtInt(q.depth));
      num("ready", q.ready, fmtInt(q.ready));
      num("unacked", q.unacked, fmtInt(q.unacked));
      num("consumers", q.consumers, fmtInt(q.consumers));
      tr.appendChild(el("td", { "data-col": "owner", title: "the broker that hands this replicated queue's messages out" }, q.owner ? String(q.owner) : "-"));
      num("pubRate", q.pubRate, fmtRate(q.pubRate));
      num("delRate", q.delRate, fmtRate(q.delRate));
      num("accRate", q.accRate, fmtRate(q.accRate));
      num("bytes", q.bytes, fmtBytes(q.bytes));
      const act = el("td", { class: "actions" });
      const chart = el("button", { type: "button", class: "small outline", "data-action": "chart", title: "chart this queue" }, "Chart");
      const purge = el("button", { type: "button", class: "small outline-danger", "data-action": "purge" }, "Purge");
      const del = el("button", { type: "button", class: "small outline-danger", "data-action": "delete" }, "Delete");
      act.append(chart, purge, del);
      tr.appendChild(act);
      frag.appendChild(tr);
    }
    tbody.replaceChildren(frag);
    $("queue-empty").hidden = rows.length > 0;
    $("queue-empty").textContent = state.queues.length ? "No queue matches the filter." : "No queues.";
    setText("queue-count", rows.length === state.queues.length ? String(rows.length) : rows.length + " of " + state.queues.length);
    for (const th of document.querySelectorAll("#queue-table th[data-sort]")) {
      if (th.dataset.sort === k) th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    }
    state.renders++;
    tbody.dataset.renders = String(state.renders);
  }

  function updateQueueSelect() {
    const sel = $("chart-queue");
    const names = state.queues.map((q) => q.name);
    const have = Array.from(sel.options).slice(1).map((o) => o.value);
    if (have.length === names.length && have.every((n, i) => n === names[i])) return;
    const frag = document.createDocumentFragment();
    frag.appendChild(el("option", { value: "" }, "all queues"));
    for (const n of names) frag.appendChild(el("option", { value: n }, n));
    if (state.chartQueue && !names.includes(state.chartQueue)) {
      frag.appendChild(el("option", { value: state.chartQueue }, state.chartQueue + " (gone)"));
    }
    sel.replaceChildren(frag);
    sel.value = state.chartQueue;
  }

  function selectChartQueue(name) {
    if (name === state.chartQueue) return;
    state.chartQueue = name;
    state.queueRing.clear();
    $("chart-queue").value = name;
    renderQueues();
    drawCharts();
  }

  // ---- connections ----
  function renderConnections(data) {
    const rows = data.connections || [];
    const tbody = document.querySelector("#conn-table tbody");
    const frag = document.createDocumentFragment();
    for (const c of rows) {
      const tr = el("tr", { "data-addr": c.addr });
      tr.appendChild(el("td", { class: "text name" }, c.addr));
      tr.appendChild(el("td", null, c.session ? String(c.session) : "–"));
      tr.appendChild(el("td", { class: "text" }, c.protocol || "before HELLO"));
      tr.appendChild(el("td", { "data-col": "consumers" }, c.consumers == null ? "?" : fmtInt(c.consumers)));
      tr.appendChild(el("td", null, c.heartbeat_ms ? (c.heartbeat_ms / 1000) + " s" : "–"));
      tr.appendChild(el("td", null, fmtMs(c.idle_ms)));
      frag.appendChild(tr);
    }
    tbody.replaceChildren(frag);
    $("conn-empty").hidden = rows.length > 0;
    setText("conn-count", data.total > rows.length ? rows.length + " of " + data.total : String(rows.length));
  }

  // ---- charts: hand-drawn SVG ----
  const SVGNS = "http://www.w3.org/2000/svg";
  function svgEl(tag, attrs) {
    const e = document.createElementNS(SVGNS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }
  // niceStep is the smallest 1, 2 or 5 times a power of ten that covers
  // v in at most four steps.
  function niceStep(v) {
    if (!(v > 0)) return 1;
    const raw = v / 4, p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * p >= raw) return Math.max(m * p, 1);
    return 10 * p;
  }

  const RATE_SERIES = [
    { key: "pub", label: "publish", color: "#1f6feb" },
    { key: "del", label: "deliver", color: "#8250df" },
    { key: "acc", label: "accept", color: "#1a7f37", dash: "5 4" }, // dashed: often equal to deliver
  ];
  const DEPTH_SERIES = [
    { key: "ready", label: "ready", color: "#d97706", area: true },
    { key: "unacked", label: "unacked", color: "#c62f2f" },
  ];

  function drawChart(svg, legend, points, series, unit) {
    const W = Math.max(svg.clientWidth || 0, 300), H = svg.clientHeight || 190;
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    const L = 46, R = 10, T = 8, B = 20;
    const pw = W - L - R, ph = H - T - B;
    const tEnd = points.length ? points[points.length - 1].t : Date.now();
    const tStart = tEnd - WINDOW_MS;
    const visible = points.filter((p) => p.t >= tStart);
    let max = 0;
    for (const p of visible) for (const s of series) if (!p.gap && p[s.key] != null) max = Math.max(max, p[s.key]);
    const step = niceStep(max), ticks = Math.max(1, Math.ceil(max / step)), yMax = step * ticks;
    const x = (t) => L + (t - tStart) / WINDOW_MS * pw;
    const y = (v) => T + ph - v / yMax * ph;
    const kids = [];
    for (let i = 0; i <= ticks; i++) {
      const v = step * i, yy = y(v);
      kids.push(svgEl("line", { class: "grid", x1: L, x2: W - R, y1: yy, y2: yy }));
      const lab = svgEl("text", { class: "axis", x: L - 6, y: yy + 3, "text-anchor": "end" });
      lab.textContent = fmtShort(v);
      kids.push(lab);
    }
    for (let m = 0; m <= 5; m++) {
      const t = tStart + m * 60000;
      const lab = svgEl("text", { class: "axis", x: x(t), y: H - 5, "text-anchor": m === 0 ? "start" : m === 5 ? "end" : "middle" });
      lab.textContent = m === 5 ? "now" : "−" + (5 - m) + " min";
      kids.push(lab);
    }
    let any = false;
    for (const s of series) {
      // Segments break at gaps (a failed poll, a missing rate).
      let d = "", area = "", segStart = null, lastX = null, pen = false;
      const closeArea = () => {
        if (segStart != null) area += "L" + lastX.toFixed(1) + " " + (T + ph) + "L" + segStart.toFixed(1) + " " + (T + ph) + "Z";
        segStart = null;
      };
      for (const p of visible) {
        const v = p.gap ? null : p[s.key];
        if (v == null) { pen = false; closeArea(); continue; }
        const px = x(p.t).toFixed(1), py = y(v).toFixed(1);
        if (!pen) {
          d += "M" + px + " " + py;
          if (s.area) { area += "M" + px + " " + (T + ph) + "L" + px + " " + py; segStart = +px; }
        } else {
          d += "L" + px + " " + py;
          if (s.area) area += "L" + px + " " + py;
        }
        lastX = +px;
        pen = true;
        any = true;
      }
      if (s.area) closeArea();
      if (s.area && area) kids.push(svgEl("path", { class: "area", d: area, fill: s.color }));
      if (d) {
        const path = svgEl("path", { class: "series", d: d, stroke: s.color, "data-series": s.key });
        if (s.dash) path.setAttribute("stroke-dasharray", s.dash);
        kids.push(path);
      }
    }
    if (!any) {
      const t = svgEl("text", { class: "nodata", x: L + pw / 2, y: T + ph / 2, "text-anchor": "middle" });
      t.textContent = "collecting samples…";
      kids.push(t);
    }
    svg.replaceChildren(...kids);

    const last = visible.length ? visible[visible.length - 1] : null;
    const lf = document.createDocumentFragment();
    for (const s of series) {
      const span = el("span");
      const sw = el("i");
      sw.style.background = s.color;
      span.append(sw, s.label + " ");
      const v = last && !last.gap ? last[s.key] : null;
      span.appendChild(el("b", null, unit === "rate" ? fmtRate(v) : fmtInt(v)));
      lf.appendChild(span);
    }
    legend.replaceChildren(lf);
  }

  function drawCharts() {
    const pts = state.chartQueue ? state.queueRing.items : state.ring.items;
    drawChart($("chart-rates"), $("legend-rates"), pts, RATE_SERIES, "rate");
    drawChart($("chart-depth"), $("legend-depth"), pts, DEPTH_SERIES, "count");
    setText("chart-window", (state.chartQueue ? state.chartQueue + " · " : "all queues · ") + "last 5 min");
  }

  // ---- confirmation dialog ----
  function confirmDialog(title, text, okLabel) {
    const dlg = $("confirm");
    setText("confirm-title", title);
    setText("confirm-text", text);
    setText("confirm-ok", okLabel);
    return new Promise((resolve) => {
      const done = (v) => {
        $("confirm-ok").onclick = $("confirm-cancel").onclick = null;
        dlg.onclose = null;
        if (dlg.open) dlg.close();
        resolve(v);
      };
      $("confirm-ok").onclick = () => done(true);
      $("confirm-cancel").onclick = () => done(false);
      dlg.onclose = () => done(false); // Escape
      dlg.showModal();
      $("confirm-cancel").focus();
    });
  }

  // ---- actions ----
  async function purgeQueue(name) {
    const q = state.queues.find((x) => x.name === name);
    const n = q ? fmtInt(q.ready) + " ready message" + (q.ready === 1 ? "" : "s") : "its ready messages";
    if (!await confirmDialog("Purge queue “" + name + "”?", "This drops " + n + ". Messages delivered and not yet settled stay. It cannot be undone.", "Purge")) return;
    try {
      const out = await action("../v1/queues/purge", { name });
      toast("Purged " + fmtInt(out.purged) + " messages from " + name);
    } catch (e) {
      toast("Purge " + name + ": " + e.message, true);
    }
    pollMain();
  }

  async function deleteQueue(name) {
    const q = state.queues.find((x) => x.name === name);
    let detail = "The queue and every message in it go";
    if (q) detail += " (" + fmtInt(q.depth) + " messages" + (q.consumers ? ", " + q.consumers + " consumers cancelled" : "") + ")";
    if (!await confirmDialog("Delete queue “" + name + "”?", detail + ". It cannot be undone.", "Delete")) return;
    try {
      const out = await action("../v1/queues/delete", { name });
      toast("Deleted " + name + " (" + fmtInt(out.dropped) + " messages dropped)");
      if (state.chartQueue === name) selectChartQueue("");
    } catch (e) {
      toast("Delete " + name + ": " + e.message, true);
    }
    pollMain();
  }

  async function declareQueue(ev) {
    ev.preventDefault();
    const name = $("declare-name").value.trim();
    if (!name) return;
    const body = { name, durable: $("declare-durable").checked, overflow: $("declare-overflow").value };
    const maxlen = $("declare-maxlen").value, ttl = $("declare-ttl").value;
    if (maxlen !== "") body.max_length = Number(maxlen);
    if (ttl !== "") body.message_ttl_ms = Number(ttl);
    const btn = $("declare-submit");
    btn.disabled = true;
    try {
      await action("../v1/queues/declare", body);
      toast("Declared " + (body.durable ? "durable " : "") + "queue " + name);
      $("declare-name").value = "";
      $("declare-durable").checked = false;
    } catch (e) {
      toast("Declare " + name + ": " + e.message, true);
    } finally {
      btn.disabled = false;
    }
    pollMain();
  }

  // ---- wiring ----
  function init() {
    $("queue-filter").addEventListener("input", (e) => { state.filter = e.target.value; renderQueues(); });
    for (const th of document.querySelectorAll("#queue-table th[data-sort]")) {
      th.addEventListener("click", () => {
        const k = th.dataset.sort;
        if (state.sortKey === k) state.sortDir = -state.sortDir;
        else { state.sortKey = k; state.sortDir = k === "name" || k === "durable" ? 1 : -1; }
        renderQueues();
      });
    }
    document.querySelector("#queue-table tbody").addEventListener("click", (e) => {
      const btn = e.target.closest("button[data-action]");
      if (!btn) return;
      const name = btn.closest("tr").dataset.queue;
      switch (btn.dataset.action) {
        case "purge": purgeQueue(name); break;
        case "delete": deleteQueue(name); break;
        case "chart": selectChartQueue(state.chartQueue === name ? "" : name); break;
      }
    });
    $("chart-queue").addEventListener("change", (e) => selectChartQueue(e.target.value));
    $("declare-form").addEventListener("submit", declareQueue);
    $("pause").addEventListener("click", () => {
      state.paused = !state.paused;
      $("pause").textContent = state.paused ? "Resume" : "Pause";
      setText("poll-state", state.paused ? "paused" : "resuming…");
      if (!state.paused) { state.prev = null; pollMain(); }
    });
    window.addEventListener("resize", drawCharts);
    every(POLL_MS, pollMain);
    every(CONN_POLL_MS, pollConnections);
    every(INFO_POLL_MS, pollInfo);
    setInterval(renderInfo, 1000);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
