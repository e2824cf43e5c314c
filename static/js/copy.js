// Copy buttons: <button data-copy="ID"> copies the value (or text) of the element with that id.
(function () {
  "use strict";

  function copyFrom(button) {
    var source = document.getElementById(button.dataset.copy);
    if (!source) return;
    var text = "value" in source ? source.value : source.textContent;
    var done = function () {
      var label = button.textContent;
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = label; }, 1500);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { selectAndCopy(source) && done(); });
    } else if (selectAndCopy(source)) {
      done();
    }
  }

  // Fallback for plain-http deployments, where navigator.clipboard is absent.
  function selectAndCopy(source) {
    if (typeof source.select === "function") {
      source.select();
    } else {
      // A <code> box: select its text as a range.
      var range = document.createRange();
      range.selectNodeContents(source);
      var selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
    }
    try {
      return document.execCommand("copy");
    } catch (error) {
      return false;
    }
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-copy]");
    if (button) {
      event.preventDefault();
      copyFrom(button);
    }
  });
})();
