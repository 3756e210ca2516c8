// gpugate console: confirmations for actions, the import file picker, live refresh by polling
// (the charts are SVG drawn by the server: a refresh replaces them with the rest of the region).
// Plain browser JavaScript, no build step.
(function () {
  "use strict";

  // Every action form asks first; drain and disable ask for a reason (Cancel aborts).
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.classList || !form.classList.contains("action")) return;
    var question = form.getAttribute("data-confirm") || "Are you sure?";
    if (form.hasAttribute("data-reason")) {
      var reason = window.prompt(question + "\n\nReason (optional, goes to the audit log):", "");
      if (reason === null) { event.preventDefault(); return; }
      form.querySelector("input[name=reason]").value = reason;
    } else if (!window.confirm(question)) {
      event.preventDefault();
    }
  });

  // The import form: a chosen file is read into the textarea (the form posts text, no upload).
  document.addEventListener("change", function (event) {
    var input = event.target;
    if (input.id !== "import-file" || !input.files || !input.files[0]) return;
    input.files[0].text().then(function (text) {
      document.getElementById("import-text").value = text;
    });
  });

  // Live regions: re-fetch this page's `live` block every few seconds while the tab is visible.
  function refresh(region) {
    if (document.hidden) return;
    var url = new URL(window.location.href);
    url.searchParams.delete("notice");
    url.searchParams.delete("error");
    url.searchParams.set("fragment", "1");
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (resp) {
        if (resp.status === 401) { window.location.assign("/console/login"); return null; }
        return resp.ok ? resp.text() : null;
      })
      .then(function (html) {
        if (html !== null && html !== undefined) {
          region.innerHTML = html;
          region.setAttribute("data-refreshed", String(Date.now()));
        }
      })
      .catch(function () { region.classList.add("stale"); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh]").forEach(function (region) {
      var every = parseInt(region.getAttribute("data-refresh"), 10) || 3000;
      window.setInterval(function () { refresh(region); }, every);
    });
  });
})();
