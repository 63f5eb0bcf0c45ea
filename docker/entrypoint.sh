#!/bin/sh
# Container entrypoint: runs its arguments as given (`seqrec serve ...` by default), except
#
#   entrypoint.sh once COMMAND ... --out DIR ...
#
# which runs COMMAND only when DIR/current does not exist yet, so a second `docker compose up`
# serves the model it already has instead of retraining. SEQREC_RETRAIN=1 runs it anyway
# (`docker compose run --rm -e SEQREC_RETRAIN=1 trainer`), and
#
#   entrypoint.sh keygen FILE
#
# which writes the API key the api reads (SEQREC_API_KEY_FILE=FILE): SEQREC_API_KEY when it is set, else, when
# FILE does not exist yet, a random one (32 bytes from /dev/urandom, as 64 hex digits); an existing FILE is
# kept, so every restart and every replica serves the same key. The file is the seqrec user's, mode 0600, and
# the key is never printed.
set -eu

if [ "${1:-}" = "keygen" ]; then
    file="${2:-}"
    if [ -z "$file" ]; then
        echo "entrypoint: 'keygen' needs the key file's path" >&2
        exit 2
    fi
    umask 077
    if [ -n "${SEQREC_API_KEY:-}" ]; then
        printf '%s' "$SEQREC_API_KEY" > "$file.tmp"
        mv "$file.tmp" "$file"
        echo "entrypoint: $file holds SEQREC_API_KEY" >&2
    elif [ -s "$file" ]; then
        echo "entrypoint: $file exists; keeping its key" >&2
    else
        od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$file.tmp"
        mv "$file.tmp" "$file"
        echo "entrypoint: wrote a new API key to $file (read it: docker compose exec api cat $file)" >&2
    fi
    exit 0
fi

if [ "${1:-}" = "once" ]; then
    shift
    out=""
    prev=""
    for arg in "$@"; do
        case "$arg" in
            --out=*) out="${arg#--out=}" ;;
            *) if [ "$prev" = "--out" ]; then out="$arg"; fi ;;
        esac
        prev="$arg"
    done
    if [ -z "$out" ]; then
        echo "entrypoint: 'once' needs the command's --out DIR" >&2
        exit 2
    fi
    if [ -e "$out/current" ] && [ "${SEQREC_RETRAIN:-0}" != "1" ]; then
        echo "entrypoint: $out/current exists; not retraining (SEQREC_RETRAIN=1 forces a new run)" >&2
        exit 0
    fi
fi

if [ "$#" -eq 0 ]; then
    echo "entrypoint: no command given" >&2
    exit 2
fi
exec "$@"
