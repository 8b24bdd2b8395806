"""Whose server answered: run ownership, leftover containers, the port, the listener's container.

A verdict counts only answers from the container this run started. Three layers:

1. **Ownership labels.** Every container a smoke run starts carries its run id and its
   owner: host name, pid, the pid's start time, the boot id and the PID namespace.
   `sweep_leftovers` runs first in every smoke: a labelled container whose owner is gone
   (pid dead, pid reused by another process, an earlier boot) is removed; one owned by a
   live process (another helper, CI job or terminal using the same engine) is reported and
   never touched; one owned elsewhere (another host or PID namespace) is reported.
2. **The port is free before start.** With host networking the recipe's port is the engine
   host's port: `check_port_free` reads the host's listening sockets in a short-lived probe
   container (``--network host --pid host --cap-add SYS_PTRACE``, read-only, so it works the
   same for a remote ``ssh://`` engine) and refuses (exit 11) naming the holder: a container
   (with its owner) or a process (pid and command line).
3. **The listener is ours.** After readiness, and again after the last gate, `prove_identity`
   runs the probe *in our container*: every socket listening on the port (``/proc/net/tcp``,
   ``tcp6`` of the container's network namespace, which is the host's with host networking)
   must be held by a process of the container's own PID namespace (``/proc/<pid>/fd`` ->
   ``socket:[inode]``), and the container must run the image under test. The evidence goes
   into the verdict; the tag stage refuses a verdict without it.

Still assumed: the server container has its own PID namespace (recipes do not set
``--pid host``), and the exec'd probe may read the server's ``/proc/<pid>/fd`` (same user, as
``docker exec`` runs by default).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipeline import labels
from pipeline.errors import InfraError, PipelineError
from pipeline.log import Logger
from pipeline.oci.engine import ContainerAPI, ContainerInfo, EngineAPI
from pipeline.smoke.verdict import ServerEvidence

OwnerState = Literal["live", "gone", "elsewhere"]
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def process_start(pid: int) -> str:
    """The start time of `pid` in clock ticks since boot ("" when unknown): tells a reused pid apart."""
    stat = _read(f"/proc/{pid}/stat")
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else ""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pidns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


@dataclass(frozen=True)
class Owner:
    """The process that started a container."""

    host: str
    pid: int
    started: str
    boot: str
    pidns: str

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        return cls(
            host=socket.gethostname(),
            pid=pid,
            started=process_start(pid),
            boot=_read("/proc/sys/kernel/random/boot_id").strip(),
            pidns=_pidns(),
        )

    def labels(self, run_id: str) -> dict[str, str]:
        return {
            labels.RUN: run_id,
            labels.OWNER_HOST: self.host,
            labels.OWNER_PID: str(self.pid),
            labels.OWNER_STARTED: self.started,
            labels.OWNER_BOOT: self.boot,
            labels.OWNER_PIDNS: self.pidns,
        }

    @classmethod
    def from_labels(cls, lbl: Mapping[str, str]) -> Owner | None:
        try:
            pid = int(lbl.get(labels.OWNER_PID, ""))
        except ValueError:
            return None
        return cls(
            host=lbl.get(labels.OWNER_HOST, ""),
            pid=pid,
            started=lbl.get(labels.OWNER_STARTED, ""),
            boot=lbl.get(labels.OWNER_BOOT, ""),
            pidns=lbl.get(labels.OWNER_PIDNS, ""),
        )

    def state(self, me: Owner) -> tuple[OwnerState, str]:
        """Is this owner still running, as far as `me` (the current process) can tell?"""
        who = f"pid {self.pid} on {self.host or 'an unknown host'}"
        if self.host != me.host:
            return "elsewhere", f"owned by {who}, another machine: cannot tell whether it still runs"
        if self.boot and me.boot and self.boot != me.boot:
            return "gone", f"owned by {who} before the machine's last boot"
        if self.pidns and me.pidns and self.pidns != me.pidns:
            return "elsewhere", f"owned by {who} in another PID namespace ({self.pidns}): cannot tell"
        if not pid_alive(self.pid):
            return "gone", f"owned by {who}, which is gone"
        if self.started and process_start(self.pid) not in ("", self.started):
            return "gone", f"owned by {who}, which has exited (the pid now belongs to another process)"
        return "live", f"owned by {who}, still running"


@dataclass(frozen=True)
class Leftover:
    id: str
    name: str
    status: str
    state: OwnerState
    why: str
    removed: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "status": self.status,
            "owner": self.state,
            "why": self.why,
            "removed": self.removed,
        }


def sweep_leftovers(engine: EngineAPI, me: Owner, log: Logger) -> list[Leftover]:
    """Remove the labelled containers of dead runs on this engine; report those of live ones."""
    out: list[Leftover] = []
    for c in engine.containers(labels.OWNER_PID):
        owner = Owner.from_labels(c.labels)
        if owner is None:
            continue
        if owner.pid == me.pid and owner.started == me.started and owner.host == me.host:
            continue  # this very process (a second smoke in one `pipeline build`)
        state, why = owner.state(me)
        removed = False
        if state == "gone":
            engine.remove_container(c.id, name=c.name)
            removed = True
            log.warn(f"removed leftover container {c.name} ({c.id[:12]}, {c.status}): {why}")
        else:
            log.warn(f"left alone: container {c.name} ({c.id[:12]}, {c.status}) {why}")
        out.append(Leftover(c.id, c.name, c.status, state, why, removed))
    return out


# --------------------------------------------------------------------------- who holds the port


@dataclass(frozen=True)
class Holder:
    """A process listening on the port, and the container it runs in (if any)."""

    pid: int
    cmdline: str
    container: ContainerInfo | None
    owner: str = ""  # for a container of a pipeline run: its owner's state

    def describe(self) -> str:
        if self.container is None:
            return f"process {self.pid} (`{self.cmdline or '?'}`), not in any container of this engine"
        c = self.container
        run = c.labels.get(labels.RUN) or c.labels.get("org.atom-image-pipeline.smoke.run")
        text = f"container {c.name} ({c.id[:12]}, image {c.image_id[:19]}, {c.status})"
        if run:
            text += f" of smoke run {run}"
        if self.owner:
            text += f", {self.owner}"
        return text + f": process {self.pid} `{self.cmdline or '?'}`"


def _parse_probe(out: str, what: str) -> dict[str, Any]:
    line = out.strip().splitlines()[-1] if out.strip() else ""
    try:
        data = json.loads(line)
    except ValueError:
        data = None
    if not isinstance(data, dict) or "listeners" not in data:
        raise InfraError(
            f"the listener probe ({what}) gave no result, so the smoke test cannot tell which server "
            "would answer it.",
            hint="The image needs a Python 3 interpreter at server.python.",
            evidence=out[-3000:],
        )
    return data


@dataclass(frozen=True)
class HostProbe:
    """How to read the listening sockets of the engine's host: the listener probe (`probe`, run by
    the image's `python`) in a short-lived container from `image`, with host network and PIDs."""

    engine: EngineAPI
    image: str
    python: str
    probe: str
    labels: Mapping[str, str]
    me: Owner


