# Shared by scripts/build-kwok.sh and scripts/build-kustomize.sh (sourced, not run): build one Go
# command pinned in a tests/<tool>/go.mod into ${LLMP_CACHE:-$HOME/.cache/llm-placement}/<tool>/<version>/,
# keyed by version, so later runs reuse it.
#
#   go_tool_build TOOL MODDIR MODULE PACKAGE MINUTES [--print-path] -- CHECK...
#
# TOOL names the binary and the cache folder; MODULE is the `require` line to read the version from;
# PACKAGE what `go build` builds; MINUTES how long a second build waits for a first one's lock;
# CHECK the binary's own arguments that prove it runs (e.g. `version`). Prints the binary's path last
# on stdout; everything else goes to stderr.
go_tool_build() {
  local tool=$1 mod=$2 module=$3 package=$4 minutes=$5 print=${6:-}
  shift 6 || shift $#
  [[ "${1:-}" == "--" ]] && shift
  local version root cache start end
  version=$(awk -v m="$module" '$1 == "require" && $2 == m {print $3}' "$mod/go.mod")
  if [[ -z "$version" ]]; then
    echo "cannot read the $module version from $mod/go.mod" >&2
    return 1
  fi
  root="${LLMP_CACHE:-$HOME/.cache/llm-placement}/$tool"
  cache="$root/$version"
  if [[ "$print" == "--print-path" ]]; then
    echo "$cache/$tool"
    return 0
  fi
  if [[ -x "$cache/$tool" ]]; then
    echo "$tool $version: cached in $cache" >&2
    echo "$cache/$tool"
    return 0
  fi
  command -v go >/dev/null || {
    echo "Go is required to build $tool (go.mod wants $(awk '/^go / {print $2}' "$mod/go.mod"))" >&2
    return 1
  }
  # Never let the go command fetch a different toolchain behind our back.
  export GOTOOLCHAIN=local
  mkdir -p "$root"
  # Two builds at once (make and a pytest fixture) would both write $cache.tmp; the second waits.
  exec 9>"$root/.build-$version.lock"
  if ! flock -n 9; then
    echo "another build of $tool $version is running; waiting for it (up to $minutes min)" >&2
    flock -w $((minutes * 60)) 9 || { echo "timed out waiting for the other build" >&2; return 1; }
  fi
  if [[ -x "$cache/$tool" ]]; then
    echo "$tool $version: cached in $cache (built by the other run)" >&2
    echo "$cache/$tool"
    return 0
  fi
  rm -rf "$cache.tmp" && mkdir -p "$cache.tmp"
  start=$(date +%s)
  echo "building $tool $version with $(go version | cut -d' ' -f3) into $cache" >&2
  # The same Go settings as scripts/build-controlplane.sh (cgo as the toolchain defaults, -trimpath):
  # with tests/<tool>/go.mod pinned to the control plane's dependency versions, the packages both
  # share (client-go, apimachinery, x/net, ...) come from Go's build cache instead of compiling twice.
  (cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$cache.tmp/$tool" "$package") >&2
  "$cache.tmp/$tool" "$@" >/dev/null 2>&1
  rm -rf "$cache" && mv "$cache.tmp" "$cache"
  end=$(date +%s)
  echo "built in $((end - start)) s: $(du -sh "$cache/$tool" | cut -f1)" >&2
  echo "$cache/$tool"
}
