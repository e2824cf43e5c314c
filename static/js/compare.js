// History page: the two radio columns pick runs A and B; the button opens /compare/A/B/.
(function () {
  "use strict";
  var form = document.querySelector("form[data-compare-template]");
  if (!form) return;
  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var a = form.querySelector("input[name=a]:checked");
    var b = form.querySelector("input[name=b]:checked");
    if (!a || !b || a.value === b.value) return;
    window.location.assign(
      form.dataset.compareTemplate.replace("CODE_A", encodeURIComponent(a.value)).replace("CODE_B", encodeURIComponent(b.value))
    );
  });
})();
