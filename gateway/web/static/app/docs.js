// /docs: Swagger UI (vendored, served from here) on /openapi.json. "Try it out" sends the API key
// entered at the top; the validator badge (which would call validator.swagger.io) is off.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger",
    validatorUrl: null,
    deepLinking: true,
    tryItOutEnabled: false,
    displayRequestDuration: true,
    requestInterceptor: (req) => {
      const key = G.apiKey();
      if (key && !req.headers.Authorization) req.headers.Authorization = "Bearer " + key;
      return req;
    },
  });
});
