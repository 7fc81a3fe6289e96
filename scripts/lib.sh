# shellcheck shell=bash
# Idempotent helpers for setting up this machine; source me (setup.sh does).
# Each ensure_* is cheap when its thing is already there, so scripts can call
# them every time. Progress goes to stderr; stdout stays clean for callers.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE_CACHE=/var/cache/console-images
_APT_UPDATED=""

log() { echo "setup: $*" >&2; }

# _quiet LOGFILE CMD...: run CMD with its chatter in LOGFILE; show the tail only on failure.
_quiet() {
  local logfile=$1 rc=0
  shift
  "$@" >"$logfile" 2>&1 || rc=$?
  ((rc == 0)) || { tail -20 "$logfile" >&2; log "failed ($rc): $* (full log: $logfile)"; }
  return "$rc"
}

# ensure_apt PKG...: install only what dpkg says is missing; update lists once.
ensure_apt() {
  local missing=() p
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  # NEEDRESTART_SUSPEND: needrestart's apt hook must not restart services we do not own.
  export DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1
  # Lock timeout: wait for another apt-get (e.g. a background install) instead of failing.
  local apt=(apt-get -q -o DPkg::Lock::Timeout=600)
  if [[ -z $_APT_UPDATED ]]; then
    log "apt-get update"
    _quiet /var/log/console-apt.log "${apt[@]}" update
    _APT_UPDATED=1
  fi
  log "apt-get install ${missing[*]}"
  _quiet /var/log/console-apt.log "${apt[@]}" install -y --no-install-recommends "${missing[@]}"
}

# ensure_venv: .venv in the repo root, reinstalled when requirements.txt changes.
ensure_venv() {
  local venv="$REPO_ROOT/.venv" req="$REPO_ROOT/requirements.txt" sum
  sum="$(sha256sum "$req" | cut -d' ' -f1)"
  [[ -x $venv/bin/python && "$(cat "$venv/.requirements.sha256" 2>/dev/null)" == "$sum" ]] && return 0
  if [[ ! -x $venv/bin/python ]]; then
    log "creating .venv"
    python3 -m venv "$venv"
  fi
  log "pip install -r requirements.txt"
  _quiet "$venv/pip-install.log" "$venv/bin/pip" install --disable-pip-version-check -r "$req"
  # Stamp only after a successful install, so a failed one is retried next time.
  echo "$sum" >"$venv/.requirements.sha256"
}

# ensure_dockerd: a Docker engine on the default socket. No bridge/iptables:
# jobs use network "none" (or "host"), and this machine may lack iptables rights.
ensure_dockerd() {
  docker info >/dev/null 2>&1 && return 0
  ensure_apt docker.io
  log "starting dockerd (log /var/log/console-dockerd.log)"
  # setsid+nohup: the engine must outlive this script and its terminal.
  setsid nohup dockerd --bridge=none --iptables=false --ip-masq=false \
    >>/var/log/console-dockerd.log 2>&1 </dev/null &
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  log "dockerd did not answer within 30 s; see /var/log/console-dockerd.log"
  return 1
}

