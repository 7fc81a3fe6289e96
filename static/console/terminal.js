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
  const CLOSED = {
    4403: "Closed: you may not (or no longer) use this job's terminal.",
    4410: "The instance ended: the terminal is closed.",
    4502: "The shell could not be started in the instance.",
  };

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

  function say(text, state) {
    status.textContent = text;
    status.dataset.state = state;
  }
  function sendSize() {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ resize: [term.rows, term.cols] }));
  }

  ws.onopen = function () {
    say("Connected.", "open");
    sendSize();
    term.focus();
  };
  ws.onmessage = function (event) {
    if (typeof event.data === "string") {
      try {
        ended = JSON.parse(event.data).ended || ended;
      } catch (e) {
        /* not ours: ignored */
      }
      return;
    }
    term.write(new Uint8Array(event.data));
  };
  ws.onclose = function (event) {
    const text =
      CLOSED[event.code] && !(ended && event.code === 4403)
        ? CLOSED[event.code]
        : "The terminal is closed" + (ended ? ": " + ended + "." : ".");
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
