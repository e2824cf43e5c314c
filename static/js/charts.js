// Draws the page's Bokeh charts. Each chart is a slot <div data-chart="NAME"> followed by its
// json_item in <script type="application/json" id="chart-data-NAME"> (Django's json_script, which
// escapes "<", ">" and "&", so frame names holding "</script>" stay data). No inline script and no
// CustomJS: the page's CSP allows only our own scripts and BokehJS.
// A site page embeds only its first charts (the timeline, without its hover text): slots marked
// data-later="1" get their items from the JSON at [data-charts-src] (charts.json), asked for once
// the first charts are drawn, with the timeline's hover text ("oomscope:hover", for explore.js).
// webapp/snapshots/pages/chartpage.py says which charts are which.
(function () {
  "use strict";

  // Marks for the page-speed test (tests/webapp/test_ux_huge.py): when this script ran, when the
  // first chart's embedding started and ended (performance.getEntriesByType("mark")).
  if (window.performance && performance.mark) performance.mark("oomscope:charts-js");

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

  // Charts inside a closed <details> fold are drawn when it first opens: a page shows its first
  // chart without waiting for the ones nobody has looked at yet.
  function hidden(slot) {
    var fold = slot.closest("details");
    while (fold) {
      if (!fold.open) return true;
      fold = fold.parentElement ? fold.parentElement.closest("details") : null;
    }
    return false;
  }

  var pending = 0;
  var laterItems = null; // name -> json_item, once charts.json has come
  var hoverText = {}; // timeline name -> per-point hover text, once charts.json has come
  var laterAsked = null; // the promise of charts.json

  function sendHover(slot) {
    var text = hoverText[slot.dataset.chart];
    if (text && slot.dataset.rendered === "1") {
      slot.dispatchEvent(new CustomEvent("oomscope:hover", { bubbles: true, detail: { what: text } }));
    }
  }

  function askLater() {
    if (laterAsked) return laterAsked;
    var holder = document.querySelector("[data-charts-src]");
    if (!holder) {
      laterAsked = Promise.resolve();
      return laterAsked;
    }
    laterAsked = fetch(holder.dataset.chartsSrc, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(function (body) {
        laterItems = body.charts || {};
        hoverText = body.hover || {};
        document.querySelectorAll("[data-chart]").forEach(sendHover);
      }, function (error) {
        laterItems = {};
        console.error("charts.json:", error);
      });
    return laterAsked;
  }

  // A chart is one tab stop, not one per toolbar button (a report had 21 before its first table):
  // the toolbar's buttons, inside BokehJS's shadow roots, leave the tab order, and the slot itself
  // takes focus with its caption as its name. The timeline is driven from the keyboard there
  // (explore.js: arrows pan, + and - zoom, Enter shows the state) and the event list steps events.
  function keyboardStop(slot) {
    (function unfocus(root) {
      root.querySelectorAll("*").forEach(function (node) {
        if (node.tabIndex >= 0 && node !== slot) node.tabIndex = -1;
        if (node.shadowRoot) unfocus(node.shadowRoot);
      });
    })(slot);
    slot.tabIndex = 0;
    var caption = slot.closest("figure") && slot.closest("figure").querySelector("figcaption");
    slot.setAttribute("role", "group");
    slot.setAttribute("aria-label", "Chart: " + (caption ? caption.textContent : slot.dataset.chart));
    // BokehJS may build toolbar buttons after the pass above: focus that lands inside goes to the
    // slot, and Tab from the slot moves past the chart, never into it.
    slot.addEventListener("focusin", function (event) {
      if (event.target !== slot) slot.focus({ preventScroll: true });
    });
    slot.addEventListener("keydown", function (event) {
      if (event.key !== "Tab") return;
      var stops = Array.prototype.filter.call(
        document.querySelectorAll("a[href], button, input, select, textarea, summary, [tabindex]"),
        function (node) {
          return node.tabIndex >= 0 && !node.disabled && node.getClientRects().length > 0 &&
            (node === slot || !slot.contains(node));
        }
      );
      var at = stops.indexOf(slot);
      var next = stops[at + (event.shiftKey ? -1 : 1)];
      if (next) {
        event.preventDefault();
        next.focus();
      }
    });
  }

  // On a phone a legend beside the plot takes half its width: put it below, two columns wide.
  function narrowLegends(views, slot) {
    if (slot.clientWidth >= 640 || !Bokeh.documents) return;
    Bokeh.documents.forEach(function (doc) {
      if (doc.views_manager !== views) return;
      doc.all_models.forEach(function (model) {
        if (!Array.isArray(model.right) || !Array.isArray(model.below)) return;
        var legends = model.right.filter(function (m) { return m.items !== undefined && m.orientation !== undefined; });
        if (!legends.length) return;
        legends.forEach(function (legend) { legend.setv({ orientation: "horizontal", ncols: 2 }); });
        model.setv({
          right: model.right.filter(function (m) { return legends.indexOf(m) < 0; }),
          below: model.below.concat(legends),
        });
      });
    });
  }

  function mark() {
    // A marker for tests and for anyone scripting the page: how many charts are drawn so far, set
    // once every chart asked for has been handled; chartsTotal is how many the page holds.
    document.body.dataset.chartsDrawn = String(document.querySelectorAll('[data-rendered="1"]').length);
  }

  function draw(slot) {
    if (slot.dataset.rendered) return null;
    var later = slot.dataset.later === "1";
    if (later && laterItems === null) return null; // drawSome draws it once charts.json has come
    slot.dataset.rendered = "drawing";
    var data = later ? null : document.getElementById("chart-data-" + slot.dataset.chart);
    if (later ? !laterItems[slot.dataset.chart] : !data) {
      fail(slot, "no data");
      return null;
    }
    if (typeof Bokeh === "undefined") {
      fail(slot, "BokehJS did not load");
      return null;
    }
    var item;
    try {
      item = later ? laterItems[slot.dataset.chart] : JSON.parse(data.textContent);
      definitionsFirst(item.doc);
    } catch (error) {
      fail(slot, error);
      return null;
    }
    if (!document.body.dataset.firstChartMs && performance.mark) performance.mark("oomscope:first-chart-start");
    return Bokeh.embed.embed_item(item, slot).then(
      function (views) {
        slot.dataset.rendered = "1";
        keyboardStop(slot);
        narrowLegends(views, slot);
        if (!document.body.dataset.firstChartMs) {
          if (performance.mark) performance.mark("oomscope:first-chart");
          document.body.dataset.firstChartMs = String(Math.round(performance.now()));
        }
        slot.dispatchEvent(new CustomEvent("oomscope:chart", { bubbles: true, detail: { views: views, item: item } }));
        sendHover(slot);
      },
      function (error) { fail(slot, error); }
    );
  }

  // One chart after another, in page order: the first one on screen is drawn without waiting for
  // the work of the others (BokehJS builds views on the one main thread).
  // Then charts.json, and the later charts that are in view.
  function drawSome(slots) {
    pending += 1;
    var chain = Promise.resolve();
    slots.forEach(function (slot) {
      chain = chain.then(function () { return draw(slot); });
    });
    chain
      .then(function () {
        return askLater(); // once per page; resolves at once on a page without [data-charts-src]
      })
      .then(function () {
        var waiting = Array.prototype.slice.call(document.querySelectorAll('[data-later="1"]:not([data-rendered])'));
        var inner = Promise.resolve();
        waiting.filter(function (slot) { return !hidden(slot); }).forEach(function (slot) {
          inner = inner.then(function () { return draw(slot); });
        });
        return inner;
      })
      .then(function () {
        pending -= 1;
        if (pending === 0) mark();
      });
  }

  function drawAll() {
    var slots = Array.prototype.slice.call(document.querySelectorAll("[data-chart]"));
    document.body.dataset.chartsTotal = String(slots.length);
    drawSome(slots.filter(function (slot) { return !hidden(slot); }));
    document.querySelectorAll("details").forEach(function (fold) {
      fold.addEventListener("toggle", function () {
        if (!fold.open) return;
        drawSome(Array.prototype.slice.call(fold.querySelectorAll("[data-chart]")).filter(function (slot) {
          return !hidden(slot);
        }));
      });
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", drawAll);
  } else {
    drawAll();
  }
})();
