// The swimlane of one team, drawn as SVG from what agent_router.ops.timeline builds: a lane per
// agent (and per outside sender), turns as bars, messages as arrows coloured by their kind with
// the routing outcome as their tip, an ask and its answer linked by the asker's wait. Idle gaps
// are compressed with a marked break; an overview strip shows the whole team and the window
// shown; zoom and pan (buttons, ctrl+wheel, drag, W/A/S/D), filters by agent and by kind, and a
// view focused on one agent and its partners. Bursts between one pair are one bundle with a
// count. Inside a turn, each model call and tool call is a span on its agent's lane. Above the
// lanes, who is blocked now and on whom; below them, the asks and the agents as tables that
// sort. Click anything to read it in the side panel.
//
// No library and no network: the same file is inlined in the page `agent-router timeline`
// writes (over Swimlane.local: every message is in the page) and served by `agent-router web`
// (over a source that asks the server for each window and page of lanes). Names and contents
// are only ever text (textContent, setAttribute), and every map keyed by a name is a Map, so
// no name or content can become markup or a property of an object's prototype.
"use strict";
var Swimlane = (function () {
  var SVG = "http://www.w3.org/2000/svg";
  var KINDS = ["task", "ask", "answer", "report", "message", "notice"];
  var KIND_COLOURS = new Map([
    ["task", "#1f5fbf"], ["ask", "#e08a00"], ["answer", "#12946b"],
    ["report", "#8e44ad"], ["message", "#5f6b7a"], ["notice", "#c2185b"]
  ]);
  var OUTCOMES = new Map([
    ["triggered_new_turn", "woke it: a new turn"],
    ["injected_inline", "read by its running turn"],
    ["coalesced", "joined its scheduled turn"],
    ["queued", "queued, no wake-up"],
    ["resolved", "became the result its asker waited for"],
    ["rejected", "refused"]
  ]);
  var TRIGGERS = new Map([
    ["new", ["#dbe8d4", "#6f9c5a"]], ["follow_up", ["#f4e7c0", "#c09a2c"]],
    ["continuation", ["#d6e2f5", "#5f82c4"]], ["recovery", ["#f5d0cc", "#c45a4d"]]
  ]);
  var STATES = new Map([
    ["running", "#2e9d46"], ["waiting", "#e08a00"], ["scheduled", "#1f5fbf"],
    ["idle", "#9aa3ad"], ["completed", "#5f6b7a"], ["terminated", "#c0392b"]
  ]);
  // The word for a state, as `agent-router status` says it: an agent waiting in an ask (or for
  // a sub-agent's report) is "blocked".
  function stateWord(s) { return s === "waiting" ? "blocked" : s; }
  var CALL_COLOURS = new Map([["model", "#3f51b5"], ["tool", "#00897b"], ["tool-error", "#c0392b"]]);
  var GAP_PX = 26, BUNDLE_PX = 9, MIN_LANE = 18, MAX_LANE = 38, AXIS_H = 22, OVERVIEW_H = 44;
  // Rows a table shows (the rest are counted below it).
  var MAX_ROWS = 500;
  var MIN_GAP_SECONDS = 1.0, GAP_SHARE = 1 / 40, LABEL_FONT = "12px system-ui, sans-serif";
  // Most messages one window holds, and most pieces it is read in (the live page).
  var MAX_LOADED = 20000, MAX_PIECES = 60;
  // Lanes of one page (the live page asks the server for as many).
  var PAGE_LANES = 60;

  // ------------------------------------------------------------------ small helpers

  function el(name, attrs, parent) {
    var node = document.createElementNS(SVG, name);
    if (attrs) attrs.forEach(function (v, k) { node.setAttribute(k, v); });
    if (parent) parent.appendChild(node);
    return node;
  }

  function attrs(obj) {  // a Map of attributes from literal pairs (no prototype lookups)
    var m = new Map();
    for (var i = 0; i < obj.length; i += 2) m.set(obj[i], String(obj[i + 1]));
    return m;
  }

  function html(tag, text, cls, parent) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = text;
    if (cls) node.className = cls;
    if (parent) parent.appendChild(node);
    return node;
  }

  function titled(node, text) {
    var t = document.createElementNS(SVG, "title");
    t.textContent = text;
    node.appendChild(t);
  }

  function fmtT(t) {
    if (t === null || t === undefined) return "-";
    if (t < 60) return (t < 10 ? t.toFixed(3) : t.toFixed(2)) + " s";
    var m = Math.floor(t / 60), s = t - 60 * m;
    return m + " min " + s.toFixed(1) + " s";
  }

  function fmtD(d) {  // a duration
    if (d < 1) return Math.round(d * 1000) + " ms";
    if (d < 60) return d.toFixed(d < 10 ? 2 : 1) + " s";
    return Math.floor(d / 60) + " min " + Math.round(d % 60) + " s";
  }

  function plural(n, word) { return n + " " + word + (n === 1 ? "" : "s"); }

  function fmtTokens(n) {
    if (n === null || n === undefined) return "-";
    return n >= 10000 ? Math.round(n / 1000) + "k" : n >= 1000 ? (n / 1000).toFixed(1) + "k" : String(n);
  }

  function fmtCost(call) {
    if (call.unpriced) return "price unknown";
    return "$" + (call.cost_usd || 0).toFixed(call.cost_usd >= 0.01 ? 4 : 6);
  }

  // What a model call or a tool call says of itself, in one line.
  function callText(c) {
    var took = c.ms === null ? "how long not recorded" : fmtD(c.ms / 1000);
    if (c.kind === "model") {
      return "model call " + c.name + " · " + took + " · " + fmtTokens(c.prompt_tokens) + " + " +
        fmtTokens(c.completion_tokens) + " tokens · " + fmtCost(c);
    }
    return "tool " + c.name + (c.server ? " (server " + c.server + ")" : "") + " · " + took +
      " · " + (c.outcome || "?");
  }

  function kindName(k) { return k === "report" ? "report" : k; }

  var measureCtx = null;
  function textWidth(text) {
    if (!measureCtx) {
      measureCtx = document.createElement("canvas").getContext("2d");
      measureCtx.font = LABEL_FONT;
    }
    return measureCtx.measureText(text).width;
  }

  // A name shortened in its middle to fit `width` pixels (the numbered end stays: "..._12").
  function fit(text, width) {
    if (textWidth(text) <= width) return text;
    var keep = text.length;
    while (keep > 2) {
      keep -= 1;
      var head = Math.ceil(keep * 0.6), tail = keep - head;
      var s = text.slice(0, head) + "…" + (tail ? text.slice(text.length - tail) : "");
      if (textWidth(s) <= width) return s;
    }
    return text.slice(0, 1) + "…";
  }

  // A label cut at its end to fit `width` pixels (at 9 px, about 0.6 of the lanes' font).
  function fitEnd(text, width) {
    var chars = Math.floor(width / 5.2);
    return text.length <= chars ? text : chars < 2 ? "" : text.slice(0, chars - 1) + "…";
  }

  // ------------------------------------------------------------------ time axis with breaks

  // Idle gaps of the overview, clipped to [a, b], worth compressing in that window.
  function breaksIn(gaps, a, b) {
    var shortest = Math.max(MIN_GAP_SECONDS, (b - a) * GAP_SHARE), out = [];
    (gaps || []).forEach(function (g) {
      var s = Math.max(g[0], a), e = Math.min(g[1], b);
      if (e - s >= shortest) out.push([s, e]);
    });
    var idle = out.reduce(function (sum, g) { return sum + g[1] - g[0]; }, 0);
    return idle >= (b - a) * 0.999 ? [] : out;
  }

  // Piecewise-linear time -> x: active time to scale, each break GAP_PX wide.
  function scale(a, b, breaks, x0, width) {
    var idle = breaks.reduce(function (s, g) { return s + g[1] - g[0]; }, 0);
    var active = Math.max(b - a - idle, 1e-6);
    var px = Math.max(width - breaks.length * GAP_PX, 10) / active;
    var segs = [], t = a, x = x0;
    breaks.forEach(function (g) {
      segs.push({ t0: t, t1: g[0], x0: x, x1: x + (g[0] - t) * px, gap: false });
      x += (g[0] - t) * px;
      segs.push({ t0: g[0], t1: g[1], x0: x, x1: x + GAP_PX, gap: true });
      x += GAP_PX;
      t = g[1];
    });
    segs.push({ t0: t, t1: b, x0: x, x1: x + (b - t) * px, gap: false });
    function toX(v) {
      if (v <= a) return x0 - (a - v) * px;
      for (var i = 0; i < segs.length; i++) {
        var s = segs[i];
        if (v <= s.t1 || i === segs.length - 1) {
          var span = s.t1 - s.t0;
          return span <= 0 ? s.x0 : s.x0 + (v - s.t0) / span * (s.x1 - s.x0);
        }
      }
      return x0 + width;
    }
    function toT(x) {
      for (var i = 0; i < segs.length; i++) {
        var s = segs[i];
        if (x <= s.x1 || i === segs.length - 1) {
          var w = s.x1 - s.x0;
          return w <= 0 ? s.t0 : s.t0 + (x - s.x0) / w * (s.t1 - s.t0);
        }
      }
      return b;
    }
    return { x: toX, t: toT, segs: segs, pxPerSecond: px };
  }

  function tickText(t, step) {
    var decimals = step >= 1 ? 0 : step >= 0.1 ? 1 : step >= 0.01 ? 2 : 3;
    if (t >= 60 && step >= 1) return Math.floor(t / 60) + ":" + String(Math.round(t % 60)).padStart(2, "0");
    return t.toFixed(decimals) + " s";
  }

  function niceStep(seconds) {
    var steps = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60,
      120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400];
    for (var i = 0; i < steps.length; i++) if (steps[i] >= seconds) return steps[i];
    return steps[steps.length - 1];
  }

  // ------------------------------------------------------------------ the local source

  // Every message is in `data` (the exported page): windows, filters and focus are computed here,
  // as the server computes them for the live page.
  function local(data) {
    var agents = data.lanes.items;
    function view(p) {
      var from = p.from || 0, to = p.to === null || p.to === undefined ? data.end : p.to;
      var inWindow = function (t) { return t >= from && t <= to; };
      var keep = agents;
      if (p.agent) {
        var needle = p.agent.toLowerCase();
        keep = keep.filter(function (a) { return a.name.toLowerCase().indexOf(needle) >= 0; });
      }
      var messages = data.messages.filter(function (m) { return inWindow(m.t); });
      if (p.focus) {
        if (!agents.some(function (a) { return a.name === p.focus; })) {
          return Promise.reject(new Error("unknown agent " + p.focus));
        }
        var partners = new Set([p.focus]);  // over the whole history: the same in every window
        data.messages.forEach(function (m) {
          if (m.from === p.focus) partners.add(m.to);
          else if (m.to === p.focus) partners.add(m.from);
        });
        messages = messages.filter(function (m) { return m.from === p.focus || m.to === p.focus; });
        keep = keep.filter(function (a) { return partners.has(a.name); });
      }
      // A page of lanes, as the live page's (a team of any size draws at once), with the
      // lead (unless the filter leaves it out) and the focused agent on every page.
      var offset = p.offset || 0, total = keep.length;
      var whole = !p.agent && !p.focus && total <= PAGE_LANES;
      var page = keep.slice(offset, offset + PAGE_LANES);
      var onPage = new Set(page.map(function (a) { return a.name; }));
      var hub = function (a) { return (a.lead && !p.agent) || a.name === p.focus; };
      var hubs = new Set(agents.filter(hub).map(function (a) { return a.name; }));
      keep = agents.filter(function (a) { return hub(a) && !onPage.has(a.name); }).concat(page);
      if (!whole) {
        // An end among the page's own agents (the other end may be a stub), or between hubs,
        // or from outside to a hub: a hub's messages to other pages' agents are theirs.
        var names = new Set(keep.map(function (a) { return a.name; }));
        var own = new Set(page.filter(function (a) { return !hubs.has(a.name); })
          .map(function (a) { return a.name; }));
        messages = messages.filter(function (m) {
          if (m.message_id === null) return names.has(m.from) || names.has(m.to);
          return own.has(m.to) || own.has(m.from) ||
            (hubs.has(m.to) && (hubs.has(m.from) || !m.from_agent));
        });
      }
      var lanes = new Set(keep.map(function (a) { return a.name; }));
      return Promise.resolve({
        team_id: data.team_id, started_at: data.started_at, end: data.end,
        last_event_id: data.last_event_id, agents_total: data.agents_total, states: data.states,
        lanes: { offset: offset, limit: PAGE_LANES, total: total, items: keep },
        window: { from: from, to: to, complete_to: to },
        turns: data.turns.filter(function (t) {
          return lanes.has(t.agent) && t.start <= to && (t.end === null || t.end >= from);
        }),
        messages: messages,
        calls: (data.calls || []).filter(function (c) {
          return lanes.has(c.agent) && c.end >= from && c.end <= to;
        }),
        now: data.now,
        questions: data.questions.filter(function (q) {
          var about = p.focus ? q.asker === p.focus || q.target === p.focus :
            lanes.has(q.asker) || lanes.has(q.target);
          return about && q.asked <= to && (q.closed === null || q.closed >= from);
        })
      });
    }
    var byMessage = new Map(), byTurn = new Map();
    data.messages.forEach(function (m) { if (m.message_id !== null) byMessage.set(m.message_id, m); });
    data.turns.forEach(function (t) { byTurn.set(t.id, t); });
    return {
      live: false,
      exportedAt: data.now ? data.now.at : data.end,
      view: view,
      overview: function () { return Promise.resolve(data.overview); },
      message: function (m) {
        var full = byMessage.get(m.message_id) || m;
        return Promise.resolve({ content: full.content, lines: full.line ? [full.line] : [] });
      },
      turn: function (t) { return Promise.resolve({ lines: (byTurn.get(t.id) || t).lines || [] }); }
    };
  }

  // ------------------------------------------------------------------ the controller

  function mount(container, source, options) {
    options = options || {};
    var state = {
      from: 0, to: null, focus: null, agent: "", offset: 0, hidden: new Set(),
      data: null, overview: null, selected: null, request: 0, receivedAt: Date.now(),
      askSort: { key: "asked", dir: 1 }, agentSort: { key: null, dir: 1 }
    };
    container.textContent = "";
    container.classList.add("swimlane");
    var toolbar = html("div", null, "sl-toolbar", container);
    var nowBox = html("section", null, "sl-now", container);
    nowBox.id = "now";
    nowBox.setAttribute("aria-live", "polite");
    var main = html("div", null, "sl-main", container);
    var chart = html("div", null, "sl-chart", main);
    var detail = html("aside", null, "sl-detail", main);
    detail.id = "detail";
    detail.setAttribute("aria-live", "polite");
    // The side panel shows the legend until something is clicked (and again on a click
    // between the lanes, Esc, or the toolbar's "legend"): it is on the first screen at any
    // team size, beside the lanes, and takes none of their height.
    function showLegend() {
      detail.textContent = "";
      html("p", "Click a message, a model or tool call, a turn or a lane's name. Ctrl+wheel or " +
        "W/S zooms, drag or A/D pans, the strip above picks a window.", "hint", detail);
      drawLegend(html("div", null, "sl-legend", detail));
    }
    showLegend();
    var overviewSvg = el("svg", attrs(["class", "sl-overview", "height", OVERVIEW_H]), chart);
    var lanesBox = html("div", null, "sl-lanes", chart);
    var notice = html("div", null, "sl-notice", chart);
    var tables = html("div", null, "sl-tables", container);
    var asksBox = html("section", null, "sl-asks", tables);
    var agentsBox = html("section", null, "sl-agents", tables);
    var svg = null, geometry = null, labelsEnd = new Map(), overviewNext = false, overviewAt = 0;

    // -- toolbar
    function button(text, title, action) {
      var b = html("button", text, null, toolbar);
      b.type = "button";
      b.title = title;
      b.addEventListener("click", action);
      return b;
    }
    button("Whole team", "Show the team's whole history (0)", function () { setWindow(0, null); });
    button("−", "Zoom out (S)", function () { zoom(2); });
    button("+", "Zoom in (W)", function () { zoom(0.5); });
    button("◀", "Pan left (A)", function () { pan(-0.4); });
    button("▶", "Pan right (D)", function () { pan(0.4); });
    var filter = html("input", null, "sl-filter", toolbar);
    filter.type = "search";
    filter.placeholder = "filter agents";
    filter.setAttribute("aria-label", "filter agents by name");
    var filterTimer = null;
    filter.addEventListener("input", function () {
      clearTimeout(filterTimer);
      filterTimer = setTimeout(function () {
        state.agent = filter.value.trim();
        state.offset = 0;
        load();
      }, 200);
    });
    var kinds = html("span", null, "sl-kinds", toolbar);
    KINDS.forEach(function (k) {
      var chip = html("button", kindName(k), "kind-chip", kinds);
      chip.type = "button";
      chip.dataset.kind = k;
      chip.title = "Show or hide " + k + " messages";
      chip.style.setProperty("--kind", KIND_COLOURS.get(k));
      chip.addEventListener("click", function () {
        if (state.hidden.has(k)) state.hidden.delete(k); else state.hidden.add(k);
        chip.classList.toggle("off", state.hidden.has(k));
        draw();
      });
    });
    var focusChip = html("button", null, "focus-chip", toolbar);
    focusChip.type = "button";
    focusChip.hidden = true;
    focusChip.title = "Show every agent again";
    focusChip.addEventListener("click", function () { setFocus(null); });
    var pager = html("span", null, "sl-pager", toolbar);
    var status = html("span", null, "sl-status", toolbar);

    button("legend", "What every mark and colour means (in the side panel)", function () {
      select(null);
      showLegend();
    });

    // -- loading
    function params() {
      return { from: state.from, to: state.to, focus: state.focus, agent: state.agent,
        offset: state.offset };
    }

    // The window is read in pieces: each answer is complete up to its `complete_to`, and the
    // next piece starts there, until the window is whole (or MAX_LOADED messages are in).
    // `since`: only what happened from then on, onto what is shown (the live page following
    // the end of a team: its ended turns and answered questions do not change any more, and a
    // running turn or an open question overlaps every later window).
    function load(since) {
      var generation = ++state.request, p = params();
      var onto = since === undefined ? null : state.data;
      status.textContent = "loading…";
      function piece(from, merged, pieces) {
        return source.view(Object.assign({}, p, { from: from })).then(function (data) {
          if (generation !== state.request) return;  // a newer request is under way
          data = merged ? merge(merged, data) : data;
          state.data = data;
          state.receivedAt = Date.now();
          draw();
          if (options.onData) options.onData(data);
          if (overviewNext) {
            overviewNext = false;
            overviewAt = Date.now();
            loadOverview();
          }
          var w = data.window, more = w.complete_to < w.to - 1e-9;
          if (more && w.complete_to > from && data.messages.length < MAX_LOADED && pieces < MAX_PIECES) {
            status.textContent = "loading… " + fmtT(w.complete_to) + " of " + fmtT(w.to);
            return piece(w.complete_to, data, pieces + 1);
          }
          status.textContent = "";
        });
      }
      return piece(onto ? since : p.from, onto, 1).catch(function (err) {
        if (generation !== state.request) return;
        status.textContent = String(err && err.message || err);
        if (state.focus) setFocus(null);
      });
    }

    function merge(before, after) {  // a later piece of the same window onto the earlier ones
      var byId = function (list) {
        var m = new Map();
        list.forEach(function (x) { m.set(x.id, x); });
        return m;
      };
      var messages = byId(before.messages), turns = byId(before.turns), questions = byId(before.questions);
      var calls = new Map();
      (before.calls || []).concat(after.calls || []).forEach(function (c) {
        calls.set(c.kind + "\u0000" + c.agent + "\u0000" + c.end + "\u0000" + c.name, c);
      });
      after.messages.forEach(function (x) { messages.set(x.id, x); });
      after.turns.forEach(function (x) { turns.set(x.id, x); });
      after.questions.forEach(function (x) { questions.set(x.id, x); });
      return Object.assign({}, after, {
        window: { from: before.window.from, to: after.window.to, complete_to: after.window.complete_to },
        messages: Array.from(messages.values()).sort(function (a, b) { return a.t - b.t || a.id - b.id; }),
        turns: Array.from(turns.values()),
        calls: Array.from(calls.values()).sort(function (a, b) { return a.end - b.end; }),
        questions: Array.from(questions.values())
      });
    }

    function loadOverview() {
      return source.overview().then(function (ov) {
        state.overview = ov;
        draw();
      }, function () { /* the strip stays empty; the lanes do not need it */ });
    }

    // Now, in seconds since the team was created: the live page counts on from the server's
    // time of its last answer; the exported page's now is when it was written.
    function nowT() {
      var d = state.data;
      if (!d || !d.now) return d ? d.end : 0;
      return d.now.at + (source.live ? (Date.now() - state.receivedAt) / 1000 : 0);
    }

    // Somebody blocked (or a turn running) makes now part of the story: an open ask is drawn
    // up to now.
    // (The exported page's now is when it was written: a moment after its last event is not
    // drawn, it would only squeeze the story to the left.)
    function goesOn() {
      var d = state.data;
      return !!(d && d.now && (d.now.total > 0 || d.turns.some(function (t) { return t.end === null; })) &&
        (source.live || d.now.at - d.end >= MIN_GAP_SECONDS));
    }

    function end() {  // the team's latest event (or now, while it goes on), in seconds
      var e = state.data ? state.data.end : state.overview ? state.overview.end : 0;
      if (goesOn()) e = Math.max(e, nowT());
      return Math.max(e, 0.001);
    }

    function windowNow() {
      var e = end();
      var a = Math.max(0, Math.min(state.from, e));
      var b = state.to === null ? e : Math.min(Math.max(state.to, a + 0.001), Math.max(e, state.to));
      return [a, b];
    }

    function setWindow(a, b) {
      var e = end();
      if (b !== null) {
        var width = Math.max(b - a, 0.002);
        a = Math.max(0, Math.min(a, e - width));
        b = a + width;
        if (b >= e && a <= 0) { a = 0; b = null; }
      }
      state.from = a;
      state.to = b;
      draw();
      schedule();
    }

    var scheduled = null;
    function schedule() {  // a window changes many times in a drag: ask once it settles
      clearTimeout(scheduled);
      scheduled = setTimeout(load, source.live ? 150 : 0);
    }

    function zoom(factor, at) {
      var w = windowNow(), a = w[0], b = w[1];
      var c = at === undefined ? (a + b) / 2 : at;
      setWindow(c - (c - a) * factor, c + (b - c) * factor);
    }

    function pan(share) {
      var w = windowNow(), d = (w[1] - w[0]) * share;
      setWindow(w[0] + d, w[1] + d);
    }

    function setFocus(name) {
      select(null);
      detail.textContent = "";
      if (name) {
        html("h3", "focus: " + name, null, detail);
        html("p", "Its lane, and the lanes of the agents it exchanged messages with; only its " +
          "own messages. ✕ above, or Esc, shows every agent again.", null, detail);
      }
      state.focus = name;
      state.offset = 0;
      focusChip.hidden = !name;
      focusChip.textContent = name ? "focus: " + name + " ✕" : "";
      load();
    }

    // -- drawing
    function draw() {
      var data = state.data;
      if (!data) return;
      var w = windowNow(), a = w[0], b = w[1];
      var gapsKnown = (state.overview ? state.overview.gaps : []).slice();
      // Past the last event, while somebody is blocked and nobody runs, nothing happens.
      var running = data.lanes.items.some(function (l) { return l.state === "running"; });
      if (goesOn() && !running && nowT() > data.end) gapsKnown.push([data.end, nowT()]);
      var breaks = breaksIn(gapsKnown, a, b);
      var agents = data.lanes.items;
      var names = new Set(agents.map(function (l) { return l.name; }));
      // Every outside sender has a lane; focused or filtered, only those that sent to the lanes.
      var narrowed = state.focus || state.agent;
      var outside = new Set(state.overview && !narrowed ? state.overview.outside : []);
      data.messages.forEach(function (m) { if (!m.from_agent) outside.add(m.from); });
      names.forEach(function (n) { outside.delete(n); });
      var lanes = Array.from(outside).sort().map(function (n) { return { name: n, outside: true }; })
        .concat(agents.map(function (l) { return Object.assign(Object.create(null), l); }));
      var index = new Map();
      lanes.forEach(function (l, i) { index.set(l.name, i); });
      var labelW = Math.min(230, Math.max(110, 26 + lanes.reduce(function (m, l) {
        return Math.max(m, textWidth(l.label || l.name));
      }, 0)));
      var width = Math.max(lanesBox.clientWidth || 900, 480);
      var top = lanesBox.getBoundingClientRect().top + window.scrollY;
      var room = window.innerHeight - top - notice.offsetHeight - 30;
      var laneH = Math.max(MIN_LANE, Math.min(MAX_LANE, Math.floor((room - AXIS_H) / Math.max(lanes.length, 1))));
      var plotX = labelW + 8, plotW = width - plotX - 14;
      var sc = scale(a, b, breaks, plotX, plotW);
      var height = AXIS_H + lanes.length * laneH + 6;
      var laneY = function (name) {  // null: an agent on another page
        return index.has(name) ? AXIS_H + index.get(name) * laneH : null;
      };
      geometry = { sc: sc, a: a, b: b, plotX: plotX, plotW: plotW, laneH: laneH };

      lanesBox.textContent = "";
      svg = el("svg", attrs(["id", "swimlane-svg", "width", width, "height", height,
        "data-team", data.team_id, "data-last-event", data.last_event_id,
        "data-from", a, "data-to", b]), lanesBox);
      var defs = el("defs", null, svg);
      KINDS.forEach(function (k) { markers(defs, k); });
      var clip = el("clipPath", attrs(["id", "sl-plot"]), defs);
      el("rect", attrs(["x", plotX, "y", 0, "width", plotW, "height", height]), clip);

      // lanes
      lanes.forEach(function (lane, i) {
        var y = AXIS_H + i * laneH;
        var g = el("g", attrs(["class", "lane" + (lane.outside ? " outside" : "") +
          (lane.lead ? " lead" : "") +
          (state.focus === lane.name ? " focused" : "")]), svg);
        g.setAttribute("data-agent", lane.name);
        if (lane.state) g.setAttribute("data-state", lane.state);
        el("rect", attrs(["x", 0, "y", y, "width", width, "height", laneH,
          "class", "lane-band" + (i % 2 ? " odd" : "")]), g);
        if (lane.state) {
          var dot = el("circle", attrs(["cx", 9, "cy", y + laneH / 2, "r", 4,
            "fill", STATES.get(lane.state) || "#999", "class", "state-dot"]), g);
          titled(dot, stateWord(lane.state) + (lane.suspended ? " (suspended: no worker held)" : ""));
        }
        var label = el("text", attrs(["x", 18, "y", y + laneH / 2 + 4, "class", "lane-label"]), g);
        label.textContent = fit(lane.label || lane.name, labelW - 22);
        titled(label, lane.name + (lane.role ? " (" + lane.role + (lane.state ? ", " + stateWord(lane.state) : "") + ")" : "") +
          (lane.outside ? " — not an agent" : " — click to focus"));
        if (!lane.outside) {
          label.addEventListener("click", function () {
            setFocus(state.focus === lane.name ? null : lane.name);
          });
        }
      });
      el("line", attrs(["x1", plotX - 4, "y1", AXIS_H, "x2", plotX - 4, "y2", height, "class", "label-rule"]), svg);

      var plot = el("g", attrs(["clip-path", "url(#sl-plot)"]), svg);
      drawAxis(svg, sc, a, b, breaks, height);
      drawBreaks(plot, sc, breaks, height);

      // turns
      data.turns.forEach(function (turn) {
        if (!index.has(turn.agent)) return;
        var stop = turn.end === null ? b : turn.end;
        var x1 = sc.x(Math.max(turn.start, a - 1)), x2 = sc.x(Math.min(stop, b + 1));
        var colours = TRIGGERS.get(turn.trigger) || ["#e4e4e4", "#888"];
        var bar = el("rect", attrs(["x", x1, "y", laneY(turn.agent) + 3,
          "width", Math.max(3, x2 - x1), "height", Math.max(4, laneH - 9), "rx", 2,
          "fill", colours[0], "stroke", colours[1], "data-turn", turn.id,
          "data-trigger", turn.trigger, "class", "turn " + turn.how]), plot);
        titled(bar, "turn " + turn.id + " of " + turn.agent + " (" + turn.trigger + "): " +
          turn.how + ", " + fmtT(turn.start) + " – " + (turn.end === null ? "now" : fmtT(turn.end)));
        bar.addEventListener("click", function (ev) { ev.stopPropagation(); showTurn(turn, bar); });
      });

      // model calls and tool calls: spans inside their turns
      var callH = Math.max(4, laneH - 9);
      (data.calls || []).forEach(function (c, i) {
        if (!index.has(c.agent)) return;
        var s = c.start === null ? c.end : c.start;
        if (c.end < a - 1 || s > b + 1) return;
        var x1 = sc.x(Math.max(s, a - 1)), x2 = sc.x(Math.min(c.end, b + 1));
        var y = laneY(c.agent) + 3;
        var colour = CALL_COLOURS.get(c.kind === "tool" && c.outcome === "error" ? "tool-error" : c.kind);
        var g = el("g", attrs(["class", "call " + c.kind + (c.outcome === "error" ? " error" : ""),
          "data-call", i, "data-kind", c.kind, "data-agent", c.agent, "data-name", c.name,
          "data-ms", c.ms === null ? "" : c.ms]), plot);
        el("rect", attrs(["x", x1, "y", y, "width", Math.max(2, x2 - x1), "height", callH, "rx", 1.5,
          "fill", colour, "class", "call-bar"]), g);
        titled(g, c.agent + ": " + callText(c));
        if (x2 - x1 > 48 && callH >= 9) {
          var what = c.kind === "model" ? c.name + " · " +
            fmtTokens((c.prompt_tokens || 0) + (c.completion_tokens || 0)) + " tok" : c.name;
          var text = el("text", attrs(["x", x1 + 3, "y", y + callH - Math.max(2, (callH - 9) / 2),
            "class", "call-label"]), g);
          text.textContent = fitEnd(what, x2 - x1 - 6);
        }
        g.addEventListener("click", function (ev) { ev.stopPropagation(); showCall(c, i); });
      });

      // waits: an ask (or a wait for a report) on the asker's lane, until its answer (or now)
      var asks = new Map(), answers = new Map(), waitBoxes = new Map(), current = nowT();
      data.messages.forEach(function (m) {
        if (m.question_id === null) return;
        if (m.kind === "ask") asks.set(m.question_id, m);
        else if (m.kind === "answer" || m.outcome === "resolved") answers.set(m.question_id, m);
      });
      var questions = new Map();
      data.questions.forEach(function (q) {
        questions.set(q.id, q);
        if (!index.has(q.asker) || (q.kind === "ask" && state.hidden.has("ask"))) return;
        var x1 = sc.x(Math.max(q.asked, a)), x2 = sc.x(Math.min(q.closed === null ? current : q.closed, b));
        var y = laneY(q.asker) + laneH - 6;
        var band = el("rect", attrs(["x", x1, "y", y, "width", Math.max(2, x2 - x1), "height", 5,
          "class", "wait " + q.kind + (q.closed === null ? " open" : ""),
          "data-question", q.id, "data-wait", q.wait === null ? "" : q.wait]), plot);
        titled(band, waitText(q));
        band.addEventListener("click", function (ev) { ev.stopPropagation(); showQuestion(q); });
        var waited = q.wait !== null ? fmtD(q.wait) : q.status === "open" ? "blocked " +
          fmtD(Math.max(0, current - q.asked)) : null;
        if (waited !== null && x2 - x1 > 6 * waited.length) {
          var label = el("text", attrs(["x", (x1 + x2) / 2, "y", y - 1, "class", "wait-label" +
            (q.closed === null ? " open" : ""), "data-question", q.id]), plot);
          label.textContent = waited;
          var half = 2.7 * waited.length;
          var boxes = waitBoxes.get(q.asker) || [];
          boxes.push([(x1 + x2) / 2 - half, (x1 + x2) / 2 + half]);
          waitBoxes.set(q.asker, boxes);
        }
      });

      // arrows, bundled per pair and kind when they crowd
      var shown = data.messages.filter(function (m) { return !state.hidden.has(m.kind); });
      var groups = new Map(), bundles = [];
      shown.forEach(function (m) {
        if (m.question_id !== null && (m.kind === "ask" || m.kind === "answer")) {
          bundles.push([m]);  // an ask and its answer are always drawn alone: they link
          return;
        }
        var key = m.from + "\u0000" + m.to + "\u0000" + m.kind;
        var open = groups.get(key), x = sc.x(m.t);
        if (open && x - open.x <= BUNDLE_PX) { open.list.push(m); return; }
        var bundle = { x: x, list: [m] };
        groups.set(key, bundle);
        bundles.push(bundle.list);
      });
      // Crowded, the lines between the lanes fade and their ends (where a message left, where
      // it arrived, in its kind's colour) carry the picture; zoomed in, they are drawn whole.
      var dense = bundles.length / Math.max(plotW, 1) > 0.12;
      svg.classList.toggle("dense", dense);
      labelsEnd = new Map();
      bundles.sort(function (p, q) { return p[0].t - q[0].t; });
      bundles.forEach(function (list) { drawArrow(plot, list, sc, laneY, laneH, questions, waitBoxes); });

      // what is not loaded: past the cap, the messages stop at complete_to
      if (data.window && data.window.complete_to < Math.min(b, data.end) - 1e-6) {
        var cx = sc.x(Math.max(data.window.complete_to, a));
        el("rect", attrs(["x", cx, "y", AXIS_H, "width", Math.max(0, plotX + plotW - cx),
          "height", height - AXIS_H, "class", "not-loaded"]), plot);
        notice.textContent = "Messages after " + fmtT(data.window.complete_to) +
          " are not loaded in this window (" + data.messages.length +
          " shown): zoom in to read them; the strip above counts them all.";
      } else {
        notice.textContent = "";
      }

      svg.addEventListener("click", function (ev) {
        if (ev.target === svg || ev.target.classList.contains("lane-band")) { select(null); showLegend(); }
      });
      bindPointer(svg);
      drawOverview();
      drawPager(data);
      drawNow(data);
      drawAsks(data);
      drawAgents(data);
      reselect();
    }

    function drawArrow(plot, list, sc, laneY, laneH, questions, waitBoxes) {
      var m = list[0], n = list.length, kind = KIND_COLOURS.has(m.kind) ? m.kind : "message";
      var x = sc.x(m.t), fromY = laneY(m.from), toY = laneY(m.to);
      if (fromY === null && toY === null) return;
      // One end on another page: a stub, from the sender's lane or into the receiver's.
      var stub = fromY === null ? "from" : toY === null ? "to" : null, dx = 3, y1, y2, tip, down;
      if (stub === "to") {  // out of the sender's lane, down and to the right
        y1 = fromY + laneH / 2; tip = fromY + laneH + 3; dx = 8; down = true;
      } else if (stub === "from") {  // into the receiver's lane, from above
        y1 = toY - 5; tip = toY + laneH / 2 - 3; dx = 8; x -= 8; down = true;
      } else {
        y1 = fromY + laneH / 2; y2 = toY + laneH / 2;
        down = y2 >= y1; tip = y2 + (down ? -3 : 3);
        if (Math.abs(y2 - y1) < 2) { tip = y1 + 8; }  // to its own lane: a short tick
      }
      var colour = KIND_COLOURS.get(kind);
      var outcome = dominant(list);
      var g = el("g", attrs(["class", "arrow" + (n > 1 ? " bundle" : "") + (stub ? " stub" : ""), "data-kind", m.kind,
        "data-outcome", outcome, "data-count", n, "data-from", m.from, "data-to", m.to]), plot);
      if (m.question_id !== null) g.setAttribute("data-question", m.question_id);
      if (n === 1 && m.message_id !== null) g.setAttribute("data-message", m.message_id);
      var width = n > 1 ? Math.min(5, 1.6 + Math.log2(n)) : 1.6;
      var line = el("line", attrs(["x1", x, "y1", y1, "x2", x + dx, "y2", tip, "stroke", colour,
        "stroke-width", width, "class", "msg " + outcome, "data-kind", m.kind,
        "data-outcome", outcome, "marker-end", "url(#tip-" + kind + "-" + tipShape(outcome) + ")"]), g);
      if (n === 1 && m.message_id !== null) line.setAttribute("data-message", m.message_id);
      if (m.question_id !== null) line.setAttribute("data-question", m.question_id);
      el("circle", attrs(["cx", x, "cy", y1, "r", n > 1 ? 2.6 : 1.8, "fill", colour, "class", "origin"]), g);
      var free = labelsEnd.get(m.from) || -Infinity, countEnd = x + 14 + 7 * String(n).length;
      var onWait = (waitBoxes.get(m.from) || []).some(function (box) {
        return x + 4 < box[1] && countEnd > box[0];
      });
      if (n > 2 && x + 4 > free && !onWait) {  // by the sender: "this lane sent n of them here"
        var count = el("text", attrs(["x", x + 4, "y", y1 + (down ? -2 : 10), "class", "count"]), g);
        count.textContent = "×" + n;
        labelsEnd.set(m.from, countEnd);
      }
      var hit = el("line", attrs(["x1", x, "y1", y1, "x2", x + dx, "y2", tip, "class", "msg-hit"]), g);
      titled(hit, (n > 1 ? n + " " + m.kind + "s " + m.from + " → " + m.to + " (" +
        fmtT(m.t) + " – " + fmtT(list[n - 1].t) + ")" : m.kind + " " + m.from + " → " + m.to +
        ": " + (OUTCOMES.get(m.outcome) || m.outcome) + " — " + m.preview) +
        (stub ? " (" + (stub === "to" ? m.to : m.from) + " is on another page of agents)" : ""));
      if (stub) g.setAttribute("data-stub", stub === "to" ? m.to : m.from);
      g.addEventListener("click", function (ev) {
        ev.stopPropagation();
        if (n > 1) showBundle(list, g);
        else if (m.question_id !== null && questions.has(m.question_id)) showQuestion(questions.get(m.question_id), m);
        else showMessage(m, g);
      });
    }

    function dominant(list) {
      var counts = new Map(), best = list[0].outcome;
      list.forEach(function (m) {
        counts.set(m.outcome, (counts.get(m.outcome) || 0) + 1);
        if (counts.get(m.outcome) > counts.get(best)) best = m.outcome;
      });
      return best;
    }

    function drawAxis(parent, sc, a, b, breaks, height) {
      var axis = el("g", attrs(["class", "axis"]), parent);
      var pxPerS = sc.pxPerSecond, step = niceStep(90 / pxPerS);
      sc.segs.forEach(function (s) {
        if (s.gap) return;
        for (var t = Math.ceil(s.t0 / step) * step; t <= s.t1 + 1e-9; t += step) {
          var x = sc.x(t);
          if (x < geometry.plotX - 1 || x > geometry.plotX + geometry.plotW + 1) continue;
          if (breaks.some(function (g) { return Math.abs(x - sc.x(g[0])) < 42 || Math.abs(x - sc.x(g[1])) < 6; })) continue;
          el("line", attrs(["x1", x, "y1", AXIS_H - 5, "x2", x, "y2", height, "class", "tick"]), axis);
          var label = el("text", attrs(["x", x + 2, "y", AXIS_H - 8, "class", "tick-label"]), axis);
          label.textContent = tickText(Math.round(t / step) * step, step);
        }
      });
    }

    function drawBreaks(parent, sc, breaks, height) {
      breaks.forEach(function (g) {
        var x1 = sc.x(g[0]), x2 = sc.x(g[1]);
        var group = el("g", attrs(["class", "break", "data-from", g[0], "data-to", g[1]]), parent);
        el("rect", attrs(["x", x1, "y", AXIS_H, "width", x2 - x1, "height", height - AXIS_H,
          "class", "break-band"]), group);
        var zig = "M " + (x1 + 8) + " " + AXIS_H;
        for (var y = AXIS_H, i = 0; y < height; y += 8, i++) zig += " L " + (x1 + (i % 2 ? 8 : 16)) + " " + (y + 8);
        el("path", attrs(["d", zig, "class", "break-mark"]), group);
        var label = el("text", attrs(["x", (x1 + x2) / 2, "y", AXIS_H - 8, "class", "break-label"]), svg);
        label.textContent = "+" + fmtD(g[1] - g[0]);
        titled(group, "idle for " + fmtD(g[1] - g[0]) + " (" + fmtT(g[0]) + " – " + fmtT(g[1]) +
          "), compressed");
        group.addEventListener("click", function (ev) {
          ev.stopPropagation();
          select(null);
          detail.textContent = "";
          html("h3", "Idle " + fmtD(g[1] - g[0]), null, detail);
          html("p", "Nothing happened from " + fmtT(g[0]) + " to " + fmtT(g[1]) +
            ": the stretch is drawn " + GAP_PX + " px wide. Zoom into it to see it to scale.",
            null, detail);
        });
      });
    }

    function drawOverview() {
      var ov = state.overview;
      overviewSvg.textContent = "";
      var width = Math.max(lanesBox.clientWidth || 900, 480);
      overviewSvg.setAttribute("width", width);
      var x0 = geometry ? geometry.plotX : 120, w = width - x0 - 14;
      var e = end();
      var label = el("text", attrs(["x", 4, "y", 16, "class", "ov-label"]), overviewSvg);
      label.textContent = "whole team";
      var sub = el("text", attrs(["x", 4, "y", 30, "class", "ov-sub"]), overviewSvg);
      sub.textContent = fmtT(e);
      el("rect", attrs(["x", x0, "y", 2, "width", w, "height", OVERVIEW_H - 4, "class", "ov-bg"]), overviewSvg);
      if (ov) {
        (ov.gaps || []).forEach(function (g) {
          el("rect", attrs(["x", x0 + g[0] / e * w, "y", 2, "width", Math.max(1, (g[1] - g[0]) / e * w),
            "height", OVERVIEW_H - 4, "class", "ov-gap"]), overviewSvg);
        });
        var cols = Math.max(1, Math.floor(w / 2)), sums = [], peak = 1;
        for (var c = 0; c < cols; c++) sums.push(new Array(KINDS.length + 1).fill(0));
        ov.counts.forEach(function (row) {
          var t = row[0] * ov.bucket, c2 = Math.min(cols - 1, Math.floor(t / e * cols));
          if (c2 < 0) return;
          row[1].forEach(function (n, k) { sums[c2][k] += n; });
        });
        sums.forEach(function (s) { peak = Math.max(peak, s.reduce(function (x, y) { return x + y; }, 0)); });
        var h = OVERVIEW_H - 6;
        sums.forEach(function (s, c3) {
          var y = OVERVIEW_H - 3;
          KINDS.forEach(function (k, i) {
            if (!s[i] || state.hidden.has(k)) return;
            var bar = Math.max(1, Math.sqrt(s[i] / peak) * h * (s[i] / Math.max(1, s.reduce(function (x, z) { return x + z; }, 0))));
            y -= bar;
            el("rect", attrs(["x", x0 + c3 * w / cols, "y", y, "width", Math.max(1, w / cols), "height", bar,
              "fill", KIND_COLOURS.get(k), "class", "ov-bar"]), overviewSvg);
          });
        });
      }
      var win = windowNow();
      var bx1 = x0 + win[0] / e * w, bx2 = x0 + win[1] / e * w;
      el("rect", attrs(["x", x0, "y", 2, "width", Math.max(0, bx1 - x0), "height", OVERVIEW_H - 4, "class", "ov-shade"]), overviewSvg);
      el("rect", attrs(["x", bx2, "y", 2, "width", Math.max(0, x0 + w - bx2), "height", OVERVIEW_H - 4, "class", "ov-shade"]), overviewSvg);
      el("rect", attrs(["x", bx1, "y", 1, "width", Math.max(2, bx2 - bx1), "height", OVERVIEW_H - 2, "class", "ov-brush"]), overviewSvg);
      overviewSvg.onmousedown = function (ev) {
        var box = overviewSvg.getBoundingClientRect();
        var toT = function (cx) { return Math.max(0, Math.min(e, (cx - box.left - x0) / w * e)); };
        var start = toT(ev.clientX), moved = false;
        var guide = el("rect", attrs(["y", 1, "height", OVERVIEW_H - 2, "class", "ov-drag"]), overviewSvg);
        function move(e2) {
          moved = true;
          var t = toT(e2.clientX), lo = Math.min(start, t), hi = Math.max(start, t);
          guide.setAttribute("x", x0 + lo / e * w);
          guide.setAttribute("width", Math.max(1, (hi - lo) / e * w));
        }
        function up(e2) {
          document.removeEventListener("mousemove", move);
          document.removeEventListener("mouseup", up);
          var t = toT(e2.clientX);
          if (moved && Math.abs(t - start) > e / 2000) setWindow(Math.min(start, t), Math.max(start, t));
          else { var half = (win[1] - win[0]) / 2; setWindow(t - half, t + half); }
        }
        document.addEventListener("mousemove", move);
        document.addEventListener("mouseup", up);
        ev.preventDefault();
      };
    }

    function drawPager(data) {
      pager.textContent = "";
      var lanes = data.lanes;
      if (lanes.limit === null || (lanes.offset === 0 && lanes.total <= lanes.items.length)) return;
      // The lead and the focused agent are on every page besides its own agents.
      var first = lanes.total ? lanes.offset + 1 : 0;
      var last = Math.min(lanes.total, lanes.offset + lanes.limit);
      var prev = html("button", "‹", null, pager);
      prev.type = "button";
      prev.title = "Previous agents";
      prev.disabled = lanes.offset === 0;
      prev.addEventListener("click", function () { state.offset = Math.max(0, lanes.offset - lanes.limit); load(); });
      html("span", "agents " + first.toLocaleString() + "–" + last.toLocaleString() + " of " +
        lanes.total.toLocaleString(), "pager-text", pager);
      var next = html("button", "›", null, pager);
      next.type = "button";
      next.title = "Next agents";
      next.disabled = last >= lanes.total;
      next.addEventListener("click", function () { state.offset = lanes.offset + lanes.limit; load(); });
    }

    function localX(node, ev) { return ev.clientX - node.getBoundingClientRect().left; }

    // -- pointer: drag pans, ctrl+wheel zooms, shift+wheel pans, double-click zooms in
    function bindPointer(node) {
      node.addEventListener("wheel", function (ev) {
        if (!geometry) return;
        if (ev.ctrlKey || ev.metaKey) {
          ev.preventDefault();
          zoom(ev.deltaY > 0 ? 1.25 : 0.8, geometry.sc.t(localX(node, ev)));
        } else if (ev.shiftKey || Math.abs(ev.deltaX) > Math.abs(ev.deltaY)) {
          ev.preventDefault();
          pan((ev.deltaX || ev.deltaY) > 0 ? 0.15 : -0.15);
        }
      }, { passive: false });
      node.addEventListener("dblclick", function (ev) {
        if (geometry && localX(node, ev) > geometry.plotX) zoom(0.5, geometry.sc.t(localX(node, ev)));
      });
      node.addEventListener("mousedown", function (ev) {
        if (!geometry || localX(node, ev) < geometry.plotX || ev.button !== 0) return;
        var x0 = ev.clientX, w = windowNow(), moved = false;
        function move(e2) {
          if (Math.abs(e2.clientX - x0) < 4 && !moved) return;
          moved = true;
          node.classList.add("panning");
        }
        function up(e2) {
          document.removeEventListener("mousemove", move);
          document.removeEventListener("mouseup", up);
          node.classList.remove("panning");
          if (!moved) return;
          var t1 = geometry.sc.t(x0 - node.getBoundingClientRect().left);
          var t2 = geometry.sc.t(e2.clientX - node.getBoundingClientRect().left);
          setWindow(w[0] - (t2 - t1), w[1] - (t2 - t1));
        }
        document.addEventListener("mousemove", move);
        document.addEventListener("mouseup", up);
      });
    }

    document.addEventListener("keydown", function (ev) {
      var tag = (ev.target && ev.target.tagName) || "";
      if (tag === "INPUT" || tag === "TEXTAREA" || ev.ctrlKey || ev.metaKey || ev.altKey) return;
      if (!container.isConnected) return;
      var k = ev.key.toLowerCase();
      if (k === "w") zoom(0.5);
      else if (k === "s") zoom(2);
      else if (k === "a") pan(-0.25);
      else if (k === "d") pan(0.25);
      else if (k === "0") setWindow(0, null);
      else if (k === "escape") { select(null); if (state.focus) setFocus(null); else showLegend(); }
    });

    // -- selection and the side panel
    function select(selector) {
      state.selected = selector;
      if (!svg) return;
      container.querySelectorAll(".sel").forEach(function (n) { n.classList.remove("sel"); });
      svg.classList.toggle("has-sel", !!selector);
      if (selector) container.querySelectorAll(selector).forEach(function (n) { n.classList.add("sel"); });
    }

    function reselect() {  // after a redraw: the selection again, if it is still drawn
      if (state.selected && svg.querySelector(state.selected)) select(state.selected);
      else select(null);
    }

    function heading(text) {
      detail.textContent = "";
      return html("h3", text, null, detail);
    }

    function field(name, value) {
      var row = html("div", null, "field", detail);
      html("span", name, "name", row);
      html("span", value, "value", row);
      return row;
    }

    function content(promise, target) {
      var pre = html("pre", "…", "content", target || detail);
      promise.then(function (full) { pre.textContent = full; }, function (err) {
        pre.textContent = "(could not be read: " + (err && err.message || err) + ")";
      });
      return pre;
    }

    function showMessage(m, node) {
      select('[data-message="' + (m.message_id === null ? "none" : m.message_id) + '"]');
      if (m.message_id === null && node) { select(null); node.classList.add("sel"); svg.classList.add("has-sel"); }
      heading(m.kind + " · " + m.from + " → " + m.to);
      field("at", fmtT(m.t));
      field("type", m.type + (m.subtype ? " / " + m.subtype : ""));
      field("outcome", m.outcome + ": " + (OUTCOMES.get(m.outcome) || ""));
      if (m.status) field("status", m.status);
      if (m.message_id !== null) field("message", "#" + m.message_id);
      var lines = html("div", null, "lines", detail);
      content(source.message(m).then(function (full) {
        (full.lines || []).forEach(function (l) { html("div", l, "line", lines); });
        return full.content;
      }));
    }

    function waitText(q) {
      var who = q.kind === "output" ? q.asker + " waited for " + q.target + "'s report" :
        q.asker + " asked " + q.target;
      return "question " + q.id + ": " + who + (q.wait !== null ? ", waited " + fmtD(q.wait) +
        " (" + q.status + ")" : ", still " + q.status);
    }

    function showQuestion(q, clicked) {
      select('[data-question="' + q.id + '"]');
      heading("question " + q.id + " · " + q.asker + " → " + q.target);
      var wait = field("wait", q.wait !== null ? "waited " + fmtD(q.wait) + " (" + q.status + ")" :
        "blocked for " + blockedFor(q.asked) + " (" + q.status + ")");
      wait.classList.add("wait-field");
      if (q.closed === null) {
        var value = wait.querySelector(".value");
        value.dataset.since = q.asked;
        value.dataset.prefix = "blocked for ";
      }
      field("asked", fmtT(q.asked) + (q.kind === "output" ? " (waits for a report)" : ""));
      field("answered", q.closed === null ? "not yet" : fmtT(q.closed));
      var ask = null, answer = null;
      state.data.messages.forEach(function (m) {
        if (m.question_id !== q.id) return;
        if (m.kind === "ask") ask = m; else if (!answer) answer = m;
      });
      [["ask", ask], ["answer", answer]].forEach(function (pair) {
        var m = pair[1];
        if (!m) return;
        html("h4", pair[0] + " · " + m.from + " → " + m.to + " at " + fmtT(m.t) + " (" + m.outcome + ")", null, detail);
        content(source.message(m).then(function (full) { return full.content; }));
      });
      if (clicked) detail.dataset.clicked = clicked.kind;
    }

    function showBundle(list, node) {
      select(null);
      node.classList.add("sel");
      svg.classList.add("has-sel");
      var m = list[0];
      heading(list.length + " " + m.kind + "s · " + m.from + " → " + m.to);
      field("from", fmtT(m.t) + " to " + fmtT(list[list.length - 1].t));
      var outcomes = new Map();
      list.forEach(function (x) { outcomes.set(x.outcome, (outcomes.get(x.outcome) || 0) + 1); });
      field("outcomes", Array.from(outcomes, function (e) { return e[1] + " " + e[0]; }).join(", "));
      var ul = html("ol", null, "bundle-list", detail);
      list.slice(0, 200).forEach(function (x) {
        var li = html("li", fmtT(x.t) + " · " + x.outcome + " · " + x.preview, null, ul);
        li.addEventListener("click", function () { showMessage(x, null); });
      });
      if (list.length > 200) html("p", (list.length - 200) + " more: zoom in to read them one by one.", null, detail);
    }

    function showTurn(turn, node) {
      select('[data-turn="' + turn.id + '"]');
      heading("turn " + turn.id + " · " + turn.agent);
      field("trigger", turn.trigger + ", epoch " + turn.epoch);
      field("time", fmtT(turn.start) + " – " + (turn.end === null ? "now" : fmtT(turn.end)) +
        (turn.end === null ? "" : " (" + fmtD(turn.end - turn.start) + ")"));
      field("how", turn.how);
      var lines = html("div", "…", "lines", detail);
      source.turn(turn).then(function (full) {
        lines.textContent = "";
        (full.lines || []).forEach(function (l) { html("div", l, "line", lines); });
      });
    }

    function showCall(c, i) {
      select('[data-call="' + i + '"]');
      heading((c.kind === "model" ? "model call · " : "tool call · ") + c.name);
      field("agent", c.agent + (c.turn === null ? "" : ", turn " + c.turn));
      field("time", (c.start === null ? "?" : fmtT(c.start)) + " – " + fmtT(c.end));
      field("took", c.ms === null ? "not recorded" : fmtD(c.ms / 1000));
      if (c.kind === "model") {
        field("tokens", fmtTokens(c.prompt_tokens) + " prompt" + (c.cached_tokens ? " (" +
          fmtTokens(c.cached_tokens) + " cached)" : "") + " + " + fmtTokens(c.completion_tokens) +
          " completion" + (c.estimated ? ", estimated" : ""));
        field("cost", c.unpriced ? "price unknown (the model is not in AGENT_ROUTER_MODELS)" : fmtCost(c));
        if (c.saturated) field("saturated", c.saturated.join(", "));
      } else {
        field("server", c.server || "(built-in or host function)");
        field("outcome", c.outcome || "?");
      }
    }

    // -- now: who is blocked, on whom, for how long (counting on, on the live page)
    function blockedFor(since) { return fmtD(Math.max(0, nowT() - since)); }

    function drawNow(data) {
      nowBox.textContent = "";
      var n = data.now;
      if (!n) { nowBox.hidden = true; return; }
      nowBox.hidden = false;
      var head = html("div", null, "now-head", nowBox);
      html("b", "Now", null, head);
      head.appendChild(document.createTextNode(source.live ? " (live): " :
        " (when this page was written, " + fmtT(n.at) + "): "));
      var counts = ["running", "waiting", "scheduled"].filter(function (s) { return data.states[s]; })
        .map(function (s) { return data.states[s] + " " + stateWord(s); });
      head.appendChild(document.createTextNode(counts.length ? counts.join(", ") : "nobody is working"));
      if (!n.total) {
        html("span", " · nobody is blocked", "now-none", head);
        return;
      }
      var list = html("ul", null, "now-list", nowBox);
      var questions = new Map();
      data.questions.forEach(function (q) { questions.set(q.id, q); });
      n.blocked.forEach(function (w) {
        var li = html("li", null, "now-item", list);
        li.dataset.asker = w.asker;
        li.dataset.target = w.target;
        li.dataset.question = w.question_id;
        html("b", w.asker, "who", li);
        li.appendChild(document.createTextNode(" blocked on "));
        html("b", w.target, "whom", li);
        li.appendChild(document.createTextNode(" for "));
        var timer = html("span", blockedFor(w.since), "since", li);
        timer.dataset.since = w.since;
        li.appendChild(document.createTextNode(" · " + (w.kind === "output" ? "waits for its report" :
          "asked at " + fmtT(w.since) + ", question " + w.question_id) +
          (w.suspended ? " · suspended, no worker held" : "") +
          (w.deadline !== null ? " · expires at " + fmtT(w.deadline) : "")));
        li.title = "Show this wait";
        li.addEventListener("click", function () {
          var q = questions.get(w.question_id);
          if (q) { showQuestion(q); lanesBox.scrollIntoView({ block: "nearest" }); }
          else setFocus(w.asker);
        });
      });
      if (n.total > n.blocked.length) {
        html("li", (n.total - n.blocked.length).toLocaleString() + " more blocked", "now-more", list);
      }
    }

    // The timers of the blocked, every second on the live page.
    var ticker = source.live ? setInterval(function () {
      if (!container.isConnected) { clearInterval(ticker); return; }
      container.querySelectorAll("[data-since]").forEach(function (node) {
        node.textContent = (node.dataset.prefix || "") + blockedFor(Number(node.dataset.since));
      });
    }, 1000) : null;

    // -- tables that sort: click a heading (again: the other way)
    function sortable(box, id, caption, columns, rows, sort, onRow) {
      box.textContent = "";
      var table = html("table", null, "grid sortable", box);
      table.id = id;
      html("caption", caption, null, table);
      var headRow = html("tr", null, null, html("thead", null, null, table));
      columns.forEach(function (col) {
        var th = html("th", null, null, headRow);
        var b = html("button", col.label, "sort", th);
        b.type = "button";
        b.dataset.key = col.key;
        if (col.title) b.title = col.title;
        th.setAttribute("aria-sort", sort.key === col.key ? (sort.dir > 0 ? "ascending" : "descending") : "none");
        b.addEventListener("click", function () {
          sort.dir = sort.key === col.key ? -sort.dir : 1;
          sort.key = col.key;
          draw();
        });
      });
      var col = columns.filter(function (c) { return c.key === sort.key; })[0];
      if (col) {
        rows = rows.slice().sort(function (p, q) {
          var x = col.value(p), y = col.value(q);
          if (x === y) return 0;
          if (x === null || x === undefined) return 1;  // blanks last, either way
          if (y === null || y === undefined) return -1;
          return (x < y ? -1 : 1) * sort.dir;
        });
      }
      var body = html("tbody", null, null, table);
      rows.slice(0, MAX_ROWS).forEach(function (r) {
        var tr = html("tr", null, null, body);
        columns.forEach(function (c) {
          var td = html("td", null, c.cls || null, tr);
          if (c.cell) c.cell(td, r); else td.textContent = c.text ? c.text(r) : String(c.value(r));
        });
        if (onRow) onRow(tr, r);
      });
      if (rows.length > MAX_ROWS) html("p", (rows.length - MAX_ROWS) + " more rows: narrow the window or the filter.", "more", box);
      return table;
    }

    function windowText(data) {
      var w = windowNow(), whole = state.from <= 0 && state.to === null;
      var text = whole ? "the whole history (0 – " + fmtT(w[1]) + ")" : "the window " + fmtT(w[0]) + " – " + fmtT(w[1]);
      if (state.agent) text += ", agents matching \u201c" + state.agent + "\u201d";
      if (state.focus) text += ", focused on " + state.focus + " (its own messages only)";
      if (data.lanes.limit !== null && data.lanes.total > data.lanes.items.length) {
        text += ", this page of agents";
      }
      return text;
    }

    var STATUS_ORDER = new Map([["open", 0], ["answered", 1], ["expired", 2], ["cancelled", 3]]);

    function drawAsks(data) {
      var current = nowT();
      var waited = function (q) { return q.wait !== null ? q.wait : q.status === "open" ? current - q.asked : null; };
      var rows = data.questions.filter(function (q) { return !(q.kind === "ask" && state.hidden.has("ask")); });
      sortable(asksBox, "asks", plural(rows.length, "ask") + " and waits of the agents shown, in " + windowText(data), [
        { key: "id", label: "question", value: function (q) { return q.id; } },
        { key: "asker", label: "asker", value: function (q) { return q.asker; } },
        { key: "target", label: "target", value: function (q) { return q.target; } },
        { key: "kind", label: "kind", value: function (q) { return q.kind; },
          text: function (q) { return q.kind === "output" ? "waits for a report" : "ask"; } },
        { key: "asked", label: "asked at", value: function (q) { return q.asked; },
          text: function (q) { return fmtT(q.asked); } },
        { key: "waited", label: "waited", value: waited, cell: function (td, q) {
          var w = waited(q);
          td.textContent = w === null ? "-" : fmtD(w);
          if (q.status === "open") { td.dataset.since = q.asked; td.classList.add("open"); }
        } },
        { key: "status", label: "status", value: function (q) { return STATUS_ORDER.has(q.status) ? STATUS_ORDER.get(q.status) : 9; },
          text: function (q) { return q.status; } }
      ], rows, state.askSort, function (tr, q) {
        tr.dataset.question = q.id;
        tr.dataset.status = q.status;
        tr.title = "Show this ask and its answer in the lanes";
        tr.addEventListener("click", function () {
          showQuestion(q);
          lanesBox.scrollIntoView({ block: "nearest" });
        });
      });
    }

    function drawAgents(data) {
      var count = function (list, key) {
        var m = new Map();
        list.forEach(function (x) { var k = key(x); if (k !== null) m.set(k, (m.get(k) || 0) + 1); });
        return m;
      };
      var turns = count(data.turns, function (t) { return t.agent; });
      var sent = count(data.messages, function (m) { return m.from; });
      var received = count(data.messages, function (m) { return m.to; });
      var calls = data.calls || [];
      var models = count(calls, function (c) { return c.kind === "model" ? c.agent : null; });
      var tools = count(calls, function (c) { return c.kind === "tool" ? c.agent : null; });
      var tokens = new Map();
      calls.forEach(function (c) {
        if (c.kind === "model") tokens.set(c.agent, (tokens.get(c.agent) || 0) + (c.prompt_tokens || 0) + (c.completion_tokens || 0));
      });
      var byQuestion = new Map();
      data.questions.forEach(function (q) { byQuestion.set(q.id, q); });
      (data.now ? data.now.blocked : []).forEach(function (b) {
        if (!byQuestion.has(b.question_id)) byQuestion.set(b.question_id, { asker: b.asker, target: b.target });
      });
      var other = function (ids, end) {  // the other agent of each ask: "Team Leader (question 30)"
        return ids.map(function (id) {
          var q = byQuestion.get(id);
          return (q ? q[end] : "?") + " (question " + id + ")";
        }).join(", ");
      };
      var inWindow = "in " + windowText(data);
      var n = function (map) { return function (a) { return map.get(a.name) || 0; }; };
      sortable(agentsBox, "agents", "Agents in the lanes above; turns, calls, tokens, sent and received count " + inWindow, [
        { key: "name", label: "agent", value: function (a) { return a.name; }, cell: function (td, a) {
          var link = html("a", a.name, null, td);
          link.href = options.agentHref ? options.agentHref(a.name) : "#";
          link.title = options.onAgent ? "Read its transcript" : "Focus on it";
          link.addEventListener("click", function (ev) {
            if (options.onAgent) options.onAgent(a.name);
            else { ev.preventDefault(); setFocus(a.name); lanesBox.scrollIntoView({ block: "nearest" }); }
          });
        } },
        { key: "role", label: "role", value: function (a) { return a.role; } },
        { key: "state", label: "state", value: function (a) { return stateWord(a.state); },
          text: function (a) { return stateWord(a.state) + (a.suspended ? " (suspended)" : ""); } },
        { key: "on", label: "blocked on", title: "the agent it asked, or waits for a report from",
          value: function (a) { return a.open_questions.length ? other(a.open_questions, "target") : null; },
          text: function (a) { return other(a.open_questions, "target") || "-"; } },
        { key: "by", label: "to answer", title: "the agents waiting on its answer",
          value: function (a) { return a.questions_to_answer.length ? other(a.questions_to_answer, "asker") : null; },
          text: function (a) { return other(a.questions_to_answer, "asker") || "-"; } },
        { key: "mailbox", label: "mailbox", value: function (a) { return a.mailbox; } },
        { key: "turns", label: "turns", title: inWindow, value: n(turns) },
        { key: "model", label: "model calls", title: inWindow, value: n(models) },
        { key: "tools", label: "tool calls", title: inWindow, value: n(tools) },
        { key: "tokens", label: "tokens", title: inWindow, value: n(tokens),
          text: function (a) { return fmtTokens(tokens.get(a.name) || 0); } },
        { key: "sent", label: "sent", title: inWindow, value: n(sent) },
        { key: "received", label: "received", title: inWindow, value: n(received) },
        { key: "epoch", label: "epoch", value: function (a) { return a.epoch; } }
      ], data.lanes.items, state.agentSort, function (tr, a) {
        tr.dataset.agent = a.name;
        tr.dataset.state = a.state;
      });
    }

    window.addEventListener("resize", function () { if (container.isConnected) draw(); });

    var controller = {
      // The overview once the first piece is drawn: the first data does not wait behind it.
      refresh: function () { overviewNext = true; return load(); },
      // New events: following the end with the window whole, only the new piece is read; the
      // overview at most every five seconds.
      update: function () {
        var d = state.data, jobs = [];
        var following = d && state.to === null && d.window.complete_to >= d.window.to - 1e-9 &&
          !state.focus && !state.agent;
        jobs.push(following ? load(Math.max(state.from, d.window.complete_to - 1)) : load());
        if (Date.now() - overviewAt > 5000) {
          overviewAt = Date.now();
          jobs.push(loadOverview());
        }
        return Promise.all(jobs);
      },
      reload: load,
      reloadOverview: loadOverview,
      setWindow: setWindow,
      focus: setFocus,
      state: state
    };
    controller.ready = controller.refresh();
    return controller;
  }

  // Markers: one tip per kind and outcome shape (filled, hollow for no wake-up, a cross for a
  // refusal, a bar for the result of a wait).
  function tipShape(outcome) {
    if (outcome === "queued") return "open";
    if (outcome === "rejected") return "cross";
    if (outcome === "resolved") return "bar";
    return "full";
  }

  function markers(defs, kind) {
    var colour = KIND_COLOURS.get(kind);
    [["full", "M 0 0 L 10 5 L 0 10 z", colour, "none"],
      ["open", "M 0 0 L 10 5 L 0 10 z", "#fff", colour],
      ["cross", "M 0 0 L 10 10 M 10 0 L 0 10", "none", colour],
      ["bar", "M 0 0 L 10 5 L 0 10 z M 10 -1 L 10 11", colour, colour]].forEach(function (s) {
      var marker = el("marker", attrs(["id", "tip-" + kind + "-" + s[0], "viewBox", "-1 -2 12 14",
        "refX", 9, "refY", 5, "markerWidth", 8, "markerHeight", 8, "orient", "auto",
        "markerUnits", "userSpaceOnUse"]), defs);
      el("path", attrs(["d", s[1], "fill", s[2], "stroke", s[3], "stroke-width", 1.6]), marker);
    });
  }

  function drawLegend(box) {
    box.textContent = "";
    function group(title) {
      html("h4", title, null, box);
      return html("div", null, "legend-group", box);
    }
    function item(parent, swatch, text) {
      var row = html("span", null, "legend-item", parent);
      row.appendChild(swatch);
      row.appendChild(document.createTextNode(text));
      return row;
    }
    function swatch(cls, colour, border) {
      var node = html("i", null, cls);
      if (colour) node.style.background = colour;
      if (border) node.style.border = "1px solid " + border;
      return node;
    }
    var kinds = group("messages: colour is the kind");
    KINDS.forEach(function (k) { item(kinds, swatch("line", KIND_COLOURS.get(k)), kindName(k)); });
    var tips = group("arrow tip: the routing outcome");
    [["▶", "delivered: a new turn, read by the running turn, joined a scheduled turn"],
      ["▷", "queued, wakes nobody"], ["▶|", "became the result its asker waited for"],
      ["✕", "refused"], ["╲", "stub: the other agent is on another page"]].forEach(function (o) {
      item(tips, html("span", o[0], "glyph"), o[1]);
    });
    var turns = group("turn bars: what started them");
    TRIGGERS.forEach(function (c, k) { item(turns, swatch(null, c[0], c[1]), k.replace("_", "-")); });
    var calls = group("inside a turn");
    [["model", "model call (model · tokens)"], ["tool", "tool call"],
      ["tool-error", "tool call that failed"]].forEach(function (c) {
      item(calls, swatch("call-swatch", CALL_COLOURS.get(c[0])), c[1]);
    });
    var waits = group("on the asker's lane");
    item(waits, swatch("wait-swatch"), "a wait, answered (its length)");
    item(waits, swatch("wait-swatch open"), "blocked: no answer yet, drawn up to now");
    item(waits, html("span", "//", "glyph"), "nothing runs anywhere: time compressed");
    var states = group("the dot before a name: its state");
    STATES.forEach(function (colour, s) { item(states, swatch("state-swatch", colour), stateWord(s)); });
  }

  return {
    mount: mount, local: local, KINDS: KINDS, KIND_COLOURS: KIND_COLOURS, PAGE_LANES: PAGE_LANES,
    breaksIn: breaksIn, scale: scale, fit: fit, stateWord: stateWord
  };
})();
