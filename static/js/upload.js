// Upload page: drag-and-drop onto the drop zone, and an XHR upload with a progress bar
// (upload.onprogress), posted to the form's own action with X-Requested-With, so the view answers
// in JSON. Without JS the form posts as usual and the server redirects.
(function () {
  "use strict";

  var form = document.querySelector("form[data-upload]");
  if (!form) return;
  var input = form.querySelector("input[type=file]");
  var zone = form.querySelector(".dropzone");
  var name = form.querySelector(".dropzone .filename");
  var bar = form.querySelector("progress");
  var text = form.querySelector(".progress-text");
  var button = form.querySelector("button[type=submit]");
  var maxBytes = parseInt(form.dataset.maxBytes || "0", 10);

  function human(n) {
    var units = ["B", "KiB", "MiB", "GiB", "TiB"];
    var i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return i === 0 ? n + " B" : n.toFixed(2) + " " + units[i];
  }

  function chosen() {
    var file = input.files && input.files[0];
    if (!file) {
      name.textContent = "";
      return;
    }
    name.textContent = file.name + " (" + human(file.size) + ")";
    if (maxBytes && file.size > maxBytes) {
      text.textContent = "This file is larger than the " + human(maxBytes) + " upload limit.";
      button.disabled = true;
    } else {
      text.textContent = "";
      button.disabled = false;
    }
  }

  // The refusals that are about the file itself (its size, its bytes, the archive): shown beside the file.
  var FILE_CODES = /^(snapshot:|upload:too-large|upload:archive-|upload:not-a-snapshot|upload:quota)/;

  function errorList(lines, field) {
    var list = document.createElement("ul");
    list.className = "errorlist";
    if (field) list.dataset.field = field;
    lines.forEach(function (line) {
      var li = document.createElement("li");
      li.textContent = line; // never innerHTML: messages may echo user input
      list.appendChild(li);
    });
    return list;
  }

  function clearErrors() {
    form.querySelectorAll(".errorlist").forEach(function (list) { list.remove(); });
    form.querySelectorAll("[aria-invalid]").forEach(function (el) { el.removeAttribute("aria-invalid"); });
  }

  // Put a field's messages beside it and mark its control; the first such control gets the focus.
  function besideField(field, lines) {
    var box = form.querySelector('[data-field="' + field + '"]');
    if (!box) return null;
    box.appendChild(errorList(lines, field));
    var control = box.querySelector("input, select, textarea");
    if (control) control.setAttribute("aria-invalid", "true");
    return control || box;
  }

  // error: {code, message: a sentence, fields: {field: [messages]}} (the page's own JSON answer).
  function showError(error, status) {
    clearErrors();
    var first = null;
    var top = [];
    var fields = (error && error.fields) || {};
    if (Object.keys(fields).length) {
      Object.keys(fields).forEach(function (field) {
        var at = besideField(field, fields[field]);
        if (!at) top.push(field + ": " + fields[field].join(" "));
        first = first || at;
      });
    } else if (error && typeof error.message === "string") {
      var at = FILE_CODES.test(error.code || "") ? besideField("file", [error.message]) : null;
      if (!at) top.push(error.message);
      first = at;
    }
    if (!first && !top.length) top.push("The upload was not accepted (HTTP " + status + ").");
    if (top.length) form.querySelector(".form-errors").appendChild(errorList(top, ""));
    text.textContent = "";
    if (first) {
      first.scrollIntoView({ block: "center" });
      first.focus();
    }
  }

  input.addEventListener("change", chosen);
  zone.addEventListener("click", function (event) {
    if (event.target !== input) input.click();
  });
  ["dragenter", "dragover"].forEach(function (type) {
    zone.addEventListener(type, function (event) {
      event.preventDefault();
      zone.classList.add("over");
    });
  });
  ["dragleave", "drop"].forEach(function (type) {
    zone.addEventListener(type, function (event) {
      event.preventDefault();
      zone.classList.remove("over");
    });
  });
  zone.addEventListener("drop", function (event) {
    if (event.dataTransfer && event.dataTransfer.files.length) {
      input.files = event.dataTransfer.files;
      chosen();
    }
  });

  form.addEventListener("submit", function (event) {
    if (!input.files || !input.files.length) return; // let the server say what is missing
    event.preventDefault();
    var xhr = new XMLHttpRequest();
    xhr.open("POST", form.action || window.location.href);
    xhr.setRequestHeader("X-Requested-With", "XMLHttpRequest");
    bar.hidden = false;
    bar.value = 0;
    button.disabled = true;
    xhr.upload.onprogress = function (e) {
      if (e.lengthComputable) {
        bar.max = e.total;
        bar.value = e.loaded;
        text.textContent = "Uploading: " + human(e.loaded) + " of " + human(e.total);
      }
    };
    xhr.upload.onload = function () {
      text.textContent = "Uploaded; queuing the analysis...";
    };
    xhr.onload = function () {
      // The server answers an XHR with JSON: 202 {url, ...} or {error: {code, message}}.
      var data = null;
      try {
        data = JSON.parse(xhr.responseText);
      } catch (error) {
        data = null;
      }
      if (xhr.status === 202 && data && data.url) {
        window.location.assign(data.url);
        return;
      }
      showError(data && data.error, xhr.status);
      bar.hidden = true;
      button.disabled = false;
    };
    xhr.onerror = function () {
      text.textContent = "The upload failed (network error). Try again.";
      bar.hidden = true;
      button.disabled = false;
    };
    xhr.send(new FormData(form));
  });
})();
