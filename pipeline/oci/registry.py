"""A small Docker Registry HTTP API v2 client (requests), and image references.

Why not the engine: the Docker Engine API can push and pull, but it cannot read a manifest's
digest or body, read a config blob, or PUT a manifest under another tag without re-pushing.
Those are what tagging needs (read the pushed digest back, move a moving tag to exactly that
manifest, read the moving tag's current image to move only forward), so this module speaks
the registry API for them and nothing else. Credentials come from the environment or, through
`docker.auth` (the SDK's own reader: ``auths``, ``credHelpers``, ``credsStore``), the Docker config.

What the pipeline needs from a registry and nothing more:

    ref = parse_image_ref("127.0.0.1:5000/atom:MiniMax-M3-verified")
    client = RegistryClient(ref.registry, credentials=credentials_for(ref.registry, env))
    client.manifest_digest(ref.repository, "MiniMax-M3-verified")   # "sha256:..." or None
    body, media_type, digest = client.get_manifest(ref.repository, digest)
    client.put_manifest(ref.repository, "latest", body, media_type)  # move a tag, no layer re-push
    client.delete_tag(ref.repository, "latest")                      # None, or why the registry would not
    resolve_digest("rocm/pytorch:rocm7.2.4...")                      # None when no registry answers

Authentication follows the registry's challenge: ``WWW-Authenticate: Basic``
(htpasswd registries) or ``Bearer`` (token service, e.g. Docker Hub, GHCR).
Transient failures (connection errors, timeouts, 429, 5xx) are retried with
exponential backoff (`pipeline.retry`), then become a ``RegistryUnavailable``
(an ``InfraError`` carrying the last HTTP status); refusals (401/403/4xx)
are a ``TagError`` at once. Credentials never appear in an exception, a log
line or a ``repr()``.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import requests

from pipeline.errors import InfraError, TagError, UsageError
from pipeline.oci.ref import DIGEST_RE as DIGEST_RE
from pipeline.oci.ref import DOCKER_HUB as DOCKER_HUB
from pipeline.oci.ref import DOCKER_HUB_ALIASES as _DOCKER_HUB_ALIASES
from pipeline.oci.ref import ImageRef as ImageRef  # the one reference grammar, re-exported for callers
from pipeline.oci.ref import parse_image_ref as parse_image_ref
from pipeline.oci.ref import tag_problem as tag_problem
from pipeline.oci.ref import validate_tag as validate_tag
from pipeline.retry import GaveUp, with_retries

DOCKER_HUB_API = "registry-1.docker.io"

MEDIA_OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MEDIA_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_ACCEPT = ", ".join((MEDIA_OCI_INDEX, MEDIA_OCI_MANIFEST, MEDIA_DOCKER_LIST, MEDIA_DOCKER_MANIFEST))


T = TypeVar("T")
_TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
_MAX_BACKOFF = 30.0


class RegistryError(TagError):
    """The registry answered and refused (404 on a needed manifest, 400, ...)."""


class RegistryAuthError(RegistryError):
    """The registry wants credentials we do not have, or refused the ones we sent."""


class RegistryUnavailable(InfraError):
    """The registry did not answer properly after every retry; `status` is its last HTTP status.

    A persistent 500 on one manifest is how distribution reports a broken revision link (a push
    killed halfway); the tag stage repairs that by pushing the immutable ref again.
    """

    def __init__(
        self, message: str, *, status: int | None, hint: str | None = None, evidence: str = ""
    ) -> None:
        super().__init__(message, hint=hint, evidence=evidence)
        self.status = status


class _Transient(Exception):
    def __init__(self, what: str, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.status = status
        self.retry_after = retry_after


# --------------------------------------------------------------------------- references


def validate_digest(digest: str, *, what: str = "digest") -> str:
    if not DIGEST_RE.match(digest):
        raise RegistryError(f"{what} '{digest}' is not a sha256 digest.")
    return digest


def default_scheme(registry: str) -> str:
    """``http`` for loopback registries (as dockerd treats 127.0.0.0/8 as insecure), else ``https``."""
    host = registry.rsplit(":", 1)[0] if not registry.startswith("[") else registry[1:].split("]")[0]
    if host == "localhost":
        return "http"
    try:
        return "http" if ipaddress.ip_address(host).is_loopback else "https"
    except ValueError:
        return "https"


# --------------------------------------------------------------------------- credentials


@dataclass(frozen=True)
class Credentials:
    """A username and a secret. The secret is never in ``repr()`` or ``str()``."""

    username: str
    password: str = field(repr=False)
    # where they came from, for messages: "env PIPELINE_REGISTRY_USER", "/root/.docker/config.json"
    source: str = ""

    def __iter__(self) -> Iterator[str]:  # unpacks like (user, password)
        return iter((self.username, self.password))

    def __str__(self) -> str:
        return f"credentials for {self.username!r} ({self.source or 'given'})"

    @property
    def auth_config(self) -> dict[str, str]:
        """The mapping docker-py's push/pull take."""
        return {"username": self.username, "password": self.password}


