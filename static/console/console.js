// Keeps the live log pane readable: follows the tail while the user is at the
// bottom, and caps the DOM so a chatty job cannot freeze the page.
(function () {
  const MAX_LINES = 5000;
  document.addEventListener("htmx:wsBeforeMessage", function () {
    const pane = document.getElementById("log-lines");
    if (pane) pane.dataset.follow = pane.scrollTop + pane.clientHeight >= pane.scrollHeight - 24 ? "1" : "0";
  });
  document.addEventListener("htmx:wsAfterMessage", function () {
    const pane = document.getElementById("log-lines");
    if (!pane) return;
    let extra = pane.children.length - MAX_LINES;
    while (extra-- > 0) pane.removeChild(pane.firstElementChild);
    if (pane.dataset.follow !== "0") pane.scrollTop = pane.scrollHeight;
  });
})();

// A 400 answer to an htmx form is the form again with the errors next to its
// fields: swap it in like a 200. htmx does not swap 4xx answers by default, and
// django-htmx's DEBUG helper (listening on document) would replace the whole
// page with the bare fragment, so stop the event at <body> first.
(function () {
  function isFormErrors(detail) {
    const elt = (detail.requestConfig && detail.requestConfig.elt) || detail.elt;
    return detail.xhr && detail.xhr.status === 400 && elt && elt.tagName === "FORM";
  }
  document.body.addEventListener("htmx:beforeOnLoad", function (event) {
    if (isFormErrors(event.detail)) event.stopPropagation();
  });
  document.body.addEventListener("htmx:beforeSwap", function (event) {
    if (isFormErrors(event.detail)) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });
})();

// Tabs load their body with htmx: mark the one that was opened.
document.addEventListener("htmx:afterSwap", function (event) {
  const link = event.detail.requestConfig && event.detail.requestConfig.elt;
  const tabs = link && link.closest && link.closest(".tabs");
  if (!tabs) return;
  tabs.querySelectorAll("a").forEach(function (a) {
    a.classList.toggle("active", a === link);
    if (a === link) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  });
});

// The job socket re-renders the recovery rows on every change: keep the
// captured stacks the user opened open.
(function () {
  let open = [];
  document.addEventListener("htmx:wsBeforeMessage", function () {
    open = Array.from(document.querySelectorAll("details[id][open]"), function (d) { return d.id; });
  });
  document.addEventListener("htmx:wsAfterMessage", function () {
    open.forEach(function (id) {
      const details = document.getElementById(id);
      if (details) details.open = true;
    });
  });
})();