def host_listeners(host: HostProbe, port: int) -> tuple[list[dict[str, Any]], list[Holder]]:
    """The sockets listening on `port` on the engine's host, and who holds them (a probe container)."""
    argv = [host.python, "-c", host.probe, "listeners", str(port)]
    name = f"atom-smoke-port-{port}-{os.urandom(4).hex()}"
    with host.engine.run(
        host.image,
        argv,
        name=name,
        network_mode="host",
        pid_mode="host",
        cap_add=["SYS_PTRACE"],  # to read other processes' /proc/<pid>/fd
        read_only=True,
        labels=dict(host.labels),
    ) as c:
        c.wait(timeout=120)
        out = c.logs()
    data = _parse_probe(out, f"in a container from {host.image} on the engine's host network")
    running = host.engine.running_containers()
    holders = []
    for h in data.get("holders") or []:
        ids = set(_CONTAINER_ID.findall(str(h.get("cgroup", ""))))
        owner_c = next((c for c in running if c.id in ids or (c.pid and c.pid == h.get("pid"))), None)
        owner = ""
        if owner_c is not None:
            o = Owner.from_labels(owner_c.labels)
            if o is not None:
                owner = o.state(host.me)[1]
        holders.append(Holder(int(h.get("pid", 0)), str(h.get("cmdline", "")), owner_c, owner))
    return list(data.get("listeners") or []), holders


