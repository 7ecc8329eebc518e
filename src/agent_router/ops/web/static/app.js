// The live page of `agent-router web`: the teams (a page at a time), a team's swimlane with who
// is blocked now, its asks and its agents' table, all drawn from one response of the server (the
// same snapshot, so a row and its lane always agree), and an agent's transcript with the
// provenance of each entry. The page follows the team's latest event and reloads what it shows
// when it changed: every second for a minute after it last moved, then by long polls the server
// answers when the team's feed moves (or after WAIT_S), which read nothing while the team is
// quiet (a server without Redis answers them at once, and the page asks every second).
// Everything the server sends is set as text, never as markup.
"use strict";
(function () {
  var POLL_MS = 1000, WAIT_S = 25, LANES = Swimlane.PAGE_LANES, MAX_ARROWS = 2500, TEAMS = 50, ENTRIES = 200;
  var shown = { team: null, controller: null, lastEvent: -1, polls: 0, teamsOffset: 0,
    entriesStart: 0, agent: null, movedAt: 0, halted: null, looping: false, waited: false,
    waiting: null };

  function get(url, signal) {
    var init = { cache: "no-store", credentials: "same-origin", signal: signal };
    return fetch(url, init).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (body) {
        if (!r.ok) {
          var err = new Error((body && body.error) || url + ": HTTP " + r.status);
          err.status = r.status;
          throw err;
        }
        return body;
      });
    });
  }

  function node(tag, text, attrs, parent) {
    var n = document.createElement(tag);
    if (text !== null && text !== undefined) n.textContent = String(text);
    (attrs || []).forEach(function (pair) { n.setAttribute(pair[0], String(pair[1])); });
    if (parent) parent.appendChild(n);
    return n;
  }

  function route() {
    var m = /^#\/team\/(\d+)(?:\/agent\/([^/]+))?$/.exec(location.hash);
    if (!m) return { team: null, agent: null };
    var agent = null;
    if (m[2]) {
      try { agent = decodeURIComponent(m[2]); } catch (e) { agent = null; }
    }
    return { team: Number(m[1]), agent: agent };
  }

  function setStatus(text) { document.getElementById("status").textContent = text; }

  // ------------------------------------------------------------------ the teams

  function ago(iso) {
    if (!iso) return "-";
    var seconds = (Date.now() - Date.parse(iso)) / 1000;
    if (seconds < 0) seconds = 0;
    if (seconds < 90) return Math.round(seconds) + " s ago";
    if (seconds < 5400) return Math.round(seconds / 60) + " min ago";
    if (seconds < 48 * 3600) return Math.round(seconds / 3600) + " h ago";
    return new Date(iso).toLocaleString();
  }

  function drawTeams(page) {
    var body = document.querySelector("#teams tbody");
    body.textContent = "";
    page.items.forEach(function (t) {
      var row = node("tr", null, [["data-team", t.team_id]], body);
      var cell = node("td", null, null, row);
      node("a", "team " + t.team_id, [["href", "#/team/" + t.team_id]], cell);
      node("td", t.agents.toLocaleString(), null, row);
      var states = Object.keys(t.states).map(function (s) { return t.states[s] + " " + Swimlane.stateWord(s); });
      node("td", states.join(", "), null, row);
      node("td", ago(t.last_event_at), [["title", t.last_event_at || ""]], row);
    });
    var pager = document.getElementById("teams-pager");
    pager.textContent = "";
    if (page.total > page.items.length || page.offset > 0) {
      var prev = node("button", "‹", [["type", "button"]], pager);
      prev.disabled = page.offset === 0;
      prev.addEventListener("click", function () {
        shown.teamsOffset = Math.max(0, page.offset - TEAMS); refresh();
      });
      node("span", "teams " + (page.offset + 1) + "–" + (page.offset + page.items.length) +
        " of " + page.total, null, pager);
      var next = node("button", "›", [["type", "button"]], pager);
      next.disabled = page.offset + page.items.length >= page.total;
      next.addEventListener("click", function () { shown.teamsOffset = page.offset + TEAMS; refresh(); });
    }
    document.getElementById("no-teams").hidden = page.total > 0;
  }

  // ------------------------------------------------------------------ a team

  function remote(teamId) {
    var base = "/api/teams/" + teamId;
    return {
      live: true,
      view: function (p) {
        var q = new URLSearchParams();
        q.set("from", String(p.from || 0));
        if (p.to !== null && p.to !== undefined) q.set("to", String(p.to));
        q.set("offset", String(p.offset || 0));
        q.set("limit", String(LANES));
        q.set("max", String(MAX_ARROWS));
        if (p.agent) q.set("agent", p.agent);
        if (p.focus) q.set("focus", p.focus);
        return get(base + "/view?" + q.toString());
      },
      overview: function () { return get(base + "/overview"); },
      message: function (m) {
        if (m.message_id === null) return Promise.resolve({ content: m.preview, lines: [] });
        return get(base + "/messages/" + m.message_id);
      },
      turn: function (t) { return get(base + "/turns/" + t.id); }
    };
  }

  // The team's agents by state, from the same response as the lanes and their table.
  function drawSummary(data) {
    var states = Object.keys(data.states).map(function (s) {
      return data.states[s] + " " + Swimlane.stateWord(s);
    });
    document.getElementById("team-summary").textContent = data.agents_total.toLocaleString() +
      " agents (" + states.join(", ") + ")";
  }

  function openTeam(teamId) {
    var box = document.getElementById("swimlane");
    box.textContent = "";
    var holder = node("div", null, null, box);  // a fresh node: the old controller detaches
    shown.team = teamId;
    shown.lastEvent = -1;
    shown.controller = Swimlane.mount(holder, remote(teamId), {
      onData: function (data) {
        shown.lastEvent = data.last_event_id;
        drawSummary(data);
      },
      // An agent's name in the table opens its transcript, below, and scrolls to it.
      agentHref: function (name) {
        return "#/team/" + teamId + "/agent/" + encodeURIComponent(name);
      },
      onAgent: function () { shown.scrollToTranscript = true; }
    });
  }

  function drawTranscript(data) {
    var box = document.getElementById("transcript");
    box.textContent = "";
    node("h2", data.agent + " (" + data.state + "): transcript", null, box);
    data.entries.forEach(function (e) {
      var p = e.payload || {}, meta = e.meta || {};
      var entry = node("div", null, [["class", "entry"], ["data-position", e.position]], box);
      var head = "[" + e.position + "] " + (p.role || "?") + "  turn " +
        (e.turn_id === null ? "-" : e.turn_id);
      if (e.message_id !== null) {
        head += "  <- " + meta.type + (meta.subtype ? "/" + meta.subtype : "") + " from " +
          meta.from + " (message " + e.message_id +
          (meta.question_id ? ", question " + meta.question_id : "") + ")";
      }
      if (meta.synthetic) head += "  synthetic " + meta.synthetic;
      if (meta.ms !== undefined) {
        head += "  " + meta.tool + (meta.server ? " (" + meta.server + ")" : "") + " took " +
          meta.ms + " ms: " + meta.outcome;
      }
      if (p.tool_call_id) head += "  result of " + p.tool_call_id;
      node("div", head, [["class", "head"]], entry);
      (p.tool_calls || []).forEach(function (c) {
        var fn = c["function"] || {};
        node("pre", "call " + c.id + ": " + fn.name + "(" + fn.arguments + ")", null, entry);
      });
      if (p.content) node("pre", String(p.content), null, entry);
    });
    if (shown.scrollToTranscript) {
      shown.scrollToTranscript = false;
      box.scrollIntoView({ block: "start" });
    }
    var pager = node("div", null, [["class", "pager"]], box);
    if (data.start > 0) {
      node("button", "‹ earlier", [["type", "button"]], pager).addEventListener("click", function () {
        shown.entriesStart = Math.max(0, data.start - data.limit); refresh();
      });
    }
    if (data.entries.length >= data.limit) {
      node("button", "later ›", [["type", "button"]], pager).addEventListener("click", function () {
        shown.entriesStart = data.start + data.limit; refresh();
      });
    }
  }

  // ------------------------------------------------------------------ polling

  function refresh() {
    var where = route();
    var jobs = [];
    document.getElementById("team-view").hidden = where.team === null;
    document.getElementById("teams-view").hidden = where.team !== null;
    document.getElementById("where").textContent = where.team === null ? "· teams" :
      "· team " + where.team;
    document.title = where.team === null ? "agent-router" : "agent-router · team " + where.team;
    if (where.team === null) {
      shown.team = null;
      jobs.push(get("/api/teams?offset=" + shown.teamsOffset + "&limit=" + TEAMS).then(drawTeams));
    } else {
      var team = where.team;
      shown.polls += 1;
      // Quiet for a minute: a long poll from the latest event the page has.
      var follow = team === shown.team && shown.lastEvent !== -1 &&
        Date.now() - shown.movedAt >= 60000;
      var ask = "/api/teams/" + team + (follow ?
        "?after=" + shown.lastEvent + "&wait=" + WAIT_S : "");
      shown.waiting = new AbortController();
      shown.waited = false;
      jobs.push(get(ask, shown.waiting.signal).then(function (t) {
        if (route().team !== team) return null;  // another team was opened meanwhile
        shown.waited = t.waited;
        // The team is read first: a team the server does not have is said, not drawn.
        if (team !== shown.team) { openTeam(team); return null; }
        // Reload when the ledger moved; and, for a minute after it last moved, every ten
        // polls whatever it says: an event committed after a later one is only seen then.
        if (t.last_event_id !== shown.lastEvent) {
          shown.movedAt = Date.now();
          return shown.controller.update();
        }
        if (shown.polls % 10 === 0 && Date.now() - shown.movedAt < 60000) {
          return shown.controller.refresh();
        }
        return null;
      }, function (err) {
        if (err && err.name === "AbortError") return null;  // the page moved on
        if (err && err.status === 404) showMissing(team, err.message);
        throw err;
      }));
      if (where.agent !== shown.agent) { shown.agent = where.agent; shown.entriesStart = 0; }
      if (where.agent !== null) {
        jobs.push(get("/api/teams/" + where.team + "/agents/" + encodeURIComponent(where.agent) +
          "/transcript?start=" + shown.entriesStart + "&limit=" + ENTRIES).then(drawTranscript));
      } else {
        document.getElementById("transcript").textContent = "";
      }
    }
    return Promise.all(jobs).then(function () {
      setStatus("updated " + new Date().toLocaleTimeString());
    }, function (err) {
      setStatus(String(err && err.message || err));
    });
  }

  // A team the server does not have: said in the page, in place of its lanes, and no longer
  // polled (until another address is opened, or "try again" is clicked: a team made since).
  function showMissing(teamId, message) {
    shown.halted = teamId;
    shown.team = null;
    shown.controller = null;
    document.getElementById("swimlane").textContent = "";
    document.getElementById("team-summary").textContent = "";
    var box = document.getElementById("team-error");
    box.textContent = "";
    node("strong", message, null, box);
    node("span", " — this page no longer asks the server about team " + teamId + ". ", null, box);
    node("a", "See the teams there are", [["href", "#/"]], box);
    node("span", " or ", null, box);
    node("button", "try again", [["type", "button"]], box).addEventListener("click", resume);
    box.hidden = false;
  }

  function resume() {
    if (shown.waiting) shown.waiting.abort();  // a long poll for what was shown
    shown.halted = null;
    document.getElementById("team-error").hidden = true;
    if (shown.looping) refresh(); else loop();
  }

  function loop() {
    if (shown.halted !== null && route().team === shown.halted) {
      shown.looping = false;
      setStatus("stopped: team " + shown.halted + " does not exist");
      return;
    }
    shown.looping = true;
    // A long poll that waited asks again at once: it was the wait.
    refresh().then(function () { setTimeout(loop, shown.waited ? 0 : POLL_MS); });
  }
  window.addEventListener("hashchange", resume);
  loop();
})();