ensure_postgres() {
  pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null && return 0
  ls /etc/postgresql/*/main >/dev/null 2>&1 || ensure_apt postgresql
  local ver hba
  # shellcheck disable=SC2012  # version dirs are plain numbers
  ver="$(ls /etc/postgresql | sort -V | tail -1)"
  hba="/etc/postgresql/$ver/main/pg_hba.conf"
  # First matching hba line wins, so put trust for postgres@127.0.0.1 on top.
  if ! grep -Eq '^host\s+all\s+(all|postgres)\s+127\.0\.0\.1/32\s+trust' "$hba"; then
    log "pg_hba: trust postgres@127.0.0.1"
    sed -i '1i host all postgres 127.0.0.1/32 trust' "$hba"
  fi
  log "starting PostgreSQL $ver"
  pg_ctlcluster --skip-systemctl-redirect "$ver" main start >&2 || true  # "already running" is fine
  for _ in $(seq 30); do
    pg_isready -q -h 127.0.0.1 -p 5432 && return 0
    sleep 0.5
  done
  log "PostgreSQL is not answering on 127.0.0.1:5432"
  return 1
}

ensure_redis() {
  [[ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" == PONG ]] && return 0
  command -v redis-server >/dev/null || ensure_apt redis-server
  mkdir -p /var/lib/redis /var/log/redis
  log "starting redis-server"
  # Throwaway cache/broker: no persistence, loopback only.
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
    --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log >&2
  for _ in $(seq 30); do
    [[ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" == PONG ]] && return 0
    sleep 0.2
  done
  log "Redis is not answering on 127.0.0.1:6379"
  return 1
}

# The Debian mirror this machine's apt uses (the one carrying plain "bookworm"),
# from one-line .list files or deb822 .sources files.
debian_mirror() {
  local m
  m="$(
    {
      # One-line format: deb [opts] URI SUITE COMPONENTS...
      sed -E 's/\[[^]]*\]//' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        awk '$1 == "deb" && $3 == "bookworm" { print $2 }'
      # deb822: blank-line separated stanzas with URIs: and Suites: fields.
      cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
        awk 'BEGIN { RS = ""; FS = "\n" }
             { u = ""; s = ""
               for (i = 1; i <= NF; i++) {
                 if ($i ~ /^URIs:/) u = $i
                 if ($i ~ /^Suites:/) s = $i }
               if (s ~ /[: ]bookworm( |$)/) { split(u, a, " "); print a[2] } }'
    } | grep -m1 . || true
  )"
  echo "${m:-http://deb.debian.org/debian}"
}

# Images are built from local files only: this machine has no registry to pull from.
# Builders run in a subshell ( ... ) so their EXIT trap cleans their temp dir.
_build_busybox_image() (
  ensure_apt busybox-static
  local root
  root="$(mktemp -d /var/tmp/console-busybox.XXXXXX)"
  trap 'rm -rf "$root"' EXIT
  cd "$root" || exit
  mkdir -p bin etc tmp root home/ma-user usr
  chmod 1777 tmp
  cp /bin/busybox bin/busybox
  # Link every applet: unlinked applets would not be found on PATH.
  local a
  for a in $(bin/busybox --list); do
    [[ -e bin/$a ]] || ln -s busybox "bin/$a"
  done
  # /usr/bin/env etc. for "#!/usr/bin/env ..." scripts.
  ln -s bin sbin && ln -s ../bin usr/bin && ln -s ../bin usr/sbin
  printf 'root:x:0:0:root:/root:/bin/sh\nma-user:x:1000:1000::/home/ma-user:/bin/sh\n' >etc/passwd
  printf 'root:x:0:\nma-user:x:1000:\n' >etc/group
  chown 1000:1000 home/ma-user
  tar -C "$root" --numeric-owner -c . |
    docker import -c 'CMD ["sh"]' -c 'ENV PATH=/bin:/usr/bin:/sbin:/usr/sbin' \
      -c 'LABEL console.image=1' - console/busybox:latest >/dev/null
)

# The Debian packages of the python image's root file system; a change rebuilds it (and so the
# images above it). openssh-server: SSH remote development reaches the instance's own sshd
# through the console (jobs/views/ssh.py), run as ma-user by the launcher.
PYTHON_BASE_PACKAGES="python3,python3-numpy,openssh-server"
_python_base_tag() { echo "$PYTHON_BASE_PACKAGES" | sha256sum | cut -c1-12; }

_build_python_rootfs() (
  ensure_apt debootstrap
  local root mirror tar="$IMAGE_CACHE/python-3.11-$(_python_base_tag).tar"
  root="$(mktemp -d /var/tmp/console-python.XXXXXX)"
  trap 'rm -rf "$root" "$tar.part"' EXIT
  mirror="$(debian_mirror)"
  log "debootstrap bookworm from $mirror (~1 min, log /var/log/console-debootstrap.log)"
  _quiet /var/log/console-debootstrap.log debootstrap --variant=minbase \
    --include="$PYTHON_BASE_PACKAGES" bookworm "$root" "$mirror"
  useradd --root "$root" -m -u 1000 -U -s /bin/bash ma-user
  # Drop what a job never needs, to keep the image small.
  rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* \
    "$root"/usr/share/{doc,locale,man,info}/*
  mkdir -p "$IMAGE_CACHE"
  # Write then rename, so an interrupted run never leaves a half tarball as "cache".
  tar -C "$root" --numeric-owner -cf "$tar.part" .
  mv "$tar.part" "$tar"
)

# py-spy, for the stacks of a hung Python job (jobs/runtime/hang.py): the static
# binary from PyPI's wheel, cached beside the rootfs. Prints its path.
PY_SPY_VERSION=0.4.3
_py_spy_binary() {
  local bin="$IMAGE_CACHE/py-spy-$PY_SPY_VERSION" tmp rc=0
  if [[ ! -x $bin ]]; then
    log "downloading py-spy $PY_SPY_VERSION (wheel from PyPI)"
    mkdir -p "$IMAGE_CACHE"
    tmp="$(mktemp -d /var/tmp/console-py-spy.XXXXXX)"
    _quiet "$tmp/pip.log" "$REPO_ROOT/.venv/bin/pip" download --disable-pip-version-check --no-deps \
      --only-binary=:all: --dest "$tmp" "py-spy==$PY_SPY_VERSION" &&
      "$REPO_ROOT/.venv/bin/python" - "$tmp" "$bin.part" <<'PY' && mv "$bin.part" "$bin" || rc=$?
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("py_spy-*.whl"))
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".data/scripts/py-spy"))
    pathlib.Path(sys.argv[2]).write_bytes(z.read(name))
pathlib.Path(sys.argv[2]).chmod(0o755)
PY
    rm -rf "$tmp" "$bin.part"
    ((rc == 0)) || { log "could not get py-spy $PY_SPY_VERSION"; return "$rc"; }
  fi
  echo "$bin"
}

# What console/python:3.11 adds to the imported rootfs; a change of any of it
# (examples/, py-spy, this recipe) changes the label and rebuilds the image.
_PYTHON_IMAGE_RECIPE='FROM console/python-base:3.11
COPY examples/ /opt/console/examples/
COPY py-spy /usr/local/bin/py-spy
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CMD ["python3"]'

_examples_sha() {  # the image's content hash: examples/ (no bytecode), py-spy, the recipe
  local pyspy=$1
  {
    (cd "$REPO_ROOT" && find examples -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 |
      LC_ALL=C sort -z | xargs -0 -r sha256sum)
    sha256sum <"$pyspy"
    echo "$_PYTHON_IMAGE_RECIPE"
    _python_base_tag
  } | sha256sum | cut -c1-16
}

# console/python:3.11 = the imported rootfs (console/python-base:3.11, from the
# cached tar) + examples/ at /opt/console/examples + py-spy on PATH, built
# with COPY only (no network, no RUN): about a second.
_build_python_image() (
  local pyspy=$1 sha=$2 ctx old
  old="$(docker image inspect -f '{{.Id}}' console/python:3.11 2>/dev/null || true)"
  local tag
  tag="$(_python_base_tag)"
  if [[ "$(docker image inspect -f '{{index .Config.Labels "console.base"}}' console/python-base:3.11 2>/dev/null)" != "$tag" ]]; then
    # The cached rootfs survives a wiped /var/lib/docker; debootstrap is the slow part.
    [[ -s $IMAGE_CACHE/python-3.11-$tag.tar ]] || _build_python_rootfs
    log "importing console/python-base:3.11 ($PYTHON_BASE_PACKAGES)"
    docker import -c 'CMD ["python3"]' -c 'LABEL console.image=1' -c "LABEL console.base=$tag" \
      "$IMAGE_CACHE/python-3.11-$tag.tar" console/python-base:3.11 >/dev/null
  fi
  ctx="$(mktemp -d /var/tmp/console-python-ctx.XXXXXX)"
  trap 'rm -rf "$ctx"' EXIT
  cp -r "$REPO_ROOT/examples" "$ctx/examples"
  find "$ctx/examples" \( -name __pycache__ -o -name '*.pyc' \) -prune -exec rm -rf {} +
  chmod -R a+rX "$ctx/examples"
  cp "$pyspy" "$ctx/py-spy"
  echo "$_PYTHON_IMAGE_RECIPE" >"$ctx/Dockerfile"
  log "building console/python:3.11 (examples + py-spy $PY_SPY_VERSION, console.examples-sha=$sha)"
  DOCKER_BUILDKIT=0 _quiet "$ctx/build.log" docker build -q --label "console.examples-sha=$sha" \
    -t console/python:3.11 "$ctx" || exit
  docker run --rm --network none --user 1000:1000 console/python:3.11 sh -c \
    'python3 -c "import numpy, json" && py-spy --version && test -r /opt/console/examples/train_checkpoint.py' \
    >/dev/null
  # The replaced image (small layers over the base) is dropped unless a container still uses it.
  [[ -z $old || $old == "$(docker image inspect -f '{{.Id}}' console/python:3.11)" ]] ||
    docker image rm "$old" >/dev/null 2>&1 || true
)

ensure_images() {
  # The console's own tools in every job container (/.console/bin): a static busybox.
  ensure_apt busybox-static
  if ! docker image inspect console/busybox:latest >/dev/null 2>&1; then
    log "building console/busybox:latest"
    _build_busybox_image
  fi
  local pyspy sha have
  pyspy="$(_py_spy_binary)" || return
  sha="$(_examples_sha "$pyspy")"
  have="$(docker image inspect -f '{{index .Config.Labels "console.examples-sha"}}' console/python:3.11 2>/dev/null || true)"
  [[ $have == "$sha" ]] || _build_python_image "$pyspy" "$sha"
}

# console/notebook:3.11 = console/python:3.11 + JupyterLab and TensorBoard, for jobs that open them
# through the console (jobs/proxy/). The wheels come from the package index this machine's pip
# uses (PyPI or its mirror) and are installed on the host into a folder that the build COPYs:
# no RUN, no network in the build. About a minute the first time; a label keeps it until the
# packages or the python image change.
NOTEBOOK_PACKAGES="jupyterlab==4.6.6 tensorboard==2.21.0"
_build_notebook_image() (
  local ctx base
  base="$(docker image inspect -f '{{.Id}}' console/python:3.11)"
  ctx="$(mktemp -d /var/tmp/console-notebook.XXXXXX)"
  trap 'rm -rf "$ctx"' EXIT
  log "installing $NOTEBOOK_PACKAGES for console/notebook:3.11 (~1 min, log $ctx/pip.log)"
  # shellcheck disable=SC2086
  _quiet "$ctx/pip.log" "$REPO_ROOT/.venv/bin/pip" install --disable-pip-version-check --no-compile \
    --only-binary=:all: --target "$ctx/site" $NOTEBOOK_PACKAGES || exit
  mv "$ctx/site/bin" "$ctx/bin" && mv "$ctx/site/share" "$ctx/share"
  # The scripts name the host's python: the image's is /usr/bin/python3.
  sed -i '1s|^#!.*python.*$|#!/usr/bin/python3|' "$ctx"/bin/*
  chmod -R a+rX "$ctx/site" "$ctx/bin" "$ctx/share"
  cat >"$ctx/Dockerfile" <<'DOCKERFILE'
FROM console/python:3.11
COPY site/ /usr/local/lib/python3.11/dist-packages/
COPY bin/ /usr/local/bin/
COPY share/ /usr/local/share/
ENV JUPYTERLAB_DIR=/usr/local/share/jupyter/lab
DOCKERFILE
  DOCKER_BUILDKIT=0 _quiet "$ctx/build.log" docker build -q --label "console.notebook=$1" \
    -t console/notebook:3.11 "$ctx" || exit
  docker run --rm --network none --user 1000:1000 -e HOME=/tmp console/notebook:3.11 sh -c \
    'jupyter lab --version && tensorboard --version_tb' >/dev/null 2>&1
)

ensure_notebook_image() {
  local want have
  want="$(echo "$NOTEBOOK_PACKAGES $(docker image inspect -f '{{.Id}}' console/python:3.11)" | sha256sum | cut -c1-16)"
  have="$(docker image inspect -f '{{index .Config.Labels "console.notebook"}}' console/notebook:3.11 2>/dev/null || true)"
  [[ $have == "$want" ]] || _build_notebook_image "$want"
}
