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
