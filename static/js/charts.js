// Draws the page's Bokeh charts. Each chart is a slot <div data-chart="NAME"> followed by its
// json_item in <script type="application/json" id="chart-data-NAME"> (Django's json_script, which
// escapes "<", ">" and "&", so frame names holding "</script>" stay data). No inline script and no
// CustomJS: the page's CSP allows only our own scripts and BokehJS.
(function () {
  "use strict";

  function fail(slot, error) {
    slot.dataset.rendered = "error";
    slot.textContent = "This chart could not be drawn.";
    if (error) console.error("chart " + slot.dataset.chart + ":", error);
  }

  function drawAll() {
    var slots = document.querySelectorAll("[data-chart]");
    var jobs = [];
    slots.forEach(function (slot) {
      var data = document.getElementById("chart-data-" + slot.dataset.chart);
      if (!data) {
        fail(slot, "no data");
        return;
      }
      if (typeof Bokeh === "undefined") {
        fail(slot, "BokehJS did not load");
        return;
      }
      var item;
      try {
        item = JSON.parse(data.textContent);
      } catch (error) {
        fail(slot, error);
        return;
      }
      jobs.push(
        Bokeh.embed.embed_item(item, slot).then(
          function () { slot.dataset.rendered = "1"; },
          function (error) { fail(slot, error); }
        )
      );
    });
    // A marker for tests and for anyone scripting the page: every chart has been handled.
    Promise.all(jobs).then(function () {
      document.body.dataset.chartsDrawn = String(document.querySelectorAll('[data-rendered="1"]').length);
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", drawAll);
  } else {
    drawAll();
  }
})();