def check_port_free(host: HostProbe, port: int) -> None:
    """Refuse (InfraError, exit 11) when something already listens on the host's `port`."""
    found, holders = host_listeners(host, port)
    if not found:
        return
    named = "; ".join(h.describe() for h in holders) or (
        "a process this probe cannot see (socket inode " + ", ".join(str(f.get("inode")) for f in found) + ")"
    )
    live_run = any(h.container is not None and "still running" in h.owner for h in holders)
    raise InfraError(
        f"port {port} on the engine's host is already taken, and the recipe serves on it with host "
        f"networking, so the probes could be answered by another server: held by {named}. "
        "Nothing was started.",
        hint=(
            "Another smoke run is using it: wait for it to finish, or run this one on another engine."
            if live_run
            else "Stop that process or container (it is not this run's), then run the smoke test again."
        ),
        evidence=json.dumps(found),
    )


class NotOurServer(InfraError):
    """What answered the probes is not (or not provably) the server of this run's container."""


def prove_identity(
    container: ContainerAPI,
    *,
    port: int,
    python: str,
    probe: str,
    image_id: str,
    network_mode: str,
    when: str,
    earlier: ServerEvidence | None = None,
) -> ServerEvidence:
    """Evidence that every listener on `port` is a process of `container`, running `image_id`."""
    code, out = container.exec([python, "-c", probe, "listeners", str(port)])
    data = _parse_probe(out, f"in container {container.name}, exit {code}")
    found = list(data.get("listeners") or [])
    holders = list(data.get("holders") or [])
    ours = {str(h.get("inode")) for h in holders}
    info = container.info()
    if info.image_id != image_id:
        raise NotOurServer(
            f"container {container.name} runs image {info.image_id[:19]}, not the image under test "
            f"{image_id[:19]}; no gate counts.",
        )
    if not found:
        raise NotOurServer(
            f"nothing listens on port {port} in container {container.name} ({when}), yet the server "
            "answered: the answers came from somewhere else; no gate counts.",
        )
    foreign = [f for f in found if str(f.get("inode")) not in ours]
    if foreign:
        where = ", ".join(f"{f.get('address')} (socket inode {f.get('inode')})" for f in foreign)
        raise NotOurServer(
            f"port {port} is also held by a process outside this run's container {container.name} "
            f"({when}): {where}. Its answers could be another server's; no gate counts.",
            evidence=json.dumps(data)[:3000],
        )
    checked = [*(earlier.checked if earlier else []), when]
    return ServerEvidence(
        container_id=info.id,
        container_name=info.name,
        image_id=info.image_id,
        port=port,
        network_mode=network_mode or info.network_mode,
        listeners=[f"{f.get('address')} inode {f.get('inode')}" for f in found],
        pids=sorted({int(h.get("pid", 0)) for h in holders}),
        proven_by="every socket listening on the port is held by a process in the container's own "
        "PID namespace (/proc/net/tcp{,6} inode = /proc/<pid>/fd socket), and the container runs "
        "the image under test",
        checked=checked,
    )


def name_foreign_holders(host: HostProbe, port: int) -> str:
    """Best effort, for the message: who holds the host's `port` besides our container."""
    with contextlib.suppress(PipelineError):
        _, holders = host_listeners(host, port)
        return "; ".join(h.describe() for h in holders)
    return ""
