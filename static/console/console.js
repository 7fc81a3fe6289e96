// New content listens at once: htmx sets up the listeners of what it swapped in when the swap
// settles, 20 ms later by default, and an event in between (a change of the form the what-if
// table listens to) was dropped (docs/decisions.md, "A swapped element listens at once").
// Nothing here animates a settle.
if (window.htmx) htmx.config.defaultSettleDelay = 0;

// While a pointer is pressed, nothing the server sends moves the page under it. A click is
// the press and the release on one element: an answer drawn in between that moves the element
// away, or replaces it (a socket's fragment redrawn, even unchanged), sends the click to the
// common parent and it is lost. What would be drawn meanwhile waits, in order, until just
// after the click (a mouse's comes in the task of its pointerup; a touch's later, once the
// browser has told a tap from a double tap), and never more than 5 s (a release the page
// never saw: outside the window, a context menu).
const pressGuard = (function () {
  const HOLD_AT_MOST_MS = 5000;
  const CLICK_AFTER_RELEASE_MS = { mouse: 0, pen: 400, touch: 400 };  // or none comes (a drag)
  const down = new Set();  // the pointers pressed now (two fingers: both)
  let held = [];  // [key, draw] in arrival order
  let capTimer = 0;
  let releaseTimer = 0;
  function release() {
    clearTimeout(capTimer);
    clearTimeout(releaseTimer);
    capTimer = releaseTimer = 0;
    down.clear();
    const draws = held;
    held = [];
    draws.forEach(function (entry) {
      try {
        entry[1]();
      } catch (error) {  // one answer that cannot be drawn does not lose the others
        console.error(error);
      }
    });
  }
  function releaseIn(ms) {
    clearTimeout(releaseTimer);
    releaseTimer = setTimeout(release, ms);
  }
  document.addEventListener("pointerdown", function (event) {
    if (event.button !== 0) return;  // a right or middle press clicks nothing
    down.add(event.pointerId);
    clearTimeout(releaseTimer);
    releaseTimer = 0;
  }, true);
  ["pointerup", "pointercancel"].forEach(function (type) {
    document.addEventListener(type, function (event) {
      if (down.delete(event.pointerId) && down.size === 0) {
        releaseIn(type === "pointercancel" ? 0 : CLICK_AFTER_RELEASE_MS[event.pointerType] || 0);
      }
    }, true);
  });
  // The click ends the wait: drawn once its own handlers and default action (a submit, a link
  // followed) have run.
  document.addEventListener("click", function () { if (releaseTimer) releaseIn(0); }, true);
  window.addEventListener("blur", function () { if (down.size || releaseTimer) release(); });
  return {
    pressing: function () { return down.size > 0 || releaseTimer !== 0; },
    // key: a later draw with the same key replaces the earlier one (null: every one is kept).
    hold: function (key, draw) {
      if (key !== null) this.drop(key);
      held.push([key, draw]);
      if (!capTimer) capTimer = setTimeout(release, HOLD_AT_MOST_MS);
    },
    // A new request for what `key` names: its held answer is out of date, and drawn it would
    // replace the element the new answer is for.
    drop: function (key) {
      held = held.filter(function (entry) { return entry[0] !== key; });
    },
  };
})();
document.addEventListener("htmx:beforeRequest", function (event) {
  if (event.detail.target) pressGuard.drop(event.detail.target);
});

// A socket's message during a press: held whole and replayed as the ws extension would draw it
// (its fragments swapped by id, out of band), with its before/after events for the listeners
// below (the log pane's follow state, the opened stacks). Registered first, so a held message
// reaches none of them until it is drawn.
document.addEventListener("htmx:wsBeforeMessage", function (event) {
  if (event.detail.replayed || !pressGuard.pressing()) return;
  event.preventDefault();
  event.stopImmediatePropagation();
  const socketElt = event.target;
  const message = event.detail.message;
  pressGuard.hold(null, function () {
    if (!socketElt.isConnected) return;
    htmx.trigger(socketElt, "htmx:wsBeforeMessage", { message: message, replayed: true });
    htmx.swap(socketElt, message, { swapStyle: "none", swapDelay: 0, settleDelay: 0 }, { contextElement: socketElt });
    htmx.trigger(socketElt, "htmx:wsAfterMessage", { message: message, replayed: true });
  });
});

// Keeps the live log pane readable: follows the tail while the user is at the
// bottom, and caps the DOM so a chatty job cannot freeze the page. Attempt
// separators stay: the server replaces a redrawn line (a progress bar) by its
// number among the lines after its attempt's separator.
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
    let node = pane.firstElementChild;
    while (extra > 0 && node) {
      const next = node.nextElementSibling;
      if (!node.classList.contains("log-sep")) {
        pane.removeChild(node);
        extra--;
      }
      node = next;
    }
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