_ENV_PAIRS = (
    ("PIPELINE_REGISTRY_USER", "PIPELINE_REGISTRY_PASSWORD"),
    ("REGISTRY_USER", "REGISTRY_PASSWORD"),
)


def default_docker_config(env: Mapping[str, str]) -> Path:
    base = env.get("DOCKER_CONFIG")
    if base:
        return Path(base).expanduser() / "config.json"
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".docker" / "config.json"


def credentials_for(
    registry: str, env: Mapping[str, str], docker_config_path: Path | None = None
) -> Credentials | None:
    """Credentials for ``registry``: the environment first, then the Docker config.

    Environment: ``PIPELINE_REGISTRY_USER``/``PIPELINE_REGISTRY_PASSWORD``, or
    ``REGISTRY_USER``/``REGISTRY_PASSWORD`` (both of a pair must be set).
    Docker config (``$DOCKER_CONFIG/config.json`` or ``~/.docker/config.json``), read by
    `docker.auth`: ``auths[registry]`` (``auth`` or username/password), or a credential helper
    (``credHelpers[registry]`` / ``credsStore``) when its binary is on PATH.
    None when nothing is configured (anonymous access).
    """
    for user_var, pass_var in _ENV_PAIRS:
        user, password = env.get(user_var), env.get(pass_var)
        if user and password:
            return Credentials(user, password, f"env {user_var}")
    path = docker_config_path or default_docker_config(env)
    if not path.is_file():
        return None
    try:
        json.loads(path.read_text(encoding="utf-8"))  # docker.auth ignores a broken file silently
    except (OSError, ValueError) as e:
        raise UsageError(
            f"cannot read the Docker config {path}: {type(e).__name__}.",
            hint="Fix or remove the file, or give credentials in PIPELINE_REGISTRY_USER/PASSWORD.",
        ) from None
    import docker.auth  # the SDK's config reader (already a dependency); not at import time
    import docker.errors

    try:
        config = docker.auth.load_config(config_path=str(path), credstore_env=dict(env))
        found = config.resolve_authconfig("index.docker.io" if registry == DOCKER_HUB else registry)
    except (ValueError, docker.errors.DockerException) as e:  # a malformed entry: never echoed
        raise UsageError(
            f"the Docker config {path} has an unreadable entry for {registry} ({type(e).__name__}).",
            hint="Log in again (`docker login`) or give credentials in PIPELINE_REGISTRY_USER/PASSWORD.",
        ) from None
    if not found:
        return None
    user = str(found.get("Username") or found.get("username") or "")
    secret = str(found.get("Password") or found.get("password") or found.get("IdentityToken") or "")
    if not user or not secret:
        return None
    helper = config.get_credential_store("index.docker.io" if registry == DOCKER_HUB else registry)
    return Credentials(user, secret, f"credential helper docker-credential-{helper}" if helper else str(path))


# --------------------------------------------------------------------------- client


_CHALLENGE_RE = re.compile(r'(\w+)="([^"]*)"')


def _parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), dict(_CHALLENGE_RE.findall(rest))


