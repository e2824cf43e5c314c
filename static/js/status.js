// Live status of an analysis: polls the page's status.json and reloads into the report when its
// first answer is stored (parts.report: the report, charts still coming; issue 34) and again when
// done (or into the failure page, which says why and what next). On a first answer's page
// (data-first-answer) it says what is still coming and reloads once done. Between polls the elapsed
// time ticks every second from the server's figure. The element <div data-status-url="..."> holds the URL.
// Polls every 0.25 s for the first 20 s (a small file's answer comes in about a second), then every 1 s.
(function () {
  "use strict";

  var box = document.querySelector("[data-status-url]");
  if (!box) return;
  var url = box.dataset.statusUrl;
  var bar = box.querySelector("progress");
  var stage = box.querySelector("[data-field=stage]");
  var state = box.querySelector("[data-field=status]");
  var elapsedField = box.querySelector("[data-field=elapsed]");
  var firstAnswer = box.dataset.firstAnswer === "1";
  var opened = Date.now();
  var delay = 250;
  function pace() {
    return Date.now() - opened < 20000 ? 250 : 1000;
  }
  var elapsed = parseFloat(box.dataset.elapsed || "0");
  var since = Date.now();

  function duration(seconds) {
    var whole = Math.max(0, Math.floor(seconds));
    return whole >= 60 ? Math.floor(whole / 60) + " min " + (whole % 60) + " s" : whole + " s";
  }

  function tick() {
    if (elapsedField) elapsedField.textContent = duration(elapsed + (Date.now() - since) / 1000);
  }

  function show(data) {
    if (state) {
      state.textContent = data.status;
      state.className = "badge " + data.status;
    }
    if (bar && typeof data.progress === "number") bar.value = data.progress;
    // The badge says the status; the stage says what runs within it, and never repeats it.
    if (stage) stage.textContent = data.stage && data.stage !== data.status ? data.stage : "";
    // What it waits for (a worker, its run's other ranks) and the estimate, which a rank waiting for its
    // peers does not get (the server sends estimate_s null then).
    var waiting = box.querySelector("[data-field=waiting_for]");
    if (waiting) {
      waiting.textContent = data.waiting_for || "";
      waiting.hidden = !data.waiting_for;
    }
    var sentence = box.querySelector("[data-field=estimate-sentence]");
    if (sentence) sentence.hidden = typeof data.estimate_s !== "number";
    var estimate = box.querySelector("[data-field=estimate]");
    if (estimate && typeof data.estimate_s === "number") estimate.textContent = duration(data.estimate_s);
    var basis = box.querySelector("[data-field=estimate_basis]");
    if (basis && data.estimate_basis) basis.textContent = data.estimate_basis;
    if (typeof data.elapsed_s === "number") {
      elapsed = data.elapsed_s;
      since = Date.now();
      tick();
    }
    var remaining = box.querySelector("[data-field=remaining]");
    if (remaining && typeof data.remaining_s === "number") remaining.textContent = duration(data.remaining_s);
    var coming = box.querySelector("[data-field=coming]");
    if (coming && data.coming && data.coming.length) coming.textContent = data.coming.join(" and ");
    var answered = !firstAnswer && data.parts && data.parts.report;
    if (data.status === "done" || data.status === "failed" || answered) {
      window.location.reload();
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
        delay = pace();
        if (show(data)) setTimeout(poll, delay);
      })
      .catch(function () {
        // The server may be restarting: back off, keep trying.
        delay = Math.min(delay * 2, 15000);
        setTimeout(poll, delay);
      });
  }

  setInterval(tick, 1000);
  setTimeout(poll, 250);
})();