// The create wizard (templates/jobs/wizard/): fields shown only when another field has a
// value (data-show-when, the same rules the server renders with, jobs/wizard.py), the
// messages of a field fetched from the server as the user leaves it, and rows added to
// the list editors (env vars, tags, mounts). Hidden fields are disabled, so the browser
// does not post them.
(function () {
  function valueOf(form, name) {
    let value = "";
    form.querySelectorAll('[name="' + name + '"]').forEach(function (el) {
      if (el.disabled || el.closest("fieldset[disabled]")) return;
      if (el.type === "checkbox" || el.type === "radio") {
        if (el.checked) value = el.value;
      } else {
        value = el.value;
      }
    });
    return value;
  }
  function holds(form, term) {
    const parts = term.trim().split("=");
    const value = valueOf(form, parts[0]);
    return parts.length > 1 ? value === parts[1] : value !== "" && value !== "0" && value !== "false";
  }
  function applyVisibility(form) {
    // A field that hides can hide others (auto-publish -> publish as -> model name): repeat until stable.
    for (let pass = 0; pass < 5; pass++) {
      let changed = false;
      form.querySelectorAll("[data-show-when]").forEach(function (box) {
        const show = box.dataset.showWhen.split("|").some(function (t) { return holds(form, t); });
        if (box.hidden === show) {
          box.hidden = !show;
          box.disabled = !show;
          changed = true;
        }
      });
      if (!changed) break;
    }
  }
  // SPEC §3: "keep logs permanently" is on by default for NPU flavors (until the user sets it).
  function keepLogsForNpu(form, flavor) {
    const keep = form.querySelector('input[name="keep_logs"]');
    const npu = (form.dataset.npuFlavors || "").split(",").filter(Boolean);
    if (keep && !keep.dataset.touched && npu.indexOf(flavor) >= 0) keep.checked = true;
  }
  document.addEventListener("input", function (event) {
    if (event.target.name === "keep_logs") event.target.dataset.touched = "1";
  });
  function fieldName(el) {
    return el.name.replace(/-\d+-[a-z_]+$/, "");  // a row input: environments-0-name -> environments
  }
  document.addEventListener("change", function (event) {
    const el = event.target;
    const form = el.closest && el.closest("#wizard");
    if (!form || !el.name) return;
    if (el.name === "flavor") keepLogsForNpu(form, el.value);
    applyVisibility(form);
    if (el.type === "file" || el.closest("[data-no-validate]") || el.hasAttribute("hx-post")) return;
    const name = fieldName(el);
    if (!document.getElementById("errors-" + name)) return;
    htmx.ajax("POST", form.dataset.validateUrl + "?field=" + encodeURIComponent(name), {
      source: el, target: "#errors-" + name, swap: "outerHTML",
    });
  });
  // Leaving a field is part of pressing Next: the field's messages and the what-if table are
  // asked for again and come back while the button is still held; a table a few lines shorter
  // moved Next away from the pointer and the click was lost. They wait for the press to end
  // (the latest answer per part); the wizard's own swap replaces them all and is never held
  // (requests htmx queued on the form depend on it being replaced).
  document.addEventListener("htmx:beforeSwap", function (event) {
    const detail = event.detail;
    const target = detail.target;
    if (!detail.shouldSwap || !target || target.id === "wizard" || !target.closest || !target.closest("#wizard")) return;
    if (!pressGuard.pressing()) return;
    detail.shouldSwap = false;
    const content = detail.serverResponse;
    pressGuard.hold(target, function () {
      if (target.isConnected) htmx.swap(target, content, { swapStyle: "outerHTML", swapDelay: 0, settleDelay: 0 });
    });
  });
  // A field's box shows it has messages (its input's red border) as they come and go.
  document.addEventListener("htmx:afterSettle", function (event) {
    const wizard = document.getElementById("wizard");
    if (!wizard) return;
    wizard.querySelectorAll(".field").forEach(function (box) {
      const errors = box.querySelector(":scope > .errors");
      if (errors) box.classList.toggle("has-error", errors.children.length > 0);
    });
    if (event.detail.target && event.detail.target.id === "wizard") {
      applyVisibility(wizard);
      const firstError = wizard.querySelector("section.step:not([hidden]) .field.has-error input, section.step:not([hidden]) .field.has-error select, section.step:not([hidden]) .field.has-error textarea");
      if (firstError) firstError.focus();
      if (wizard.getBoundingClientRect().top < 0) wizard.scrollIntoView({ block: "start" });
    }
  });
  document.addEventListener("click", function (event) {
    const add = event.target.closest && event.target.closest("[data-add-row]");
    if (add) {
      const table = document.getElementById("rows-" + add.dataset.addRow);
      if (!table) return;
      const rows = table.querySelectorAll("tr");
      const last = rows[rows.length - 1];
      const copy = last.cloneNode(true);
      const index = rows.length - 1;  // the first row is the header
      copy.querySelectorAll("input").forEach(function (input) {
        input.name = input.name.replace(/-\d+-/, "-" + index + "-");
        if (input.type === "checkbox") input.checked = false;
        else input.value = "";
      });
      last.after(copy);
      const first = copy.querySelector("input");
      if (first) first.focus();
      return;
    }
    const copyButton = event.target.closest && event.target.closest("[data-copy]");
    if (copyButton) {
      const source = document.querySelector(copyButton.dataset.copy);
      if (source && navigator.clipboard) {
        navigator.clipboard.writeText(source.textContent).then(function () { copyButton.textContent = window.gettext ? window.gettext("Copied") : "Copied"; });
      }
    }
  });
})();
