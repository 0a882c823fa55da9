// embedfleet report: draws the figures of the JSON block `report-data` as inline SVG. No
// library, no network. Every value from the run (job ids, hosts, queues, log lines) is set as
// text (textContent, <title>), never parsed as HTML.
(function () {
  "use strict";
  var errorCount = 0;
  window.addEventListener("error", function (e) {
    errorCount += 1;
    document.body.setAttribute("data-js-errors", String(errorCount));
    var box = document.getElementById("js-errors");
    var p = document.createElement("p");
    p.textContent = "script error: " + e.message;
    box.appendChild(p);
  });
  var began = performance.now();
  var D = JSON.parse(document.getElementById("report-data").textContent);
  var NS = "http://www.w3.org/2000/svg";

  function el(name, attrs, parent) {
    var node = document.createElementNS(NS, name);
    for (var k in attrs) { node.setAttribute(k, attrs[k]); }
    if (parent) { parent.appendChild(node); }
    return node;
  }
  function label(parent, x, y, s, anchor) {
    var t = el("text", { x: x, y: y, "text-anchor": anchor || "start" }, parent);
    t.textContent = s;
    return t;
  }
  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } }
  function dur(s) {
    if (s === null || s === undefined) { return "-"; }
    if (s < 60) { return s.toFixed(1) + " s"; }
    if (s < 3600) { return (s / 60).toFixed(1) + " min"; }
    if (s < 172800) { return (s / 3600).toFixed(1) + " h"; }
    return (s / 86400).toFixed(1) + " d";
  }
  function num(v, digits) { return v.toLocaleString("en", { maximumFractionDigits: digits || 0 }); }
  function axis(g, x0, x1, y, lo, hi, fmt, ticks) {
    el("line", { x1: x0, x2: x1, y1: y, y2: y, stroke: "#8892a6" }, g);
    for (var i = 0; i <= ticks; i++) {
      var x = x0 + (x1 - x0) * i / ticks;
      el("line", { x1: x, x2: x, y1: y, y2: y + 4, stroke: "#8892a6" }, g);
      label(g, x, y + 15, fmt(lo + (hi - lo) * i / ticks), i === 0 ? "start" : i === ticks ? "end" : "middle");
    }
  }

  // Progress: papers embedded (left scale) and attempts running (right scale) over time.
  function drawProgress() {
    var svg = document.getElementById("progress");
    var pts = D.progress;
    if (!pts.length) { return; }
    var W = 1100, H = 220, L = 60, R = 90, T = 10, B = 28;
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    var tMax = Math.max(pts[pts.length - 1][0], 1);
    var pMax = Math.max(D.papers_planned, pts[pts.length - 1][1], 1);
    var rMax = Math.max.apply(null, pts.map(function (p) { return p[2]; }).concat([1]));
    var sx = function (t) { return L + (W - L - R) * t / tMax; };
    // Jobs running first, papers embedded over it: at the end of a run both reach the top, and
    // the papers are the line that matters.
    var curves = [["#3a78c9", function (p) { return p[2] / rMax; }], ["#3b8c4a", function (p) { return p[1] / pMax; }]];
    curves.forEach(function (spec) {
      // Steps: a value holds until the next point.
      var d = pts.map(function (p, i) {
        var x = sx(p[0]).toFixed(1), y = (T + (H - T - B) * (1 - spec[1](p))).toFixed(1);
        return i ? "H" + x + "V" + y : "M" + x + "," + y;
      }).join("");
      el("path", { d: d, fill: "none", stroke: spec[0], "stroke-width": 1.5 }, svg);
    });
    axis(svg, L, W - R, H - B, 0, tMax, dur, 6);
    label(svg, L - 4, T + 8, num(pMax), "end");
    label(svg, L - 4, H - B, "0", "end");
    // The right scale's top is the most jobs that ran at once, not what runs now.
    label(svg, W - R + 4, T + 8, "peak " + num(rMax)).setAttribute("id", "progress-peak");
    label(svg, W - R + 4, T + 22, "running");
  }

  // The timeline: one bar per job attempt, queued (light) then running (its outcome's colour),
  // in lanes per host or per queue, packed into rows where attempts overlap.
  var view = null;
  function laneKey(b, by) { return by === "queue" ? b.queue : (b.host || "(no host yet) " + b.queue); }
  function layout(by) {
    var lanes = {}, order = [];
    var now = (D.generated_unix_s - D.t0);
    D.bars.forEach(function (b, i) {
      var k = laneKey(b, by);
      if (!lanes[k]) { lanes[k] = { name: k, rows: [], items: [] }; order.push(k); }
      var from = b.submit !== null ? b.submit : (b.start !== null ? b.start : now);
      var to = b.end !== null ? b.end : now;
      var lane = lanes[k], row = 0;
      while (row < lane.rows.length && lane.rows[row] > from) { row++; }
      lane.rows[row] = to;
      lane.items.push({ i: i, row: row, from: from, to: Math.max(to, from) });
    });
    order.sort();
    // The whole run: to its last end (or now, while an attempt is open), not to the day the
    // page is read.
    var end = 1;
    order.forEach(function (k) { lanes[k].items.forEach(function (it) { end = Math.max(end, it.to); }); });
    return { lanes: order.map(function (k) { return lanes[k]; }), end: end };
  }
  function describe(b) {
    var lines = ["job " + b.job + (b.native_id ? " (" + b.native_id + ")" : ""),
      "batch " + b.batch + ", attempt " + b.attempt + ", " + b.outcome,
      "queue " + b.queue + ", host " + (b.host || "-")];
    if (b.submit !== null && b.start !== null) { lines.push("waited " + dur(b.start - b.submit)); }
    if (b.start !== null && b.end !== null) { lines.push("ran " + dur(b.end - b.start)); }
    return lines.join("\n");
  }
  function drawTimeline() {
    var svg = document.getElementById("timeline");
    var by = document.getElementById("lanes").value;
    var lay = layout(by);
    var W = 1100, L = 170, R = 10, T = 4, ROW = 5, GAP = 6;
    if (!view) { view = [0, lay.end]; }
    var y = T, info = document.getElementById("bar-info");
    clear(svg);
    var sx = function (t) { return L + (W - L - R) * (t - view[0]) / (view[1] - view[0]); };
    var bars = el("g", {}, null);
    lay.lanes.forEach(function (lane, li) {
      var h = Math.max(lane.rows.length, 1) * ROW;
      if (li % 2 === 0) { el("rect", { x: L, y: y - 2, width: W - L - R, height: h + 4, fill: "#f4f6f9" }, svg); }
      var name = lane.name.length > 26 ? lane.name.slice(0, 25) + "…" : lane.name;
      var t = label(svg, L - 6, y + Math.min(h, 10), name, "end");
      el("title", {}, t).textContent = lane.name;
      lane.items.forEach(function (it) {
        var b = D.bars[it.i];
        var g = el("g", { "class": "bar", "data-outcome": b.outcome, "data-batch": b.batch, "data-attempt": b.attempt }, bars);
        if (it.to < view[0] || it.from > view[1]) { g.setAttribute("visibility", "hidden"); }
        var yy = y + it.row * ROW, start = b.start !== null ? b.start : it.to;
        var x0 = Math.max(sx(it.from), L), x1 = Math.min(sx(it.to), W - R), xs = Math.min(Math.max(sx(start), L), W - R);
        if (xs > x0) { el("rect", { x: x0, y: yy, width: xs - x0, height: ROW - 1, "class": "queued" }, g); }
        el("rect", { x: xs, y: yy, width: Math.max(x1 - xs, 1), height: ROW - 1, "class": "o-" + b.outcome }, g);
        el("title", {}, g).textContent = describe(b);
        g.addEventListener("mouseover", function () { info.textContent = describe(b); });
      });
      y += h + GAP;
    });
    svg.appendChild(bars);
    axis(svg, L, W - R, y, view[0], view[1], dur, 8);
    svg.setAttribute("viewBox", "0 0 " + W + " " + (y + 22));
    svg.setAttribute("height", y + 22);
    return { x: sx, L: L, W: W, R: R };
  }
  function zoom(factor, center) {
    var span = view[1] - view[0], c = center === undefined ? view[0] + span / 2 : center;
    var s = Math.max(span * factor, 1);
    view = [c - (c - view[0]) * s / span, c + (view[1] - c) * s / span];
    drawTimeline();
  }
  function wireTimeline() {
    var svg = document.getElementById("timeline");
    document.getElementById("lanes").addEventListener("change", drawTimeline);
    document.getElementById("zoom-in").addEventListener("click", function () { zoom(0.5); });
    document.getElementById("zoom-out").addEventListener("click", function () { zoom(2); });
    document.getElementById("zoom-reset").addEventListener("click", function () { view = null; drawTimeline(); });
    svg.addEventListener("wheel", function (e) {
      e.preventDefault();
      var box = svg.getBoundingClientRect(), W = 1100, L = 170, R = 10;
      var x = (e.clientX - box.left) * W / box.width;
      var t = view[0] + (view[1] - view[0]) * (x - L) / (W - L - R);
      zoom(e.deltaY < 0 ? 0.8 : 1.25, t);
    }, { passive: false });
    var dragFrom = null;
    svg.addEventListener("mousedown", function (e) { dragFrom = [e.clientX, view.slice()]; });
    window.addEventListener("mouseup", function () { dragFrom = null; });
    window.addEventListener("mousemove", function (e) {
      if (!dragFrom) { return; }
      var box = svg.getBoundingClientRect();
      var dt = (e.clientX - dragFrom[0]) * 1100 / box.width * (dragFrom[1][1] - dragFrom[1][0]) / 920;
      view = [dragFrom[1][0] - dt, dragFrom[1][1] - dt];
      drawTimeline();
    });
  }

  // Start delay (submit to start) per queue: a histogram on fixed, roughly logarithmic bins.
  var EDGES = [0, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, Infinity];
  function drawDelays() {
    var box = document.getElementById("delays");
    D.queues.forEach(function (q) {
      var counts = EDGES.slice(1).map(function () { return 0; });
      q.start_delays_s.forEach(function (d) {
        for (var i = 0; i < counts.length; i++) { if (d < EDGES[i + 1]) { counts[i]++; break; } }
      });
      var W = 360, H = 150, L = 30, B = 34, bw = (W - L) / counts.length, top = Math.max.apply(null, counts.concat([1]));
      var svg = el("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, "class": "delay" }, box);
      label(svg, L, 12, "queue " + q.queue + ": start delay (" + q.start_delays_s.length + " started)");
      counts.forEach(function (c, i) {
        var h = (H - B - 20) * c / top;
        var r = el("rect", { x: L + i * bw + 1, y: H - B - h, width: bw - 2, height: h, fill: "#3a78c9" }, svg);
        el("title", {}, r).textContent = c + " attempts waited " + dur(EDGES[i]) + " to " + (EDGES[i + 1] === Infinity ? "more" : dur(EDGES[i + 1]));
        if (i % 2 === 0) { label(svg, L + i * bw + bw / 2, H - B + 13, dur(EDGES[i]).replace(".0", ""), "middle"); }
      });
      label(svg, L - 4, 24, String(top), "end");
    });
  }

  // Throughput per host: papers/s as bars, tokens/s as text.
  function drawHosts() {
    var svg = document.getElementById("hosts");
    if (!D.hosts.length) { return; }
    var W = 1100, L = 170, ROW = 16, H = D.hosts.length * ROW + 8;
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    svg.setAttribute("height", H);
    var top = Math.max.apply(null, D.hosts.map(function (h) { return h.papers_per_s; }).concat([1e-9]));
    D.hosts.forEach(function (h, i) {
      var y = 4 + i * ROW;
      label(svg, L - 6, y + 11, h.host, "end");
      var w = (W - L - 260) * h.papers_per_s / top;
      var r = el("rect", { x: L, y: y + 2, width: Math.max(w, 1), height: ROW - 5, fill: "#3b8c4a" }, svg);
      el("title", {}, r).textContent = h.host + ": " + h.runs + " runs";
      label(svg, L + w + 6, y + 11, num(h.papers_per_s, 2) + " papers/s, " + num(h.tokens_per_s) + " tokens/s");
    });
  }

  // Table 2: where a batch's time goes, as one stacked bar.
  function drawBreakdown() {
    var svg = document.getElementById("breakdown");
    var b = D.breakdown;
    if (!b) { return; }
    var parts = [["model load", b.model_load_s, "#8e44ad"], ["I/O", b.io_s, "#e39b2d"], ["tokenise", b.tokenize_s, "#3a78c9"], ["infer", b.inference_s, "#3b8c4a"]];
    var sum = parts.reduce(function (a, p) { return a + p[1]; }, 0) || 1;
    var W = 1100, x = 10;
    svg.setAttribute("viewBox", "0 0 " + W + " 50");
    parts.forEach(function (p) {
      var w = (W - 20) * p[1] / sum;
      var r = el("rect", { x: x, y: 4, width: w, height: 22, fill: p[2] }, svg);
      el("title", {}, r).textContent = p[0] + ": " + p[1].toFixed(2) + " s per batch";
      if (w > 70) { label(svg, x + 4, 42, p[0] + " " + (100 * p[1] / sum).toFixed(0) + " %"); }
      x += w;
    });
  }

  // Eval: recall against p95 latency, a point per search setting.
  function drawEval() {
    var svg = document.getElementById("eval-plot");
    if (!svg || !D.eval || !D.eval.rows.length) { return; }
    var rows = D.eval.rows, W = 600, H = 220, L = 50, R = 20, T = 10, B = 30;
    var xMax = Math.max.apply(null, rows.map(function (r) { return r.latency.p95_ms; })) * 1.1 || 1;
    var yMin = Math.min.apply(null, rows.map(function (r) { return r.recall; }).concat([0.9]));
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    svg.setAttribute("width", W);
    axis(svg, L, W - R, H - B, 0, xMax, function (v) { return v.toFixed(2) + " ms"; }, 4);
    label(svg, L - 4, T + 8, "1.0", "end");
    label(svg, L - 4, H - B, yMin.toFixed(2), "end");
    // Settings with the same recall and latency land on one spot: a label is drawn only where
    // it overlaps none drawn before (each point keeps its tooltip).
    var placed = [];
    rows.forEach(function (r) {
      var x = L + (W - L - R) * r.latency.p95_ms / xMax;
      var y = T + (H - T - B) * (1 - (r.recall - yMin) / (1 - yMin || 1));
      var c = el("circle", { cx: x, cy: y, r: 4, fill: "#3a78c9" }, svg);
      el("title", {}, c).textContent = r.filter + ", " + r.search + ": recall " + r.recall.toFixed(4) + ", p95 " + r.latency.p95_ms.toFixed(2) + " ms";
      var box = { x0: x + 6, x1: x + 6 + 6.5 * r.search.length, y0: y - 15, y1: y - 1 };
      var clash = placed.some(function (p) { return box.x0 < p.x1 && p.x0 < box.x1 && box.y0 < p.y1 && p.y0 < box.y1; });
      if (!clash) { placed.push(box); label(svg, box.x0, y - 4, r.search).setAttribute("class", "eval-label"); }
    });
  }

  wireTimeline();
  drawProgress();
  drawTimeline();
  drawDelays();
  drawHosts();
  drawBreakdown();
  drawEval();
  document.body.setAttribute("data-bars", String(document.querySelectorAll("#timeline g.bar").length));
  document.body.setAttribute("data-render-ms", (performance.now() - began).toFixed(1));
  document.body.setAttribute("data-rendered", "1");
})();
