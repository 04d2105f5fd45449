// The console lives: every 5 seconds the regions marked data-live are fetched again from the same URL and
// replaced (counts, result lists), unless the operator is busy in one (a checked box, a focused field, an open
// traceback). "pause refresh" stops it (remembered in this browser); the console's own script, no CDN.
(function () {
  "use strict";
  var INTERVAL = 5000;
  var KEY = "openroute.console.live";
  var regions = document.querySelectorAll("[data-live]");
  var button = document.getElementById("live-toggle");
  if (!regions.length || !button || !window.fetch || !window.DOMParser) { return; }
  var timer = null;
  var paused = window.localStorage && localStorage.getItem(KEY) === "paused";

  function busy(region) {
    return region.querySelector("input:checked, details[open]") !== null ||
      (document.activeElement && region.contains(document.activeElement) && document.activeElement !== document.body);
  }

  function refresh() {
    fetch(window.location.href, { headers: { "X-Console-Refresh": "1" }, credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html === null || paused) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live]").forEach(function (region) {
          if (!region.id || busy(region)) { return; }
          var replacement = fresh.getElementById(region.id);
          if (replacement) { region.replaceWith(document.importNode(replacement, true)); }
        });
        document.body.setAttribute("data-refreshed", String(Date.now()));
      })
      .catch(function () { /* the server is away: try again at the next tick */ });
  }

  function show() {
    button.textContent = paused ? "resume refresh" : "pause refresh";
    button.setAttribute("aria-pressed", paused ? "true" : "false");
  }

  function start() {
    if (timer === null) { timer = window.setInterval(refresh, INTERVAL); }
  }

  function stop() {
    if (timer !== null) { window.clearInterval(timer); timer = null; }
  }

  // for a look from the browser's console (and the browser test): is the refresh running?
  window.openrouteLive = { running: function () { return timer !== null; }, refresh: refresh };
  button.hidden = false;
  button.addEventListener("click", function () {
    paused = !paused;
    if (window.localStorage) { localStorage.setItem(KEY, paused ? "paused" : "live"); }
    if (paused) { stop(); } else { refresh(); start(); }
    show();
  });
  show();
  if (!paused) { start(); }
}());
