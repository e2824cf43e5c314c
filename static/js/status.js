// Live status of an analysis: polls the page's status.json and reloads into the report when done.
// The element <div data-status-url="..."> holds the URL; nothing is inline.
(function () {
  "use strict";

  var box = document.querySelector("[data-status-url]");
  if (!box) return;
  var url = box.dataset.statusUrl;
  var bar = box.querySelector("progress");
  var stage = box.querySelector("[data-field=stage]");
  var state = box.querySelector("[data-field=status]");
  var error = box.querySelector("[data-field=error]");
  var delay = 1000;

  function show(data) {
    if (state) {
      state.textContent = data.status;
      state.className = "badge " + data.status;
    }
    if (bar && typeof data.progress === "number") bar.value = data.progress;
    if (stage) stage.textContent = data.stage || "";
    if (data.status === "done") {
      window.location.reload();
      return false;
    }
    if (data.status === "failed") {
      if (error) {
        error.hidden = false;
        error.textContent = (data.error && data.error.message) || "The analysis failed.";
      }
      if (bar) bar.hidden = true;
      return false;
    }
    return true;
  }

  function poll() {
    fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.json();
      })
      .then(function (data) {
        delay = 1000;
        if (show(data)) setTimeout(poll, delay);
      })
      .catch(function () {
        // The server may be restarting: back off, keep trying.
        delay = Math.min(delay * 2, 15000);
        setTimeout(poll, delay);
      });
  }

  setTimeout(poll, 500);
})();
