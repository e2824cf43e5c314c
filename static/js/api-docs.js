// The API's docs page (/api/v1/docs): Swagger UI over our OpenAPI document. No outside request:
// the schema validator badge (validator.swagger.io by default) is off, and "Try it out" sends the
// session's CSRF token, as the API asks of a signed-in browser's change.
(function () {
  "use strict";
  var data = document.body.dataset;
  SwaggerUIBundle({
    url: data.openapiUrl,
    dom_id: "#swagger-ui",
    deepLinking: true,
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
    requestInterceptor: function (req) {
      if (data.csrfToken) {
        req.headers["X-CSRFToken"] = data.csrfToken;
      }
      return req;
    },
  });
})();
