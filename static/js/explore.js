// Digging into the timeline, with BokehJS's own API and no CustomJS (the CSP forbids eval):
// - zoom: when the timeline's x range changes (a Document change event), fetch the events of the
//   visible range at screen resolution from <base>timeline.json and put them in the chart's source;
// - tap: fetch the allocator's state after that event from <base>state.json and draw its segments
//   and blocks below the chart; clicking a block fetches its allocation and free stacks.
// Every text from the server goes in with textContent: frame names are data, never markup.
(function () {
  "use strict";

  var ZOOM_DELAY_MS = 150;

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (key) {
        if (key === "class") node.className = attrs[key];
        else if (key === "style") node.style.cssText = attrs[key];
        else node.setAttribute(key, attrs[key]);
      });
    }
    if (text != null) node.textContent = String(text);
    return node;
  }

  function thousands(n) {
    return Number(n).toLocaleString("en-US");
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (r) {
      return r.json().then(function (body) {
        if (!r.ok) {
          var error = new Error((body.error && body.error.message) || "HTTP " + r.status);
          error.status = r.status;
          error.code = body.error && body.error.code;
          throw error;
        }
        return body;
      });
    });
  }

  function seriesOf(body) {
    var data = {
      x: body.index,
      reserved: body.reserved_bytes,
      allocated: body.allocated_bytes,
      requested: body.requested_bytes,
      largest_free: body.largest_free_bytes,
      fragmentation: body.external_fragmentation,
      what: body.what,
    };
    if (body.time_us && body.time_us.length) {
      var first = body.first_time_us;
      data.t = body.time_us.map(function (t) { return (t - first) / 1e6; });
    }
    return data;
  }

  // The range of the timeline's visible lines (a line hidden from its legend does not count) over
  // ``data``, with 6% room above and below and never below zero; null when nothing is drawn.
  function ySpan(figure, source) {
    var data = source.data;
    var lo = Infinity;
    var hi = -Infinity;
    figure.renderers.forEach(function (r) {
      var y = r.glyph && r.glyph.y;
      var field = y && (typeof y === "string" ? y : y.field);
      if (!r.visible || r.data_source !== source || !field || !data[field]) return;
      data[field].forEach(function (v) {
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      });
    });
    if (!(hi >= lo)) return null;
    var room = Math.max((hi - lo) * 0.06, hi * 0.002, 1);
    return [Math.max(0, lo - room), hi + room];
  }

  var actives = {}; // device -> {doc, source, figure, slot}
  var timelines = {}; // device -> function(t0, t1, px) asking for the bands of a range

  function docOf(views) {
    var found = null;
    (Bokeh.documents || []).forEach(function (d) { if (d.views_manager === views) found = d; });
    return found;
  }

  function setupActive(slot, views) {
    var device = slot.dataset.chart.slice("active-".length);
    var doc = docOf(views);
    if (!doc) return;
    actives[device] = {
      doc: doc,
      slot: slot,
      source: doc.get_model_by_name("active-source"),
      figure: doc.get_model_by_name("active-figure"),
    };
    if (timelines[device]) timelines[device]();
  }

  function fillActive(base, device, t0, t1, px) {
    fillBands(segtimes[device], "segments", base, device, t0, t1, px);
    var active = actives[device];
    if (!active) return;
    active.slot.dataset.active = "loading";
    getJSON(base + "active.json?device=" + device + "&t0=" + t0 + "&t1=" + t1 + "&px=" + px).then(function (body) {
      active.source.data = body.data;
      active.figure.x_range.start = t0;
      active.figure.x_range.end = t1;
      // The y range is fixed (no automatic range over an empty source): the stack's top, with room.
      var top = 0;
      (body.data.ys || []).forEach(function (ys) { ys.forEach(function (y) { if (y > top) top = y; }); });
      active.figure.y_range.start = 0;
      active.figure.y_range.end = top > 0 ? top * 1.05 : 1;
      active.slot.dataset.active = "1";
      active.slot.dataset.activeBands = String(body.bands);
      active.slot.dataset.activeRange = body.start + "-" + body.end;
    }, function (error) {
      active.slot.dataset.active = "error";
      if (!linkGone(error)) console.warn("active memory:", error.message);
    });
  }

  // The segment timeline (memory_viz's "active cached segment timeline"): bands from segments.json,
  // following the timeline's range as the active-memory chart does.
  var segtimes = {}; // device -> {doc, source, figure, slot}

  function setupSegtime(slot, views) {
    var device = slot.dataset.chart.slice("segtime-".length);
    var doc = docOf(views);
    if (!doc) return;
    segtimes[device] = {
      doc: doc,
      slot: slot,
      source: doc.get_model_by_name("segtime-source"),
      figure: doc.get_model_by_name("segtime-figure"),
    };
    if (timelines[device]) timelines[device]();
  }

  function fillBands(chart, kind, base, device, t0, t1, px) {
    if (!chart) return;
    chart.slot.dataset.bands = "loading";
    getJSON(base + kind + ".json?device=" + device + "&t0=" + t0 + "&t1=" + t1 + "&px=" + px).then(function (body) {
      chart.source.data = body.data;
      var top = 0;
      (body.data.ys || []).forEach(function (ys) { ys.forEach(function (y) { if (y > top) top = y; }); });
      chart.figure.x_range.setv({ start: t0, end: t1 });
      chart.figure.y_range.setv({ start: 0, end: top > 0 ? top * 1.05 : 1 });
      chart.slot.dataset.bands = String(body.bands);
      chart.slot.dataset.segments = String(body.segments);
      chart.slot.dataset.bandsRange = body.start + "-" + body.end;
    }, function (error) {
      chart.slot.dataset.bands = "error";
      if (!linkGone(error)) console.warn(kind + ":", error.message);
    });
  }

  function setup(slot, views) {
    var fold = slot.closest("[data-explore-base]");
    if (!fold || !views || typeof Bokeh === "undefined") return;
    var base = fold.dataset.exploreBase;
    var device = fold.dataset.device || "0";
    // embed_item resolves to the ViewManager of the Document it made.
    var doc = docOf(views);
    if (doc == null) return;
    var source = doc.get_model_by_name("timeline-source");
    var figure = doc.get_model_by_name("timeline-figure");
    if (!source || !figure) return;
    var xr = figure.x_range;
    var zoomed = false; // the source holds a zoom answer (with its own hover text), not the page's points
    var timer = null;
    var asked = 0;
    var panel = document.getElementById("state-" + device);
    var full = [xr.start, xr.end]; // the whole trace, as the page drew it
    var fullTop = figure.y_range.end; // up to the limit, as the page drew it

    function visible() {
      return [Math.max(0, Math.floor(xr.start)), Math.ceil(xr.end), Math.max(100, Math.round(slot.getBoundingClientRect().width))];
    }
    timelines[device] = function () {
      var v = visible();
      fillActive(base, device, v[0], v[1], v[2]);
    };
    if (actives[device]) timelines[device]();

    function fetchWindow() {
      var v = visible();
      var t0 = v[0];
      var t1 = v[1];
      var px = v[2];
      fillActive(base, device, t0, t1, px);
      var ticket = ++asked;
      slot.dataset.zoom = "loading";
      getJSON(base + "timeline.json?device=" + device + "&t0=" + t0 + "&t1=" + t1 + "&px=" + px).then(
        function (body) {
          if (ticket !== asked) return; // a newer range was asked for meanwhile
          zoomed = true;
          body.first_time_us = firstTimeUs;
          source.data = seriesOf(body);
          // The y axis follows the window: from the lowest to the highest point of the lines shown,
          // with room (issue 20: it stayed at the whole trace's scale, a zoomed detail a flat line at
          // the bottom; issue 35: it kept 0, so a 50 MiB swing at 5 GiB was still flat).
          var whole = t0 <= full[0] && t1 >= full[1];
          var span = whole ? null : ySpan(figure, source);
          if (whole) figure.y_range.setv({ start: 0, end: fullTop });
          else if (span) figure.y_range.setv({ start: span[0], end: span[1] });
          slot.dataset.zoomY = String(Math.round(figure.y_range.start)) + "-" + String(Math.round(figure.y_range.end));
          slot.dataset.zoom = "1";
          slot.dataset.zoomPoints = String(body.points);
          slot.dataset.zoomElided = String(body.elided || 0);
          slot.dataset.zoomFullDetail = String(body.full_detail);
          slot.dataset.zoomRange = body.start + "-" + body.end;
        },
        function (error) {
          slot.dataset.zoom = "error";
          if (!linkGone(error)) console.warn("zoom detail:", error.message);
        }
      );
    }

    // The trace's first timestamp, so fetched points show seconds after it as the page's do.
    var firstTimeUs = null;
    getJSON(base + "timeline.json?device=" + device + "&t0=0&t1=1&px=16").then(function (body) {
      firstTimeUs = body.time_us && body.time_us.length ? body.time_us[0] : 0;
      slot.dataset.exploreReady = "1";
    }, function () { slot.dataset.exploreReady = "error"; });

    doc.on_change(function (event) {
      // A line hidden or shown from the legend: a zoomed view's y axis fits the lines left.
      if (event.attr === "visible" && zoomed && figure.renderers.indexOf(event.model) >= 0) {
        var span = xr.start <= full[0] && xr.end >= full[1] ? null : ySpan(figure, source);
        if (span) figure.y_range.setv({ start: span[0], end: span[1] });
        return;
      }
      if (event.model !== xr || (event.attr !== "start" && event.attr !== "end")) return;
      clearTimeout(timer);
      timer = setTimeout(fetchWindow, ZOOM_DELAY_MS);
    });

    // The page's points come without their hover text; charts.js brings it from charts.json.
    slot.addEventListener("oomscope:hover", function (event) {
      var what = event.detail && event.detail.what;
      var now = source.data.what;
      if (zoomed || !what || !now || now.length !== what.length) return;
      source.data = Object.assign({}, source.data, { what: what });
      slot.dataset.hover = "1";
    });

    figure.on_event("tap", function (event) {
      openEvents(Math.round(event.x));
    });

    // The keyboard drives the timeline where its slot has focus (charts.js makes it one tab stop):
    // arrows pan a tenth of the view, + and - zoom by two around the middle, Home shows the whole
    // trace, Enter shows the allocator's state at the middle event.
    slot.addEventListener("keydown", function (event) {
      var start = xr.start;
      var end = xr.end;
      var width = end - start;
      var middle = (start + end) / 2;
      var lo = full[0];
      var hi = full[1];
      if (event.key === "ArrowLeft" || event.key === "ArrowRight") {
        var step = (event.key === "ArrowLeft" ? -1 : 1) * Math.max(1, width / 10);
        step = Math.max(lo - start, Math.min(hi - end, step));
        xr.setv({ start: start + step, end: end + step });
      } else if (event.key === "+" || event.key === "=") {
        var half = Math.max(2, width / 4);
        xr.setv({ start: Math.max(lo, middle - half), end: Math.min(hi, middle + half) });
      } else if (event.key === "-" || event.key === "_") {
        var wide = width;
        xr.setv({ start: Math.max(lo, middle - wide), end: Math.min(hi, middle + wide) });
      } else if (event.key === "Home") {
        xr.setv({ start: lo, end: hi });
      } else if (event.key === "Enter") {
        openEvents(Math.round(middle));
      } else {
        return;
      }
      event.preventDefault();
    });
    figure._update_event_callbacks(); // subscribe the figure to its UI events (on_event alone does not)

    // The panel holds the event list (left) and the allocator's state after the selected event (right).
    var events = null;

    function openEvents(index) {
      if (!panel) return;
      if (!events) {
        events = eventList(panel, base, device, function (i) {
          // The same event on the timeline: a vertical line (reports analysed before it have none).
          var cursor = doc.get_model_by_name("timeline-cursor");
          if (cursor) cursor.setv({ location: i, visible: true });
        });
      }
      events.open(index);
    }
    var opener = document.querySelector('[data-open-events="' + device + '"]');
    if (opener) {
      opener.hidden = false;
      opener.addEventListener("click", function () {
        openEvents(parseInt(opener.dataset.event, 10));
        events.focus();
      });
    }
  }

  // memory_viz's event list: every event of the trace (free_requested halves too) in one listbox,
  // virtualised: a spacer as tall as all the rows, only the rows in view drawn, their text read a
  // page at a time from <base>events.json. Under it, the selected event's whole stack; beside it,
  // the allocator's state after that event. ↑/↓ one event, Page Up/Down forty, Home/End the ends.
  var ROW_PX = 24; // .event-list [role=option] is this tall (oomscope.css)
  var EVENTS_PAGE = 200;
  var PAGE_STEP = 40;

  function eventList(panel, base, device, onSelect) {
    panel.textContent = "";
    var box = el("div", { class: "events" });
    box.appendChild(el("h3", { id: "events-title-" + device }, "Events"));
    box.appendChild(el("p", { class: "meta" }, "Every event of the trace. ↑/↓ one event, Page Up/Down forty, Home/End the first and the last; the state follows."));
    var listBox = el("div", { class: "event-list", role: "listbox", tabindex: "0", "aria-labelledby": "events-title-" + device });
    var spacer = el("div", { class: "event-rows", role: "presentation" });
    listBox.appendChild(spacer);
    box.appendChild(listBox);
    var stackView = el("div", { class: "event-stack", "aria-live": "polite" });
    box.appendChild(stackView);
    var stateView = el("div", { class: "state-view", "aria-live": "polite" });
    panel.appendChild(box);
    panel.appendChild(stateView);

    var total = 0; // events in the trace, known from the first page read
    var pages = {}; // page -> events.json answer, "loading", or an Error
    var selected = -1;
    var stateTimer = null;
    var stateTicket = 0;
    var drawPending = false;

    function loadPage(page, then) {
      if (pages[page]) return;
      pages[page] = "loading";
      getJSON(base + "events.json?device=" + device + "&start=" + page * EVENTS_PAGE + "&count=" + EVENTS_PAGE).then(function (body) {
        pages[page] = body;
        if (!total) {
          total = body.events;
          spacer.style.height = total * ROW_PX + "px";
          listBox.dataset.events = String(total);
        }
        if (then) then();
        draw();
      }, function (error) {
        pages[page] = error;
        listBox.dataset.error = error.message;
        stackView.textContent = linkGone(error) ? error.message : "The events could not be read: " + error.message;
      });
    }

    function rowFor(i) {
      var option = el("div", { role: "option", id: "event-" + device + "-" + i, "data-event": String(i), "aria-selected": "false", "aria-posinset": String(i + 1), "aria-setsize": String(total) });
      option.style.top = i * ROW_PX + "px";
      option.appendChild(el("span", { class: "event-index mono" }, thousands(i)));
      option.appendChild(el("span", { class: "event-what" }, "…"));
      option.addEventListener("click", function () { select(i); listBox.focus(); });
      return option;
    }

    // Draw the rows in view (and a few either side); drop the others.
    function draw() {
      drawPending = false;
      if (!total) return;
      var first = Math.max(0, Math.floor(listBox.scrollTop / ROW_PX) - 8);
      var last = Math.min(total - 1, Math.ceil((listBox.scrollTop + listBox.clientHeight) / ROW_PX) + 8);
      var shown = {};
      Array.prototype.slice.call(spacer.children).forEach(function (row) {
        var i = parseInt(row.dataset.event, 10);
        if (i < first || i > last) spacer.removeChild(row);
        else shown[i] = row;
      });
      for (var i = first; i <= last; i++) {
        var row = shown[i] || spacer.appendChild(rowFor(i));
        var page = pages[Math.floor(i / EVENTS_PAGE)];
        if (!page) loadPage(Math.floor(i / EVENTS_PAGE));
        if (page && page.what && row.dataset.read !== "1") {
          var text = page.what[i - page.start];
          row.lastChild.textContent = text;
          row.title = thousands(i) + ": " + text;
          row.dataset.action = page.action[i - page.start];
          row.dataset.read = "1";
        }
        row.setAttribute("aria-selected", i === selected ? "true" : "false");
      }
      listBox.dataset.drawn = first + "-" + last;
    }

    listBox.addEventListener("scroll", function () {
      if (drawPending) return;
      drawPending = true;
      window.requestAnimationFrame(draw);
    });

    function select(index) {
      if (!total) return;
      index = Math.max(0, Math.min(total - 1, index));
      selected = index;
      var top = index * ROW_PX;
      var view = listBox.clientHeight;
      if (top < listBox.scrollTop - ROW_PX * 4 || top > listBox.scrollTop + view + ROW_PX * 4) {
        listBox.scrollTop = Math.max(0, top - view / 2); // a jump: the event in the middle
      } else if (top < listBox.scrollTop) {
        listBox.scrollTop = top;
      } else if (top + ROW_PX > listBox.scrollTop + view) {
        listBox.scrollTop = top + ROW_PX - view;
      }
      draw();
      listBox.setAttribute("aria-activedescendant", "event-" + device + "-" + index);
      listBox.dataset.selected = String(index);
      onSelect(index);
      clearTimeout(stateTimer);
      stateTimer = setTimeout(function () { showState(index); }, 80); // holding a key asks once it rests
    }

    listBox.addEventListener("keydown", function (event) {
      var moves = { ArrowDown: 1, ArrowUp: -1, PageDown: PAGE_STEP, PageUp: -PAGE_STEP };
      var target;
      if (event.key in moves) target = selected + moves[event.key];
      else if (event.key === "Home") target = 0;
      else if (event.key === "End") target = total - 1;
      else return;
      event.preventDefault();
      select(target);
    });

    function showState(index) {
      var ticket = ++stateTicket;
      panel.dataset.state = "loading";
      getJSON(base + "state.json?device=" + device + "&i=" + index).then(function (state) {
        if (ticket !== stateTicket) return; // a later event was asked for meanwhile
        drawStack(stackView, state.event);
        drawState(stateView, state, base, device);
        panel.dataset.state = String(index);
      }, function (error) {
        panel.dataset.state = "error";
        stateView.textContent = linkGone(error) ? error.message : "The state could not be read: " + error.message;
      });
    }

    return {
      open: function (index) {
        var page = Math.floor(Math.max(0, index) / EVENTS_PAGE);
        if (total) select(index);
        else loadPage(page, function () { select(index); });
      },
      focus: function () { listBox.focus(); },
    };
  }

  // The selected event's whole stack under the list, as memory_viz shows it (C++ frames folded).
  function drawStack(view, ev) {
    view.textContent = "";
    if (!ev) return;
    view.dataset.event = String(ev.index);
    view.appendChild(el("h4", null, "Event " + thousands(ev.index) + ": " + ev.text));
    var frames = ev.frames || [];
    if (frames.length) view.appendChild(frameList(frames));
    else view.appendChild(el("p", { class: "meta" }, ev.label ? "No frames: " + ev.label + "." : "No frames recorded for this event."));
  }

  // A share link revoked while its page is open: every later request is a 404; say so once, at the top.
  function linkGone(error) {
    if (!(error.status === 404 && error.code === "not-found" && /^\/r\//.test(window.location.pathname))) return false;
    if (!document.getElementById("link-gone")) {
      var note = el("p", { id: "link-gone", class: "notice error link-gone", role: "alert" }, error.message);
      var main = document.querySelector("main") || document.body;
      main.insertBefore(note, main.firstChild);
    }
    document.querySelectorAll(".state-panel").forEach(function (p) { p.dataset.gone = "1"; });
    return true;
  }

  // A colour per stack (the label), so a block reads as "the same code" across segments and events.
  var PALETTE = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#ccb974", "#64b5cd", "#8c564b"];
  function colourOf(label) {
    var h = 0;
    for (var i = 0; i < label.length; i++) h = (h * 31 + label.charCodeAt(i)) | 0;
    return PALETTE[Math.abs(h) % PALETTE.length];
  }

  function drawState(view, state, base, device) {
    view.textContent = "";
    var ev = state.event;
    view.appendChild(el("h3", null, ev ? "After event " + thousands(ev.index) + " (" + ev.text + ")" : "Before the first event"));
    var dl = el("dl", { class: "state-figures" });
    [
      ["allocated", state.allocated_bytes, state.allocated_text],
      ["requested", state.requested_bytes, state.requested_text],
      ["reserved", state.reserved_bytes, state.reserved_text],
      ["free in the cache", state.cached_free_bytes, state.cached_free_text],
      ["largest free block", state.largest_free_bytes, state.largest_free_text],
    ].forEach(function (row) {
      dl.appendChild(el("dt", null, row[0]));
      dl.appendChild(el("dd", { "data-figure": row[0], "data-bytes": String(row[1]) }, row[2] + " (" + thousands(row[1]) + " B)"));
    });
    view.appendChild(dl);
    // Compact: every segment, in address order, as a box whose width is its share of reserved memory
    // (about six rows for the whole cache), each block inside coloured by the code that allocated it;
    // free blocks pale, pending frees hatched. Hover for the sizes and the stack; click a block.
    var reserved = Math.max(1, state.reserved_bytes);
    view.appendChild(el("p", { class: "meta" }, state.segments.length + " segments, in address order, each as wide as its share of the " + state.reserved_text + " reserved; a block's colour is the code that allocated it (pale: free, yellow: pending free). Click a block, or Tab to the map and move with the arrow keys, for its details and stacks."));
    if (state.truncated) view.appendChild(el("p", { class: "meta" }, "Listed: the first of them in address order; the state holds " + thousands(state.segments_total) + " segments and " + thousands(state.blocks_total) + " blocks."));
    var detail = el("div", { class: "block-detail", "aria-live": "polite" });
    var list = el("div", { class: "state-segments compact", role: "group", "aria-label": "Segments and blocks after event " + (ev ? thousands(ev.index) : "none") });
    var boxes = [];
    state.segments.forEach(function (seg) {
      var share = Math.min(100, (600 * seg.size) / reserved);
      var row = el("span", {
        class: "segment",
        "data-address": seg.address,
        title: seg.address + " " + seg.size_text,
        style: "flex-basis:" + share + "%",
      });
      var bar = el("span", { class: "segment-bar" });
      seg.blocks.forEach(function (b) {
        var what = b.size_text + " " + b.state.replace(/_/g, " ") + (b.label ? " · " + b.label : "") + " (segment " + seg.address + ")";
        var attrs = {
          class: "block " + b.state,
          style: "width:" + (100 * b.size) / seg.size + "%",
          title: what,
          role: "button",
          tabindex: boxes.length ? "-1" : "0",
          "aria-label": "Block " + b.address + ", " + what,
          "data-size": String(b.size),
        };
        if (b.state === "active_allocated" && b.label) attrs.style += ";background:" + colourOf(b.label);
        var box = el("span", attrs);
        if (b.alloc_event != null) box.dataset.alloc = String(b.alloc_event);
        box.addEventListener("focus", function () { showBlock(detail, b, seg, base, device); });
        boxes.push(box);
        bar.appendChild(box);
      });
      row.appendChild(bar);
      list.appendChild(row);
    });
    // One tab stop for the map; the arrows go block by block in address order, Home/End to the ends.
    list.addEventListener("keydown", function (event) {
      var at = boxes.indexOf(document.activeElement);
      var moves = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 };
      var to;
      if (event.key in moves) to = at + moves[event.key];
      else if (event.key === "Home") to = 0;
      else if (event.key === "End") to = boxes.length - 1;
      else return;
      event.preventDefault();
      to = Math.max(0, Math.min(boxes.length - 1, to));
      if (at >= 0) boxes[at].setAttribute("tabindex", "-1");
      boxes[to].setAttribute("tabindex", "0");
      boxes[to].focus();
    });
    view.appendChild(list);
    view.appendChild(detail);
  }

  // C++ frames (no .py file: the unwinder's, the dispatcher's, autograd's) are folded by default, a run
  // of them behind one "N C++ frames" line, as memory_viz filters them: the Python frames tell the story.
  function isPython(f) {
    return !!f.filename && /\.py$/.test(f.filename);
  }

  function frameItem(f) {
    var li = el("li", null, f.name + " ");
    if (f.filename) li.appendChild(el("span", { class: "file" }, f.filename + ":" + f.line));
    return li;
  }

  function frameList(frames) {
    var ol = el("ol", { class: "frames-list" });
    var run = [];
    function flush() {
      if (!run.length) return;
      var li = el("li", { class: "cpp-run" });
      var fold = el("details", { class: "cpp-frames" });
      fold.appendChild(el("summary", null, run.length + " C++ frame" + (run.length === 1 ? "" : "s")));
      var inner = el("ol", null);
      run.forEach(function (f) { inner.appendChild(frameItem(f)); });
      fold.appendChild(inner);
      li.appendChild(fold);
      ol.appendChild(li);
      run = [];
    }
    frames.forEach(function (f) {
      if (isPython(f)) {
        flush();
        ol.appendChild(frameItem(f));
      } else {
        run.push(f);
      }
    });
    flush();
    return ol;
  }

  // A block's details at once (its figures, its stack's label), then its allocation and free stacks.
  var blockTimer = null;
  function showBlock(detail, block, seg, base, device) {
    detail.textContent = "";
    delete detail.dataset.alloc;
    detail.dataset.block = block.address;
    var facts = block.size_text + " (" + thousands(block.size) + " B" + (block.requested && block.requested !== block.size ? ", " + thousands(block.requested) + " B requested" : "") + "), " + block.state.replace(/_/g, " ");
    detail.appendChild(el("h4", null, "Block " + block.address + " at +" + thousands(block.offset) + " B in segment " + seg.address + " (" + seg.size_text + ")"));
    detail.appendChild(el("p", { class: "block-facts" }, facts + (block.label ? "; allocated by " + block.label : "") + "."));
    clearTimeout(blockTimer);
    if (block.alloc_event == null) {
      detail.appendChild(el("p", { class: "meta" }, block.state === "inactive" ? "Free: cached by the allocator, no stack." : "Allocated before the trace began: its stacks are not recorded."));
      return;
    }
    var stacks = el("div", { class: "block-stacks" }, "Reading the block's stacks…");
    detail.appendChild(stacks);
    blockTimer = setTimeout(function () {
      getJSON(base + "block.json?device=" + device + "&alloc=" + block.alloc_event).then(function (info) {
        if (detail.dataset.block !== block.address) return; // another block was chosen meanwhile
        stacks.textContent = "";
        detail.dataset.alloc = String(info.alloc_event);
        stacks.appendChild(el("h4", null, "Allocated at event " + thousands(info.alloc_event)));
        if (info.alloc_frames.length) stacks.appendChild(frameList(info.alloc_frames));
        else stacks.appendChild(el("p", { class: "meta" }, block.label ? "No frames: " + block.label + "." : "No frames recorded."));
        if (info.free_event == null) {
          stacks.appendChild(el("p", { class: "meta" }, "Never freed in the trace."));
        } else {
          stacks.appendChild(el("h4", null, "Freed at event " + thousands(info.free_event)));
          if (info.free_frames) stacks.appendChild(frameList(info.free_frames));
          else stacks.appendChild(el("p", { class: "meta" }, "The trace records no free stacks (context=\"all\" does)."));
        }
      }, function (error) {
        stacks.textContent = linkGone(error) ? error.message : "The block could not be read: " + error.message;
      });
    }, 120);
  }

  document.addEventListener("oomscope:chart", function (event) {
    var slot = event.target;
    if (!slot.dataset) return;
    var name = slot.dataset.chart || "";
    if (!/^(timeline|active|segtime)-/.test(name)) return;
    try {
      if (/^active-/.test(name)) setupActive(slot, event.detail && event.detail.views);
      else if (/^segtime-/.test(name)) setupSegtime(slot, event.detail && event.detail.views);
      else setup(slot, event.detail && event.detail.views);
    } catch (error) {
      console.warn("timeline digging unavailable:", error);
    }
  });
})();
