// leaseq dashboard: live updates. Parts of a page marked data-live (and the overview,
// which htmx polls) are refreshed every 5 s, never while the tab is hidden or while the
// user has paused them (the header's button; remembered in localStorage), and held while
// any row of a live part is selected (the job list's bulk checkboxes), so a refresh never
// drops a selection; the header says so. A refresh fetches the page's own URL, so its
// filters and keyset page (before=) are kept. A static file: the CSP allows no inline script.
(function () {
  "use strict";
  var KEY = "leaseq.live.paused";
  var paused = false;
  try { paused = window.localStorage.getItem(KEY) === "1"; } catch (e) { /* private mode */ }

  function label(button) {
    button.textContent = paused ? "Resume live updates" : "Pause live updates";
    button.setAttribute("aria-pressed", paused ? "true" : "false");
  }

  // htmx's own polling (the overview): cancelled while hidden or paused.
  document.addEventListener("htmx:beforeRequest", function (event) {
    if (paused || document.hidden) { event.preventDefault(); }
  });

  // How many rows of the live parts are selected (bulk checkboxes): while any is, the
  // refresh is held and the header's note says why.
  function selected() {
    return document.querySelectorAll("[data-live] input[type=checkbox]:checked").length;
  }

  function showHeld() {
    var note = document.querySelector(".live-held");
    if (!note) { return; }
    var n = selected();
    note.hidden = n === 0;
    note.textContent = n ? "Live updates held: " + n + " selected" : "";
  }

  function refresh() {
    if (paused || document.hidden || selected()) { return; }
    var parts = document.querySelectorAll("[data-live]");
    if (!parts.length) { return; }
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Leaseq-Live": "1" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (text) {
        if (text === null) { return; }
        var fresh = new DOMParser().parseFromString(text, "text/html");
        parts.forEach(function (part) {
          var next = part.id ? fresh.getElementById(part.id) : null;
          if (next) { part.replaceWith(document.importNode(next, true)); }
        });
      })
      .catch(function () { /* the next tick tries again */ });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var button = document.querySelector(".live-toggle");
    var live = document.querySelector("[data-live], [hx-trigger]");
    if (button && live) {
      button.hidden = false;
      label(button);
      button.addEventListener("click", function () {
        paused = !paused;
        try { window.localStorage.setItem(KEY, paused ? "1" : "0"); } catch (e) { /* ignore */ }
        label(button);
      });
    }
    document.addEventListener("change", function (event) {
      if (event.target instanceof HTMLInputElement && event.target.type === "checkbox") { showHeld(); }
    });
    showHeld();
    window.setInterval(refresh, 5000);
  });
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) { refresh(); }
  });
})();
