// The live page of `agent-router web`: the teams, a team's agents and its swimlane (polled
// every second and redrawn when the ledger grew), an agent's transcript with provenance.
"use strict";
(function () {
  var POLL_MS = 1000;
  var shown = { team: null, lastEvent: -1, agent: null };

  function get(url) {
    return fetch(url, { cache: "no-store" }).then(function (r) {
      if (!r.ok) throw new Error(url + ": HTTP " + r.status);
      return r.json();
    });
  }

  function text(tag, content, attrs) {
    var node = document.createElement(tag);
    node.textContent = content;
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    return node;
  }

  function teamFromHash() {
    var m = /^#\/team\/(\d+)/.exec(location.hash);
    return m ? Number(m[1]) : null;
  }

  function drawTeams(teams) {
    var nav = document.getElementById("teams");
    nav.innerHTML = "";
    teams.forEach(function (t) {
      var running = t.agents.filter(function (a) { return a.state === "running"; }).length;
      var a = text("a", "team " + t.team_id + " (" + t.agents.length + " agents, " + running +
        " running)", { href: "#/team/" + t.team_id, "data-team": t.team_id });
      nav.appendChild(a);
    });
    if (shown.team === null && teams.length && !teamFromHash()) {
      location.hash = "#/team/" + teams[teams.length - 1].team_id;
    }
  }

  function drawAgents(team) {
    var body = document.querySelector("#agents tbody");
    body.innerHTML = "";
    team.agents.forEach(function (a) {
      var row = document.createElement("tr");
      row.setAttribute("data-agent", a.name);
      row.setAttribute("data-state", a.state);
      var name = text("a", a.name, { href: "#/team/" + team.team_id + "/agent/" +
        encodeURIComponent(a.name) });
      var cell = document.createElement("td");
      cell.appendChild(name);
      row.appendChild(cell);
      [a.role, a.state + (a.suspended ? " (suspended)" : ""), a.epoch, a.mailbox,
        a.open_questions.join(",") || "-", a.questions_to_answer.join(",") || "-", a.turns,
        a.sent, a.received].forEach(function (v) { row.appendChild(text("td", String(v))); });
      body.appendChild(row);
    });
  }

  function drawTranscript(data) {
    var box = document.getElementById("transcript");
    box.innerHTML = "";
    box.appendChild(text("h2", data.agent + " (" + data.state + "): transcript"));
    data.entries.forEach(function (e) {
      var p = e.payload || {}, meta = e.meta || {};
      var entry = document.createElement("div");
      entry.className = "entry";
      entry.setAttribute("data-position", e.position);
      var head = "[" + e.position + "] " + (p.role || "?") + "  turn " +
        (e.turn_id === null ? "-" : e.turn_id);
      if (e.message_id !== null) {
        head += "  <- " + meta.type + (meta.subtype ? "/" + meta.subtype : "") + " from " +
          meta.from + " (message " + e.message_id +
          (meta.question_id ? ", question " + meta.question_id : "") + ")";
      }
      if (meta.synthetic) head += "  synthetic " + meta.synthetic;
      if (p.tool_call_id) head += "  result of " + p.tool_call_id;
      entry.appendChild(text("div", head, { class: "head" }));
      (p.tool_calls || []).forEach(function (c) {
        var fn = c["function"] || {};
        entry.appendChild(text("pre", "call " + c.id + ": " + fn.name + "(" + fn.arguments + ")"));
      });
      if (p.content) entry.appendChild(text("pre", String(p.content)));
      box.appendChild(entry);
    });
  }

  function refresh() {
    var teamId = teamFromHash();
    var agentMatch = /\/agent\/([^/]+)$/.exec(location.hash);
    var agent = agentMatch ? decodeURIComponent(agentMatch[1]) : null;
    var jobs = [get("/api/teams").then(drawTeams)];
    document.getElementById("team-view").hidden = teamId === null;
    if (teamId !== null) {
      if (teamId !== shown.team) { shown.lastEvent = -1; shown.team = teamId; }
      document.getElementById("where").textContent = "· team " + teamId;
      jobs.push(get("/api/teams/" + teamId).then(function (team) {
        drawAgents(team);
        if (team.last_event_id === shown.lastEvent) return null;
        return get("/api/teams/" + teamId + "/timeline").then(function (data) {
          shown.lastEvent = data.last_event_id;
          Swimlane.draw(document.getElementById("swimlane"), data);
        });
      }));
      if (agent !== null) {
        jobs.push(get("/api/teams/" + teamId + "/agents/" + encodeURIComponent(agent) +
          "/transcript").then(drawTranscript));
      } else {
        document.getElementById("transcript").innerHTML = "";
      }
    }
    return Promise.all(jobs).then(function () {
      document.getElementById("status").textContent = "updated " + new Date().toLocaleTimeString();
    }, function (err) {
      document.getElementById("status").textContent = String(err);
    });
  }

  function loop() { refresh().then(function () { setTimeout(loop, POLL_MS); }); }
  window.addEventListener("hashchange", refresh);
  loop();
})();
