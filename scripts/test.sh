#!/usr/bin/env bash
# The project's test command: installs PostgreSQL's server binaries where they
# are missing, checks formatting and vet, and runs every test with -race. The
# tests start their own throwaway PostgreSQL (or use $DATABASE_URL).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z "${DATABASE_URL:-}" && -z "${PG_BIN:-}" ]] && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null && ! command -v initdb >/dev/null; then
  echo "PostgreSQL server binaries not found; installing the postgresql package" >&2
  if [[ $(id -u) -eq 0 ]]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >/dev/null
fi

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [[ -n "$unformatted" ]]; then
  echo "gofmt needed on:" >&2
  echo "$unformatted" >&2
  exit 1
fi
go vet ./...
go test -race -count=1 "$@" ./...
