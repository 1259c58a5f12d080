#!/usr/bin/env bash
# Install the sglang-supervisor@.service unit, its README and an instance's config.
#
#   sudo scripts/install-systemd.sh [--venv DIR] [--name NAME]
#
# --venv: the virtual environment sglang-supervisor is installed in (default: this checkout's
#         .venv); the unit's ExecStart= points at DIR/bin/sglang-supervisor.
# --name: the instance to prepare (default: example), by the rule of [run] name: letters,
#         digits, '.', '_', '@', '-', not dots only. Unless they exist, writes
#         /etc/sglang-supervisor/NAME.toml (configs/run-example.toml with name = "NAME", and the
#         model config it names) and NAME.env (mode 0600, for HF_TOKEN=).
# DESTDIR=/some/root installs below that root instead of / and skips systemctl (for packaging
# and tests). Exit codes: 0 installed, 2 bad arguments (nothing written).
set -euo pipefail
export LC_ALL=C # [A-Za-z] below means ASCII letters only: unit names are ASCII
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="$here/.venv"
name="example"

fail() {
  echo "install-systemd.sh: $*" >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case "$1" in
    --venv | --name)
      [ $# -ge 2 ] && [ -n "$2" ] || fail "$1 needs a value (see --help)"
      if [ "$1" = --venv ]; then venv="$2"; else name="$2"; fi
      shift 2
      ;;
    -h | --help)
      sed -n '2,14p' "$0"
      exit 0
      ;;
    *) fail "unknown argument $1 (see --help)" ;;
  esac
done

# The rule of [run] name (supervisor/config/sections.py instance_name_problem), which `run`
# applies to --name %i: no '/' to leave /etc/sglang-supervisor, no name of dots only.
if ! [[ "$name" =~ ^[A-Za-z0-9._@-]+$ ]] || [[ "$name" =~ ^\.+$ ]]; then
  fail "--name '$name': must be ASCII letters, digits, '.', '_', '@' or '-', and not dots only (the rule of [run] name; ASCII as systemd unit names are)"
fi
[ -d "$venv" ] || fail "--venv $venv: no such directory (the virtual environment sglang-supervisor is installed in)"
venv="$(cd "$venv" && pwd)"
exe="$venv/bin/sglang-supervisor"
[ -x "$exe" ] || fail "$exe is not executable; install the package first: $venv/bin/pip install $here"

root="${DESTDIR:-}"
unit_dir="$root/etc/systemd/system"
conf_dir="$root/etc/sglang-supervisor"
doc_dir="$root/usr/share/doc/sglang-supervisor"
mkdir -p "$unit_dir" "$conf_dir" "$doc_dir"
sed "s#^ExecStart=/opt/sglang-supervisor/.venv/bin/sglang-supervisor #ExecStart=$exe #" \
  "$here/systemd/sglang-supervisor@.service" >"$unit_dir/sglang-supervisor@.service"
chmod 0644 "$unit_dir/sglang-supervisor@.service"
install -m 0644 "$here/README.md" "$doc_dir/README.md" # the unit's Documentation=
mkdir -p "$doc_dir/docs" && install -m 0644 "$here"/docs/*.md "$doc_dir/docs/"  # the README links them

config="$conf_dir/$name.toml"
if [ ! -e "$config" ]; then
  # The unit passes --name %i; the file says the same, so `reset-state --config` finds the state.
  sed "s#^name = \"example\"#name = \"$name\"#" "$here/configs/run-example.toml" >"$config.tmp"
  chmod 0640 "$config.tmp"
  mv "$config.tmp" "$config"
  model="models/qwen3-8b/config.json" # model_config of the example, relative to the config
  if [ ! -e "$conf_dir/$model" ]; then
    install -D -m 0644 "$here/configs/$model" "$conf_dir/$model"
  fi
  echo "wrote $config: check [server] args (model, --tp), then start the unit"
elif ! grep -qE "^name = \"${name//./\\.}\"" "$config"; then
  echo "install-systemd.sh: $config exists and is kept; its [run] name is not \"$name\": set it, or reset-state --config will look at another instance's state" >&2
fi

secrets="$conf_dir/$name.env"
if [ ! -e "$secrets" ]; then
  (
    umask 077 # never readable by others, not even for a moment
    cat >"$secrets" <<EOF
# Environment of sglang-supervisor@$name (EnvironmentFile=): secrets that do not belong in the
# world-readable unit or the config. Values of secret names (HF_TOKEN, ..._API_KEY) are masked
# in the supervisor's logs, state and status.
#HF_TOKEN=hf_...
EOF
  )
  chmod 0600 "$secrets"
  echo "wrote $secrets (mode 0600): HF_TOKEN=... there if the model needs it"
fi

echo "installed $unit_dir/sglang-supervisor@.service (ExecStart=$exe)"
if [ -z "$root" ]; then
  systemctl daemon-reload
  echo "start with: systemctl enable --now sglang-supervisor@$name"
fi
