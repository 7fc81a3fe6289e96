// The instance terminal's page (templates/jobs/terminal.html): xterm.js on the socket of
// jobs/terminal.py. Keystrokes go as binary frames, a resize as a JSON text frame
// {"resize": [rows, cols]}; the shell's bytes come as binary frames, {"ended": why} as text.
(function () {
  "use strict";
  const host = document.getElementById("terminal");
  const status = document.getElementById("terminal-status");
  if (!host) return;
  const TerminalClass = window.Terminal.Terminal || window.Terminal;
  const FitClass = window.FitAddon.FitAddon || window.FitAddon;
  // The page's language (djangojs.po, base.html's catalog), looked up when a text is shown: this
  // script runs before the deferred catalog. English without it.
  function gettext(s) { return window.gettext ? window.gettext(s) : s; }
  function fill(s, o) { return s.replace(/%\((\w+)\)s/g, function (m, k) { return o[k]; }); }
  function closedText(code) {
    if (code === 4403) return gettext("Closed: you may not (or no longer) use this job's terminal.");
    if (code === 4410) return gettext("The instance ended: the terminal is closed.");
    if (code === 4429) return gettext("Closed: you have as many terminals and SSH sessions open as one may. Close one, then reload this page.");
    if (code === 4502) return gettext("The shell could not be started in the instance.");
    return "";
  }
  // jobs/terminal.py's reasons, in the page's language (any other is shown as it came).
  function reasonText(why) {
    if (why === "the instance ended") return gettext("the instance ended");
    if (why === "the shell ended") return gettext("the shell ended");
    return why;
  }

  const term = new TerminalClass({
    cursorBlink: true,
    convertEol: false,
    scrollback: 5000,
    fontFamily: 'ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace',
    fontSize: 13,
    theme: { background: "#1f2329", foreground: "#e8eaed" },
  });
  const fit = new FitClass();
  term.loadAddon(fit);
  term.open(host);
  fit.fit();

  const scheme = location.protocol === "https:" ? "wss://" : "ws://";
  const ws = new WebSocket(scheme + location.host + host.dataset.wsPath);
  ws.binaryType = "arraybuffer";
  const encoder = new TextEncoder();
  let ended = "";
  let endedCode = 0; // the console's close code, also sent before its close frame

  function say(text, state) {
    status.textContent = text;
    status.dataset.state = state;
  }
  function sendSize() {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ resize: [term.rows, term.cols] }));
  }

  ws.onopen = function () {
    say(gettext("Connected."), "open");
    sendSize();
    term.focus();
  };
  ws.onmessage = function (event) {
    if (typeof event.data === "string") {
      try {
        const said = JSON.parse(event.data);
        ended = said.ended || ended;
        endedCode = said.code || endedCode;
      } catch (e) {
        /* not ours: ignored */
      }
      return;
    }
    term.write(new Uint8Array(event.data));
  };
  ws.onclose = function (event) {
    // The close frame's code, or the one the console said before it: a full run saw a close
    // frame lost under load (the page got another code and showed the other text).
    const code = closedText(event.code) ? event.code : endedCode;
    const text =
      closedText(code) && !(ended && code === 4403)
        ? closedText(code)
        : ended
          ? fill(gettext("The terminal is closed: %(why)s."), { why: reasonText(ended) })
          : gettext("The terminal is closed.");
    say(text, "closed");
    host.classList.add("terminal-closed");
    term.write("\r\n\x1b[2m[" + text + "]\x1b[0m\r\n\x1b[?25l"); // and no cursor
    term.options.disableStdin = true;
  };
  term.onData(function (data) {
    if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(data));
  });
  term.onBinary(function (data) {
    // Mouse reports in X10 mode: one byte per char code.
    if (ws.readyState === WebSocket.OPEN) ws.send(Uint8Array.from(data, (c) => c.charCodeAt(0) & 255));
  });
  term.onResize(sendSize);
  let pending = 0;
  new ResizeObserver(function () {
    clearTimeout(pending);
    pending = setTimeout(function () { fit.fit(); }, 80);
  }).observe(host);
})();
