// The swimlane of one team, drawn as SVG from the data agent_router.ops.timeline builds:
// a lane per agent, turns as bars coloured by trigger, messages as arrows coloured by routing
// outcome, asks linked to their answers. Hover shows a line, click the whole record.
// No library and no network: the same file is inlined in the page `agent-router timeline`
// writes and served by `agent-router web`.
"use strict";
var Swimlane = (function () {
  var SVG = "http://www.w3.org/2000/svg";
  var TRIGGER_COLOURS = {
    new: "#4c9a2a", follow_up: "#e0a100", continuation: "#2a6fdb", recovery: "#c0392b"
  };
  var OUTCOME_COLOURS = {
    triggered_new_turn: "#2e8b57", injected_inline: "#b03fb0", coalesced: "#1aa3b8",
    queued: "#999999", resolved: "#2a50c8", rejected: "#d62728"
  };
  var LANE_H = 44, LABEL_W = 170, TOP = 24, PAD = 30;

  function el(name, attrs, parent) {
    var node = document.createElementNS(SVG, name);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (parent) parent.appendChild(node);
    return node;
  }

  function titled(node, text) {
    var t = document.createElementNS(SVG, "title");
    t.textContent = text;
    node.appendChild(t);
  }

  function legend(box) {
    if (!box) return;
    var html = "<b>turns:</b> ";
    Object.keys(TRIGGER_COLOURS).forEach(function (k) {
      html += '<span><i style="background:' + TRIGGER_COLOURS[k] + '"></i>' + k + "</span>";
    });
    html += " <b>messages:</b> ";
    Object.keys(OUTCOME_COLOURS).forEach(function (k) {
      html += '<span><i style="background:' + OUTCOME_COLOURS[k] + '"></i>' + k + "</span>";
    });
    html += '<span><i style="border-top:2px dashed #7a3fb0;height:0"></i>ask / answer</span>';
    box.innerHTML = html;
  }

  function show(detail, text, node) {
    if (!detail) return;
    detail.textContent = text;
    var old = document.querySelectorAll(".selected");
    for (var i = 0; i < old.length; i++) old[i].classList.remove("selected");
    if (node) node.classList.add("selected");
  }

  function turnText(turn) {
    return "turn " + turn.id + " of " + turn.agent + " (" + turn.trigger + ", epoch " +
      turn.epoch + "): " + turn.how + "\n\n" + turn.lines.join("\n");
  }

  function messageText(m) {
    return "message " + (m.message_id === null ? "-" : m.message_id) + ": " + m.from + " -> " +
      m.to + " (" + m.type + (m.subtype ? "/" + m.subtype : "") + ")\n" +
      "outcome " + m.outcome + (m.question_id !== null ? ", question " + m.question_id : "") +
      (m.status ? ", " + m.status : "") + "\n\nledger #" + m.ledger_id + ": " + m.line +
      "\n\n" + m.content;
  }

  function draw(container, data, options) {
    options = options || {};
    var detail = options.detail || document.getElementById("detail");
    legend(options.legend || document.getElementById("legend"));
    var lanes = data.lanes, index = {};
    lanes.forEach(function (lane, i) { index[lane.name] = i; });
    var end = Math.max(data.end, 0.001);
    var width = Math.max(900, Math.min(12000, Math.round(end * 140) + LABEL_W + 2 * PAD));
    var scale = (width - LABEL_W - 2 * PAD) / end;
    var height = TOP + lanes.length * LANE_H + 10;
    var x = function (t) { return LABEL_W + PAD + t * scale; };
    var y = function (name) { return TOP + (index[name] === undefined ? 0 : index[name]) * LANE_H; };

    container.innerHTML = "";
    var svg = el("svg", { width: width, height: height, id: "swimlane-svg",
      "data-team": data.team_id, "data-last-event": data.last_event_id }, container);
    var defs = el("defs", {}, svg);
    Object.keys(OUTCOME_COLOURS).forEach(function (k) {
      var marker = el("marker", { id: "head-" + k, viewBox: "0 0 10 10", refX: 9, refY: 5,
        markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, defs);
      el("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: OUTCOME_COLOURS[k] }, marker);
    });
    for (var s = 0; s <= end; s += Math.max(1, Math.ceil(end / 12))) {
      var tick = el("text", { x: x(s), y: 14, class: "axis" }, svg);
      tick.textContent = s + "s";
    }
    lanes.forEach(function (lane, i) {
      var g = el("g", { class: "lane", "data-agent": lane.name }, svg);
      el("rect", { x: 0, y: y(lane.name), width: width, height: LANE_H,
        class: "lane-band" + (i % 2 ? " odd" : "") }, g);
      var label = el("text", { x: 6, y: y(lane.name) + LANE_H / 2 + 4,
        class: "lane-label" + (lane.outside ? " outside" : "") }, g);
      label.textContent = lane.name + (lane.state ? " · " + lane.state : "");
      titled(label, lane.name + (lane.role ? " (" + lane.role + ")" : ""));
    });
    data.turns.forEach(function (turn) {
      var stop = turn.end === null ? data.end : turn.end;
      var bar = el("rect", { x: x(turn.start), y: y(turn.agent) + 10,
        width: Math.max(4, x(stop) - x(turn.start)), height: LANE_H - 20, rx: 3,
        fill: TRIGGER_COLOURS[turn.trigger] || "#777", "data-turn": turn.id,
        "data-trigger": turn.trigger,
        class: "turn " + turn.how }, svg);
      titled(bar, turnText(turn).split("\n")[0]);
      bar.addEventListener("click", function () { show(detail, turnText(turn), bar); });
      bar.addEventListener("mouseenter", function () { show(detail, turnText(turn)); });
    });
    var asks = {};
    data.messages.forEach(function (m) {
      var x1 = x(m.t), y1 = y(m.from) + LANE_H / 2, y2 = y(m.to) + LANE_H / 2;
      if (y1 === y2) y2 += 1;
      var colour = OUTCOME_COLOURS[m.outcome] || "#555";
      var attrs = { x1: x1, y1: y1, x2: x1 + 6, y2: y2 + (y2 > y1 ? -8 : 8) };
      var line = el("line", Object.assign({ stroke: colour, class: "msg",
        "marker-end": "url(#head-" + m.outcome + ")", "data-message": m.message_id,
        "data-outcome": m.outcome, "data-type": m.type }, attrs), svg);
      var hit = el("line", Object.assign({ class: "msg-hit" }, attrs), svg);
      titled(hit, m.from + " -> " + m.to + ": " + m.type + " " + m.outcome);
      var pick = function () { show(detail, messageText(m), line); };
      hit.addEventListener("click", pick);
      hit.addEventListener("mouseenter", function () { show(detail, messageText(m)); });
      if (m.question_id !== null) {
        if (m.type === "ask") asks[m.question_id] = { x: x1, y: y2 };
        else if (asks[m.question_id]) {
          var a = asks[m.question_id], b = { x: x1, y: y1 };
          var mid = Math.min(a.y, b.y) - 14;
          el("path", { d: "M " + a.x + " " + a.y + " C " + a.x + " " + mid + ", " + b.x + " " +
            mid + ", " + b.x + " " + b.y, class: "qa-link", "data-question": m.question_id }, svg);
        }
      }
    });
    return svg;
  }

  return { draw: draw, TRIGGER_COLOURS: TRIGGER_COLOURS, OUTCOME_COLOURS: OUTCOME_COLOURS };
})();
