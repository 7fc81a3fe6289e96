#!/usr/bin/env python3
"""ProxyCommand for SSH remote development through the training console (Python 3.8+, standard
library only). It carries one SSH connection over the console's websocket to the instance's own
sshd; the console relays bytes it cannot read (the SSH session is between your ssh and sshd).

    ssh -o ProxyCommand="python3 console-ssh.py <console>/ws/jobs/<job id>/ssh/<index>/" \
        -o HostKeyAlias=<job>-worker-<index> ma-user@worker-<index>

The API token (the console's "API token" page) comes from CONSOLE_TOKEN or --token-file FILE.
The job page shows the exact command and the host key to put in known_hosts.
"""

import argparse
import base64
import os
import socket
import ssl
import struct
import sys
import threading
from urllib.parse import urlsplit

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10
_send_lock = threading.Lock()


def frame(opcode: int, payload: bytes) -> bytes:
    """A client frame (masked, as RFC 6455 requires of clients)."""
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    mask = os.urandom(4)
    if not n:
        return head + mask
    # XOR of the whole payload with the repeated mask, as one big integer (a byte loop is slow).
    repeated = (mask * (n // 4 + 1))[:n]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(n, "big")
    return head + mask + masked


def send(sock, opcode: int, payload: bytes) -> None:
    data = frame(opcode, payload)
    with _send_lock:
        sock.sendall(data)


def read_exact(sock, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


# jobs/ssh_relay.py's close codes.
CLOSE_REASONS = {
    4401: ": no API token or session",
    4403: ": you may not (or no longer) reach this instance",
    4410: ": the instance ended",
    4429: ": you have as many terminals and SSH sessions open as one may; close one and try again",
    4502: ": the instance's engine could not relay",
}


def from_console(sock, out) -> None:
    """The sshd's bytes to stdout; the process ends when the console closes."""
    try:
        while True:
            b1, b2 = read_exact(sock, 2)
            opcode, n = b1 & 0x0F, b2 & 0x7F
            if n == 126:
                n = struct.unpack("!H", read_exact(sock, 2))[0]
            elif n == 127:
                n = struct.unpack("!Q", read_exact(sock, 8))[0]
            payload = read_exact(sock, n)
            if opcode in (OP_BINARY, OP_CONT, OP_TEXT):
                out.write(payload)
                out.flush()
            elif opcode == OP_PING:
                send(sock, OP_PONG, payload)
            elif opcode == OP_CLOSE:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                if code != 1000:
                    why = CLOSE_REASONS.get(code, "")
                    sys.stderr.write(f"console-ssh: the console closed the connection ({code}{why})\n")
                break
    except (EOFError, OSError):
        pass
    os._exit(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the job page's ws:// or wss:// address of the instance")
    parser.add_argument("--token-file", help="a file holding the API token (else CONSOLE_TOKEN)")
    args = parser.parse_args()
    token = open(args.token_file).read().strip() if args.token_file else os.environ.get("CONSOLE_TOKEN", "")
    if not token:
        sys.stderr.write("console-ssh: no API token: set CONSOLE_TOKEN or pass --token-file\n")
        return 2
    url = urlsplit(args.url.replace("http://", "ws://", 1).replace("https://", "wss://", 1))
    secure = url.scheme == "wss"
    port = url.port or (443 if secure else 80)
    sock = socket.create_connection((url.hostname, port), timeout=30)
    if secure:
        sock = ssl.create_default_context().wrap_socket(sock, server_hostname=url.hostname)
    key = base64.b64encode(os.urandom(16)).decode()
    path = url.path + (f"?{url.query}" if url.query else "")
    origin = f"{'https' if secure else 'http'}://{url.netloc}"
    sock.sendall(
        (
            f"GET {path} HTTP/1.1\r\nHost: {url.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: {origin}\r\n"
            f"Authorization: Token {token}\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        if not chunk:
            break
        head += chunk
    status = head.split(b"\r\n", 1)[0].decode(errors="replace")
    if " 101 " not in status + " ":
        sys.stderr.write(f"console-ssh: the console refused: {status or 'no answer'}\n")
        return 1
    sock.settimeout(None)
    threading.Thread(target=from_console, args=(sock, sys.stdout.buffer), daemon=True).start()
    stdin = sys.stdin.buffer.fileno()
    while True:
        data = os.read(stdin, 65536)
        if not data:
            send(sock, OP_CLOSE, struct.pack("!H", 1000))
            return 0
        send(sock, OP_BINARY, data)


if __name__ == "__main__":
    sys.exit(main())
