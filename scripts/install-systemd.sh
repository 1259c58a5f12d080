#!/usr/bin/env bash
# Install the sglang-supervisor@.service unit and an example config.
#
#   sudo scripts/install-systemd.sh [--venv DIR] [--name NAME]
#
# --venv: the virtual environment sglang-supervisor is installed in (default: this checkout's
#         .venv); the unit's ExecStart= points at DIR/bin/sglang-supervisor.
# --name: the instance to prepare: copies configs/run-example.toml to
#         /etc/sglang-supervisor/NAME.toml unless that file exists (default: example).
# DESTDIR=/some/root installs below that root instead of / and skips systemctl (for packaging
# and tests).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="$here/.venv"
name="example"
while [ $# -gt 0 ]; do
  case "$1" in
    --venv) venv="$2"; shift 2 ;;
    --name) name="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "install-systemd.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
venv="$(cd "$venv" && pwd)"
exe="$venv/bin/sglang-supervisor"
if [ ! -x "$exe" ]; then
  echo "install-systemd.sh: $exe is not executable; install the package first: $venv/bin/pip install $here" >&2
  exit 2
fi
root="${DESTDIR:-}"
unit_dir="$root/etc/systemd/system"
conf_dir="$root/etc/sglang-supervisor"
mkdir -p "$unit_dir" "$conf_dir"
sed "s#^ExecStart=/opt/sglang-supervisor/.venv/bin/sglang-supervisor #ExecStart=$exe #" \
  "$here/systemd/sglang-supervisor@.service" > "$unit_dir/sglang-supervisor@.service"
chmod 0644 "$unit_dir/sglang-supervisor@.service"
if [ ! -e "$conf_dir/$name.toml" ]; then
  install -m 0640 "$here/configs/run-example.toml" "$conf_dir/$name.toml"
  echo "wrote $conf_dir/$name.toml: edit [server] args, then start the unit"
fi
echo "installed $unit_dir/sglang-supervisor@.service (ExecStart=$exe)"
if [ -z "$root" ]; then
  systemctl daemon-reload
  echo "start with: systemctl enable --now sglang-supervisor@$name"
fi