class RegistryClient:
    """One registry, one set of credentials, bounded retries.

    ``registry`` is a host[:port] (``docker.io`` is mapped to its API host).
    ``scheme`` defaults to http for loopback hosts and https otherwise.
    """

    def __init__(
        self,
        registry: str,
        *,
        credentials: Credentials | tuple[str, str] | None = None,
        scheme: str | None = None,
        retries: int = 3,
        backoff: float = 0.5,
        timeout: float = 30.0,
        session: requests.Session | None = None,
        sleep: Callable[[float], None] = time.sleep,
        on_retry: Callable[[str], None] | None = None,
    ) -> None:
        self.registry = DOCKER_HUB if registry in _DOCKER_HUB_ALIASES else registry
        api_host = DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry
        self.scheme = scheme or default_scheme(api_host)
        self.base_url = f"{self.scheme}://{api_host}"
        if credentials is not None and not isinstance(credentials, Credentials):
            user, password = credentials
            credentials = Credentials(user, password)
        self._credentials: Credentials | None = credentials
        self.retries = max(0, retries)
        self.backoff = backoff
        self.timeout = timeout
        self.session = session or requests.Session()
        self._sleep = sleep
        self._on_retry = on_retry
        self._tokens: dict[str, str] = {}  # scope -> bearer token
        self._basic = False  # the registry asked for Basic auth

    def sleep(self, seconds: float) -> None:
        """How this client waits between attempts (replaced in tests)."""
        self._sleep(seconds)

    def __repr__(self) -> str:
        auth = f"user={self._credentials.username!r}" if self._credentials else "anonymous"
        return f"RegistryClient({self.base_url!r}, {auth})"

    # ------------------------------------------------------------------ API

    def ping(self) -> None:
        """GET /v2/ (authenticating if asked); InfraError when nothing answers."""
        self._request("GET", "/v2/", scope=None, ok=(200,), what="reach the registry API")

    def _manifest(self, method: str, repository: str, reference: str, what: str) -> requests.Response:
        """HEAD or GET of a manifest by tag or digest (200 or 404; anything else is an error)."""
        return self._request(
            method,
            f"/v2/{repository}/manifests/{reference}",
            scope=_scope(repository, "pull"),
            headers={"Accept": MANIFEST_ACCEPT},
            ok=(200, 404),
            what=what,
        )

    def manifest_digest(self, repository: str, reference: str) -> str | None:
        """The digest ``repository:reference`` points at, or None when the registry does not have it."""
        resp = self._manifest("HEAD", repository, reference, f"look up {self._show(repository, reference)}")
        if resp.status_code == 404:
            return None
        digest = resp.headers.get("Docker-Content-Digest")
        if digest and DIGEST_RE.match(digest):
            return digest
        # Some registries leave the header off HEAD answers: read the body and hash it.
        _, _, digest = self.get_manifest(repository, reference)
        return digest

    def get_manifest(self, repository: str, reference: str) -> tuple[bytes, str, str]:
        """``(manifest bytes, media type, digest)``; RegistryError when it does not exist."""
        what = self._show(repository, reference)
        resp = self._manifest("GET", repository, reference, f"read the manifest of {what}")
        if resp.status_code == 404:
            raise RegistryError(f"the registry has no manifest for {what}.", evidence=_body(resp))
        body = resp.content
        computed = "sha256:" + hashlib.sha256(body).hexdigest()
        header = resp.headers.get("Docker-Content-Digest")
        if reference.startswith("sha256:") and computed != reference:
            raise RegistryError(
                f"the manifest the registry returned for {what} hashes to {computed}, "
                "not the digest asked for.",
                hint="The registry or something between us and it is corrupting data; nothing was changed.",
            )
        media_type = resp.headers.get("Content-Type", "").split(";", 1)[0].strip()
        if not media_type:
            try:
                media_type = str(json.loads(body).get("mediaType") or MEDIA_DOCKER_MANIFEST)
            except ValueError:
                media_type = MEDIA_DOCKER_MANIFEST
        return body, media_type, (header if header and DIGEST_RE.match(header) else computed)

    def put_manifest(self, repository: str, tag: str, manifest: bytes, media_type: str) -> str:
        """PUT ``manifest`` under ``tag`` (the blobs must already be in ``repository``); its digest."""
        validate_tag(tag)
        path = f"/v2/{repository}/manifests/{tag}"
        what = self._show(repository, tag)
        resp = self._request(
            "PUT",
            path,
            scope=_scope(repository, "pull,push"),
            headers={"Content-Type": media_type},
            data=manifest,
            ok=(200, 201, 202),
            what=f"put the manifest for {what}",
        )
        computed = "sha256:" + hashlib.sha256(manifest).hexdigest()
        header = resp.headers.get("Docker-Content-Digest")
        if header and header != computed:
            raise RegistryError(
                f"the registry stored {what} as {header} but the manifest we sent is {computed}.",
                evidence=_body(resp),
            )
        return computed

    def tag_digest(self, repository: str, digest: str, tag: str) -> str:
        """Point ``tag`` at the existing manifest ``digest`` without re-pushing any layer."""
        validate_digest(digest)
        validate_tag(tag)
        body, media_type, got = self.get_manifest(repository, digest)
        if got != digest:
            raise RegistryError(f"asked the registry for {digest} in {repository} and got {got}.")
        stored = self.put_manifest(repository, tag, body, media_type)
        if stored != digest:
            raise RegistryError(f"{self._show(repository, tag)} was stored as {stored}, not {digest}.")
        return stored

    def delete_tag(self, repository: str, tag: str) -> str | None:
        """Remove ``tag`` alone (``DELETE /v2/<repo>/manifests/<tag>``, OCI distribution 1.1); None when
        gone, else why not: distribution 2.x answers 400 (DIGEST_INVALID), others 405 or UNSUPPORTED.

        Never by digest: that would delete the manifest, and with it every tag pointing at it.
        """
        validate_tag(tag)
        what = self._show(repository, tag)
        resp = self._request(
            "DELETE",
            f"/v2/{repository}/manifests/{tag}",
            scope=_scope(repository, "delete"),
            ok=(200, 202, 204, 400, 403, 404, 405),
            what=f"delete the tag {what}",
        )
        if resp.status_code in (200, 202, 204, 404):
            return None
        detail = _error_detail(resp)
        return f"HTTP {resp.status_code}{f' {detail}' if detail else ''}"

    def get_blob(self, repository: str, digest: str) -> bytes:
        """A blob (e.g. an image config) by digest, checked against that digest."""
        validate_digest(digest)
        resp = self._request(
            "GET",
            f"/v2/{repository}/blobs/{digest}",
            scope=_scope(repository, "pull"),
            ok=(200, 404),
            what=f"read blob {digest[:19]} of {self.registry}/{repository}",
        )
        if resp.status_code == 404:
            raise RegistryError(f"the registry has no blob {digest} in {repository}.")
        if "sha256:" + hashlib.sha256(resp.content).hexdigest() != digest:
            raise RegistryError(
                f"the blob {digest} from {self.registry}/{repository} does not match its digest."
            )
        return resp.content

    def tags(self, repository: str) -> list[str]:
        """The repository's tags (empty when the repository does not exist)."""
        resp = self._request(
            "GET",
            f"/v2/{repository}/tags/list",
            scope=_scope(repository, "pull"),
            ok=(200, 404),
            what=f"list the tags of {self.registry}/{repository}",
        )
        if resp.status_code == 404:
            return []
        try:
            return sorted(str(t) for t in (resp.json().get("tags") or []))
        except ValueError:
            raise RegistryError(f"the registry's tag list for {repository} is not JSON.") from None

    # ------------------------------------------------------------------ HTTP

    def _show(self, repository: str, reference: str) -> str:
        sep = "@" if reference.startswith("sha256:") else ":"
        return f"{self.registry}/{repository}{sep}{reference}"

    def _request(
        self,
        method: str,
        path: str,
        *,
        scope: str | None,
        ok: tuple[int, ...],
        what: str,
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
    ) -> requests.Response:
        url = self.base_url + path
        authed_once = False

        def attempt() -> requests.Response:
            nonlocal authed_once
            while True:
                hdrs = dict(headers or {})
                hdrs.update(self._auth_header(scope))
                try:
                    resp = self.session.request(
                        method, url, headers=hdrs, data=data, timeout=self.timeout, allow_redirects=True
                    )
                except (requests.ConnectionError, requests.Timeout) as e:
                    raise _Transient(_scrub_exc(e)) from None
                if resp.status_code == 401 and not authed_once:
                    authed_once = True
                    self._authenticate(resp, scope, what)
                    continue
                if resp.status_code in ok:
                    return resp
                if resp.status_code not in _TRANSIENT_STATUS:
                    raise self._refusal(resp, what)
                after = resp.headers.get("Retry-After", "")
                raise _Transient(
                    f"HTTP {resp.status_code}", resp.status_code, float(after) if after.isdigit() else None
                )

        try:
            return self._retrying(attempt, what)
        except GaveUp as gave_up:
            last = gave_up.error
            assert isinstance(last, _Transient)
            n = gave_up.attempts
            raise RegistryUnavailable(
                f"the registry {self.registry} did not answer properly while trying to {what} "
                f"({last.what}; {n} attempt{'s' if n > 1 else ''}).",
                status=last.status,
                hint="Check that the registry is up and reachable from here, then run the command again; "
                "nothing was moved.",
                evidence=last.what,
            ) from None

    def _retrying(self, attempt: Callable[[], T], what: str) -> T:
        """The one retry policy (`pipeline.retry`) for this registry's transient failures."""

        def report(n: int, tries: int, wait: float, err: BaseException) -> None:
            if self._on_retry is not None:
                text = err.what if isinstance(err, _Transient) else str(err)
                self._on_retry(f"{what}: {text}; retrying in {wait:.1f}s ({n}/{tries - 1})")

        return with_retries(
            attempt,
            retries=self.retries,
            transient=lambda e: isinstance(e, _Transient),
            backoff=self.backoff,
            on_retry=report,
            max_wait=_MAX_BACKOFF,
            wait_hint=lambda e: e.retry_after if isinstance(e, _Transient) else None,
            sleep=self._sleep,
        )

    def _auth_header(self, scope: str | None) -> dict[str, str]:
        token = self._tokens.get(scope or "")
        if token:
            return {"Authorization": f"Bearer {token}"}
        if self._basic and self._credentials is not None:
            raw = f"{self._credentials.username}:{self._credentials.password}".encode()
            return {"Authorization": "Basic " + base64.b64encode(raw).decode()}
        return {}

    def _authenticate(self, resp: requests.Response, scope: str | None, what: str) -> None:
        """Answer a 401 challenge: remember Basic, or fetch a Bearer token for ``scope``."""
        challenge = resp.headers.get("WWW-Authenticate", "")
        kind, params = _parse_challenge(challenge)
        if kind == "basic":
            if self._credentials is None:
                raise self._need_credentials(what)
            self._basic = True
            return
        if kind != "bearer" or "realm" not in params:
            raise RegistryAuthError(
                f"the registry {self.registry} refused to {what} and asked for an authentication "
                f"scheme we do not speak ({kind or 'none'}).",
            )
        query = {"service": params["service"]} if "service" in params else {}
        wanted = params.get("scope") or scope
        if wanted:
            query["scope"] = wanted
        auth = (self._credentials.username, self._credentials.password) if self._credentials else None

        def fetch() -> requests.Response:
            try:
                got = self.session.get(params["realm"], params=query, auth=auth, timeout=self.timeout)
            except (requests.ConnectionError, requests.Timeout) as e:
                raise _Transient(_scrub_exc(e)) from None
            if got.status_code in _TRANSIENT_STATUS:
                raise _Transient(f"HTTP {got.status_code}", got.status_code)
            return got

        try:
            token_resp = self._retrying(fetch, f"get a token to {what}")
        except GaveUp as gave_up:
            last = gave_up.error
            raise RegistryUnavailable(
                f"the token service of {self.registry} did not answer while trying to {what} "
                f"({last.what if isinstance(last, _Transient) else last}).",
                status=last.status if isinstance(last, _Transient) else None,
                hint="Check that the registry is reachable, then run the command again; nothing was moved.",
            ) from None
        if token_resp.status_code in (401, 403):
            raise self._need_credentials(what) if self._credentials is None else self._bad_credentials(what)
        if token_resp.status_code != 200:
            raise RegistryAuthError(
                f"the token service of {self.registry} answered HTTP {token_resp.status_code} "
                f"while trying to {what}.",
                evidence=_body(token_resp),
            )
        try:
            payload = token_resp.json()
            token = str(payload.get("token") or payload.get("access_token") or "")
        except ValueError:
            token = ""
        if not token:
            raise RegistryAuthError(f"the token service of {self.registry} gave no token to {what}.")
        self._tokens[scope or ""] = token

    def _need_credentials(self, what: str) -> RegistryAuthError:
        return RegistryAuthError(
            f"the registry {self.registry} needs credentials to {what} and none are configured.",
            hint="Set PIPELINE_REGISTRY_USER and PIPELINE_REGISTRY_PASSWORD, or `docker login "
            f"{self.registry}`; nothing was moved.",
        )

    def _bad_credentials(self, what: str) -> RegistryAuthError:
        src = self._credentials.source if self._credentials and self._credentials.source else "given"
        user = self._credentials.username if self._credentials else "?"
        return RegistryAuthError(
            f"the registry {self.registry} refused the credentials of user '{user}' ({src}) "
            f"while trying to {what}.",
            hint="Check the user name and password (not shown) and the repository permissions; "
            "nothing was moved.",
        )

    def _refusal(self, resp: requests.Response, what: str) -> RegistryError:
        code = resp.status_code
        if code == 401:
            return self._bad_credentials(what) if self._credentials else self._need_credentials(what)
        if code == 403:
            return RegistryAuthError(
                f"the registry {self.registry} denied the request to {what} (HTTP 403).",
                hint="The credentials (not shown) lack permission on this repository.",
                evidence=_body(resp),
            )
        detail = _error_detail(resp)
        return RegistryError(
            f"the registry {self.registry} refused to {what}: HTTP {code}{f' ({detail})' if detail else ''}.",
            evidence=_body(resp),
        )


