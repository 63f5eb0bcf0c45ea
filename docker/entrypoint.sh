#!/bin/sh
# Container entrypoint: runs its arguments as given (`seqrec serve ...` by default), except
#
#   entrypoint.sh once COMMAND ... --out DIR ...
#
# which runs COMMAND only when DIR/current does not exist yet, so a second `docker compose up`
# serves the model it already has instead of retraining. SEQREC_RETRAIN=1 runs it anyway
# (`docker compose run --rm -e SEQREC_RETRAIN=1 trainer`).
set -eu

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
