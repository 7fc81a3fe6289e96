// The code dir browser (templates/storage/): htmx navigates and saves; this adds what htmx does not.
// - Our refusals (a bad path, a save conflict, a too-big text; marked by the X-Storage-Browser
//   header) carry a message to show: swap them like a 200. Other error pages are not swapped.
// - The editor refuses a text over its limit before sending it, and warns before leaving unsaved text.
// - The folder picker of the create wizard: a button
//     <button type="button" data-storage-pick="code_dir">Browse…</button>
//   opens /storage/?pick=code_dir (starting at the field's current value) in a <dialog>;
//   "Use this folder" sets #id_code_dir to the folder's obs:// URL, fires input and change, and
//   closes the dialog. Optional on the button: data-storage-url (default "/storage/").
(function () {
  "use strict";
  if (window.consoleStorageBrowser) return; // loaded again by an htmx swap: the listeners are already there
  window.consoleStorageBrowser = true;

  const AREA = ".storage-browser, .storage-dialog";
  // The page's language (djangojs.po, base.html's catalog); English without it.
  function gettext(s) { return window.gettext ? window.gettext(s) : s; }
  function fill(s, o) { return s.replace(/%\((\w+)\)s/g, function (m, k) { return o[k]; }); }

  function requestElt(detail) {
    return (detail.requestConfig && detail.requestConfig.elt) || detail.elt;
  }
  function inArea(elt) {
    return Boolean(elt && elt.closest && elt.closest(AREA));
  }
  function ours(xhr) {
    return Boolean(xhr) && xhr.getResponseHeader("X-Storage-Browser") === "1";
  }
  function editorOf(elt) {
    return elt && elt.closest ? elt.closest("form.storage-editor") : null;
  }
  function sayInEditor(form, text) {
    const status = form.querySelector("#save-status");
    if (!status) return;
    status.className = "save-status bad";
    status.setAttribute("role", "alert");
    status.textContent = text;
  }

  // Listening on <body> runs before django-htmx's DEBUG helper on document, which would replace the page.
  document.body.addEventListener("htmx:beforeOnLoad", function (event) {
    const xhr = event.detail.xhr;
    if (xhr && xhr.status >= 400 && inArea(requestElt(event.detail)) && ours(xhr)) event.stopPropagation();
  });
  document.body.addEventListener("htmx:beforeSwap", function (event) {
    const detail = event.detail;
    const elt = requestElt(detail);
    if (!detail.xhr || detail.xhr.status < 400 || !inArea(elt)) return;
    if (ours(detail.xhr)) {
      detail.shouldSwap = true;
      detail.isError = false;
      return;
    }
    // Not our answer (e.g. the CSRF check's 400, a 500): keep the text and say so.
    detail.shouldSwap = false;
    const form = editorOf(elt);
    if (form) sayInEditor(form, fill(gettext("Not saved: the server answered %(status)s. Your text is still here."), { status: detail.xhr.status }));
  });
  document.body.addEventListener("htmx:sendError", function (event) {
    const form = editorOf(requestElt(event.detail));
    if (form) sayInEditor(form, gettext("Not saved: the server could not be reached. Your text is still here."));
  });

  // -- the editor ----------------------------------------------------------------------------------
  document.body.addEventListener("htmx:beforeRequest", function (event) {
    const form = editorOf(event.detail.elt);
    if (!form || event.detail.elt !== form) return;
    const max = Number(form.dataset.maxBytes || 0);
    const text = form.querySelector("textarea").value;
    const bytes = new TextEncoder().encode(text).length;
    if (max && bytes > max) {
      event.preventDefault();
      sayInEditor(form, fill(gettext("Not saved: the text is %(size)s MB; at most %(max)s MB can be saved from the editor."), {
        size: (bytes / 1048576).toFixed(1),
        max: (max / 1048576).toFixed(0),
      }));
    }
  });
  document.body.addEventListener("input", function (event) {
    const form = editorOf(event.target);
    if (form) form.dataset.dirty = "1";
  });
  document.body.addEventListener("htmx:afterRequest", function (event) {
    const form = editorOf(event.detail.elt);
    if (form && event.detail.successful && event.detail.xhr.status === 200) delete form.dataset.dirty;
  });
  function unsaved() {
    return document.querySelector("form.storage-editor[data-dirty]");
  }
  // Navigating inside the browser (htmx) or away from the page would drop the edited text.
  document.body.addEventListener("htmx:confirm", function (event) {
    const elt = event.detail.elt;
    if (!inArea(elt) || editorOf(elt) || !unsaved()) return;
    event.preventDefault();
    if (window.confirm(gettext("Leave without saving? Your changes to this file are not saved."))) event.detail.issueRequest(true);
  });
  window.addEventListener("beforeunload", function (event) {
    if (unsaved()) event.preventDefault();
  });

  // -- the folder picker ---------------------------------------------------------------------------
  function dialog() {
    let d = document.getElementById("storage-dialog");
    if (d) return d;
    d = document.createElement("dialog");
    d.id = "storage-dialog";
    d.className = "storage-dialog";
    d.setAttribute("aria-labelledby", "storage-dialog-title");
    d.innerHTML =
      '<div class="storage-dialog-inner">' +
      '<div class="storage-dialog-head"><h2 id="storage-dialog-title">Choose a folder</h2>' +
      '<button type="button" data-storage-close></button></div>' +
      '<div class="storage-dialog-body"></div></div>';
    d.querySelector("[data-storage-close]").textContent = gettext("Cancel");
    document.body.appendChild(d);
    // A click on the backdrop lands on the <dialog> itself (the inner box fills it): close.
    d.addEventListener("click", function (event) {
      if (event.target === d) d.close();
    });
    return d;
  }

  function labelOf(input) {
    const label = input && input.id ? document.querySelector('label[for="' + input.id + '"]') : null;
    return label ? label.textContent.replace(/\s*\*\s*$/, "").trim() : "";
  }

  function openPicker(opener) {
    const field = opener.dataset.storagePick;
    const input = document.getElementById("id_" + field);
    const params = new URLSearchParams({ pick: field });
    const value = input ? input.value.trim() : "";
    if (value.startsWith("obs://")) params.set("path", value); // else: start at the bucket list
    const d = dialog();
    const label = labelOf(input);
    d.querySelector("#storage-dialog-title").textContent = label
      ? fill(gettext("Choose a folder for %(field)s"), { field: label })
      : gettext("Choose a folder");
    const body = d.querySelector(".storage-dialog-body");
    body.innerHTML = '<p class="hint"></p>';
    body.firstChild.textContent = gettext("Loading…");
    if (!d.open) d.showModal();
    htmx.ajax("GET", (opener.dataset.storageUrl || "/storage/") + "?" + params.toString(), {
      target: body,
      swap: "innerHTML",
    });
  }

  function choose(picker, url) {
    const input = document.getElementById("id_" + picker.dataset.pick);
    if (input) {
      input.value = url;
      // Both: the wizard may validate on input (as the user types) and on change.
      input.dispatchEvent(new Event("input", { bubbles: true }));
      input.dispatchEvent(new Event("change", { bubbles: true }));
    }
    const d = picker.closest("dialog");
    if (d) d.close();
  }

  document.addEventListener("click", function (event) {
    const target = event.target instanceof Element ? event.target : null;
    if (!target) return;
    const opener = target.closest("[data-storage-pick]");
    if (opener) {
      event.preventDefault();
      openPicker(opener);
      return;
    }
    const use = target.closest("[data-storage-use]");
    const picker = use && use.closest("[data-pick]");
    if (picker) {
      event.preventDefault();
      choose(picker, use.dataset.storageUse);
      return;
    }
    const close = target.closest("[data-storage-close]");
    if (close && close.closest("dialog")) close.closest("dialog").close();
  });
})();
