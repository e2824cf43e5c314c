// Draws the page's Bokeh charts. Each chart is a slot <div data-chart="NAME"> followed by its
// json_item in <script type="application/json" id="chart-data-NAME"> (Django's json_script, which
// escapes "<", ">" and "&", so frame names holding "</script>" stay data). No inline script and no
// CustomJS: the page's CSP allows only our own scripts and BokehJS.
(function () {
  "use strict";

  function isDefinition(node) {
    return node.type === "object" && typeof node.id === "string" && typeof node.name === "string";
  }

  function isReference(node) {
    return typeof node.id === "string" && node.type === undefined && Object.keys(node).length === 1;
  }

  // BokehJS decodes a document in text order and needs each model's definition before any bare
  // reference {"id": ...} to it. Bokeh writes them so, but a store that reorders object keys
  // (PostgreSQL's jsonb sorts them, shorter first) can put a reference first. Walk the document in
  // BokehJS's order (defs, config, roots, callbacks; keys in order) and move each definition to
  // its first use, leaving a reference where it was.
  function definitionsFirst(doc) {
    var definitions = Object.create(null);
    var seen = Object.create(null);
    (function collect(node) {
      if (Array.isArray(node)) {
        node.forEach(collect);
      } else if (node !== null && typeof node === "object") {
        if (isDefinition(node)) definitions[node.id] = node;
        for (var key in node) collect(node[key]);
      }
    })(doc);

    function visit(holder, key) {
      var node = holder[key];
      if (Array.isArray(node)) {
        for (var i = 0; i < node.length; i++) visit(node, i);
        return;
      }
      if (node === null || typeof node !== "object") return;
      if (isReference(node)) {
        if (seen[node.id] || !definitions[node.id]) return;
        node = holder[key] = definitions[node.id];
      }
      if (isDefinition(node)) {
        if (seen[node.id]) {
          holder[key] = { id: node.id };
          return;
        }
        seen[node.id] = true;
      }
      for (var k in node) visit(node, k);
    }

    ["defs", "config", "roots", "callbacks"].forEach(function (part) {
      if (doc[part] != null) visit(doc, part);
    });
    return doc;
  }

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
        definitionsFirst(item.doc);
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
