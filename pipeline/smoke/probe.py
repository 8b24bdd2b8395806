"""Probes that run *inside* the image (``python3 -c <this file> ...`` via ``docker exec``/``run``).

Standard library only, Python >= 3.8, so it runs in any ATOM image and in the
test images. The smoke runner reaches the server and its result files through
these, which is why a remote engine (``--docker-host ssh://...``) needs no
published ports and no shared file system. Every command prints one JSON line.

    http METHOD URL TIMEOUT [BODY]    -> {"status", "body", "error", "seconds"}
    newest DIR PATTERN                -> {"path", "text"} newest file matching PATTERN under DIR
    read PATH                         -> {"path", "text"}
    preflight NODES_DIR HF_CACHE MODEL_ID [DEVICE ...]
        -> {"nodes", "nodes_error", "devices", "hf_cache_exists", "model_cached"}
    listeners PORT                    -> {"port", "listeners": [{"inode", "address"}],
                                          "holders": [{"pid", "inode", "cmdline", "cgroup"}], "unreadable"}
        the TCP sockets listening on PORT in this network namespace (/proc/net/tcp, tcp6) and the
        processes of this PID namespace holding them (/proc/<pid>/fd -> socket:[inode])

The local preflight imports `read_nodes` and `model_in_cache` from here, so the
host and the in-container readings are the same code.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

MAX_BODY = 1 << 20


def read_nodes(nodes_dir: str) -> tuple[list[dict[str, Any]], str | None]:
    """KFD topology nodes: [{"node", "name", "simd_count", "gfx_target_version"}], or an error text."""
    if not os.path.isdir(nodes_dir):
        return [], f"no KFD topology at {nodes_dir}"
    out: list[dict[str, Any]] = []
    entries = sorted(os.listdir(nodes_dir), key=lambda s: (not s.isdigit(), int(s) if s.isdigit() else 0, s))
    for entry in entries:
        props_path = os.path.join(nodes_dir, entry, "properties")
        if not os.path.isfile(props_path):
            continue
        props: dict[str, int] = {}
        try:
            with open(props_path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 2 and parts[1].lstrip("-").isdigit():
                        props[parts[0]] = int(parts[1])
        except OSError as e:
            return out, f"cannot read {props_path}: {e}"
        name = ""
        name_path = os.path.join(nodes_dir, entry, "name")
        if os.path.isfile(name_path):
            try:
                with open(name_path, encoding="utf-8", errors="replace") as f:
                    name = f.read().strip()
            except OSError:
                name = ""
        out.append(
            {
                "node": entry,
                "name": name,
                "simd_count": props.get("simd_count", 0),
                "gfx_target_version": props.get("gfx_target_version", 0),
            }
        )
    return out, None


def model_in_cache(hf_cache: str, model_id: str) -> bool:
    """The model has a non-empty snapshot in a Hugging Face cache (HF_HOME or HF_HUB_CACHE layout)."""
    folder = "models--" + model_id.replace("/", "--")
    for hub in (os.path.join(hf_cache, "hub"), hf_cache):
        for snap in glob.glob(os.path.join(hub, folder, "snapshots", "*")):
            if os.path.isdir(snap) and os.listdir(snap):
                return True
    return False


def _http(method: str, url: str, timeout: float, body: str | None) -> dict[str, Any]:
    data = body.encode("utf-8") if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read(MAX_BODY).decode("utf-8", "replace")
            return {"status": resp.status, "body": text, "error": None, "seconds": time.monotonic() - start}
    except urllib.error.HTTPError as e:
        text = e.read(MAX_BODY).decode("utf-8", "replace")
        return {"status": e.code, "body": text, "error": None, "seconds": time.monotonic() - start}
    except Exception as e:
        return {
            "status": 0,
            "body": "",
            "error": f"{type(e).__name__}: {e}",
            "seconds": time.monotonic() - start,
        }


def _address(hexaddr: str) -> str:
    """/proc/net/tcp's little-endian hex address as text (IPv4 dotted, IPv6 colon groups)."""
    raw = bytes.fromhex(hexaddr)
    words = [raw[i : i + 4][::-1] for i in range(0, len(raw), 4)]
    flat = b"".join(words)
    if len(flat) == 4:
        return ".".join(str(b) for b in flat)
    return ":".join(flat[i : i + 2].hex() for i in range(0, 16, 2))


def listeners(port: int) -> dict[str, Any]:
    """Who listens on TCP `port` here: socket inodes, and the processes (we can see) holding them."""
    found: dict[str, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii", errors="replace") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) < 10 or cols[3] != "0A":  # 0A: LISTEN
                continue
            addr, _, hexport = cols[1].rpartition(":")
            if int(hexport, 16) == port and cols[9] != "0":
                found[cols[9]] = f"{_address(addr)}:{port}"
    holders: list[dict[str, Any]] = []
    unreadable = 0
    me = os.getpid()
    for entry in os.listdir("/proc") if found else []:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            unreadable += 1
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            inode = target[8:-1] if target.startswith("socket:[") else ""
            if inode in found:
                holders.append(
                    {
                        "pid": int(entry),
                        "inode": inode,
                        "cmdline": _slurp(f"/proc/{entry}/cmdline").replace("\0", " ").strip()[:300],
                        "cgroup": _slurp(f"/proc/{entry}/cgroup")[:2000],
                    }
                )
    return {
        "port": port,
        "listeners": [{"inode": i, "address": a} for i, a in sorted(found.items())],
        "holders": holders,
        "unreadable": unreadable,
    }


def _slurp(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return {"path": path, "text": f.read()}
    except OSError as e:
        return {"path": None, "text": "", "error": f"{type(e).__name__}: {e}"}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(json.dumps({"error": "usage: probe COMMAND ..."}))
        return 2
    cmd = argv[1]
    result: dict[str, Any]
    if cmd == "http":
        body = argv[5] if len(argv) > 5 else None
        result = _http(argv[2], argv[3], float(argv[4]), body)
    elif cmd == "newest":
        files = [
            p for p in glob.glob(os.path.join(argv[2], "**", argv[3]), recursive=True) if os.path.isfile(p)
        ]
        if not files:
            result = {"path": None, "text": "", "found": []}
        else:
            newest = max(files, key=os.path.getmtime)
            result = _read(newest)
            result["found"] = sorted(files)
    elif cmd == "read":
        result = _read(argv[2])
    elif cmd == "preflight":
        nodes, nodes_error = read_nodes(argv[2])
        result = {
            "nodes": nodes,
            "nodes_error": nodes_error,
            "devices": {d: os.path.exists(d) for d in argv[5:]},
            "hf_cache_exists": os.path.isdir(argv[3]),
            "model_cached": model_in_cache(argv[3], argv[4]),
        }
    elif cmd == "listeners":
        result = listeners(int(argv[2]))
    else:
        result = {"error": f"unknown probe command {cmd!r}"}
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
