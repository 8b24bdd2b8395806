"""A real OpenSSH server on 127.0.0.1 in front of the local dockerd: the docker tier's "GPU host".

`start_sshd(root)` runs Debian's ``/usr/sbin/sshd`` (package openssh-server) on a free port with
a generated host key, a generated client key in its authorized_keys and root login by key only.
The Docker SDK reaches ``ssh://root@127.0.0.1:PORT`` through the real ``ssh`` client, which
runs ``docker system dial-stdio`` on the "remote" side, exactly as on a GPU host.

The client side needs what a user's ``~/.ssh/config`` gives (identity file, known_hosts): ssh
reads that file from the passwd home, not ``$HOME``, and this machine's root is shared, so the
tests put a ``bin/ssh`` first on ``PATH`` that runs ``/usr/bin/ssh -F <our config>``. Faults:
``wrong_host_key()`` (known_hosts pins another key), ``refuse_login()`` (the key is no longer
authorized) and ``drop_sessions()`` (kill every ssh session sshd serves, as a network drop would;
the listener stays up, so a new connection can clean up).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.fixtures.procs import stop

SSHD = "/usr/sbin/sshd"


@dataclass
class Sshd:
    root: Path
    port: int
    process: subprocess.Popen[bytes]
    client_key: Path
    known_hosts: Path
    authorized_keys: Path
    bin_dir: Path  # put first on PATH: its `ssh` uses our client config

    @property
    def docker_host(self) -> str:
        return f"ssh://root@127.0.0.1:{self.port}"

    @property
    def env_path(self) -> str:
        return f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"

    def log(self) -> str:
        return (self.root / "sshd.log").read_text(errors="replace")

    def wrong_host_key(self) -> None:
        other = self.root / "other_host_key"
        _keygen(other)
        pub = (other.with_suffix(".pub")).read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {pub[0]} {pub[1]}\n")

    def refuse_login(self) -> None:
        self.authorized_keys.write_text("")

    def session_pids(self) -> list[int]:
        """The sshd processes serving sessions (children of our listener), not the listener."""
        out = subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(self.process.pid)], capture_output=True, text=True, check=False
        ).stdout
        return [int(p) for p in out.split()]

    def drop_sessions(self) -> int:
        pids = self.session_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "atom-pipeline-test", "-f", str(path)],
        check=True,
        capture_output=True,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        try:
            s.connect(("127.0.0.1", port))
            return s.recv(4).startswith(b"SSH-")
        except OSError:
            return False


@contextlib.contextmanager
def start_sshd(root: Path) -> Iterator[Sshd]:
    if not os.access(SSHD, os.X_OK):
        raise FileNotFoundError(f"{SSHD} is missing: run `make setup` (Debian package openssh-server).")
    root.mkdir(parents=True, exist_ok=True)
    host_key, client_key = root / "host_key", root / "client_key"
    _keygen(host_key)
    _keygen(client_key)
    authorized = root / "authorized_keys"
    authorized.write_text(client_key.with_suffix(".pub").read_text())
    known = root / "known_hosts"
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    for _attempt in range(3):
        port = _free_port()
        config = root / "sshd_config"
        config.write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {authorized}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "PrintMotd no\nLogLevel VERBOSE\nMaxStartups 100\nMaxSessions 100\n"
        )
        with (root / "sshd.log").open("ab") as logf:
            proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(config)],
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None and not _answers(port):
            time.sleep(0.05)
        if proc.poll() is None and _answers(port):
            break
        proc.kill()
        proc.wait()
    else:
        raise RuntimeError(f"sshd did not come up: {(root / 'sshd.log').read_text()[-2000:]}")
    pub = host_key.with_suffix(".pub").read_text().split()
    known.write_text(f"[127.0.0.1]:{port} {pub[0]} {pub[1]}\n")
    client_config = root / "ssh_config"
    client_config.write_text(
        "Host 127.0.0.1\n"
        "  User root\n"
        f"  IdentityFile {client_key}\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known}\n"
        "  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n"
        "  ConnectTimeout 10\n"
        "  ServerAliveInterval 5\n"
        "  ServerAliveCountMax 2\n"
        "  LogLevel ERROR\n"
    )
    bin_dir = root / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "ssh"
    wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {client_config} "$@"\n')
    wrapper.chmod(0o755)
    sshd = Sshd(root, port, proc, client_key, known, authorized, bin_dir)
    try:
        yield sshd
    finally:
        for pid in sshd.session_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stop(proc, timeout=10)