def _scope(repository: str, actions: str) -> str:
    return f"repository:{repository}:{actions}"


def _body(resp: requests.Response, limit: int = 2000) -> str:
    try:
        return resp.text[:limit]
    except Exception:  # pragma: no cover - undecodable body
        return ""


def _error_detail(resp: requests.Response) -> str:
    try:
        errors = resp.json().get("errors") or []
        return "; ".join(f"{e.get('code', '')}: {e.get('message', '')}".strip(": ") for e in errors)
    except (ValueError, AttributeError):
        return ""


def _scrub_exc(e: BaseException) -> str:
    """A short description of a connection error (no URL user-info can be in our URLs)."""
    text = str(e)
    m = re.search(
        r"(Connection refused|Name or service not known|Temporary failure in name resolution|"
        r"timed out|No route to host|Network is unreachable|Connection reset by peer)",
        text,
    )
    return f"{type(e).__name__}: {m.group(1) if m else text[:200]}"


# --------------------------------------------------------------------------- convenience


def resolve_digest(
    ref: str,
    *,
    timeout: float = 10.0,
    credentials: Credentials | tuple[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    session: requests.Session | None = None,
) -> str | None:
    """The manifest digest ``ref`` points at now, or None when no registry answers.

    A reference that already carries a digest returns it unchanged. With ``env``
    and no ``credentials``, the Docker config (not the pipeline's push
    credentials) is consulted for the reference's registry. The registry
    answering "no such manifest" or refusing access raises a RegistryError:
    that is not the network being down, and pinning must not hide it.
    """
    image = parse_image_ref(ref)
    if image.digest:
        return image.digest
    if credentials is None and env is not None:
        credentials = _docker_config_only(image.registry, env)
    # two attempts share the time budget, so a black-holed network costs about `timeout` seconds
    client = RegistryClient(
        image.registry, credentials=credentials, retries=1, backoff=0.2, timeout=timeout / 2, session=session
    )
    try:
        digest = client.manifest_digest(image.repository, image.reference)
    except InfraError:
        return None
    if digest is None:
        raise RegistryError(
            f"the registry {image.registry} has no image {image}.",
            hint="Check the image name and tag.",
        )
    return digest


def _docker_config_only(registry: str, env: Mapping[str, str]) -> Credentials | None:
    scrubbed = {k: v for k, v in env.items() if k not in {n for pair in _ENV_PAIRS for n in pair}}
    try:
        return credentials_for(registry, scrubbed)
    except UsageError:
        return None
