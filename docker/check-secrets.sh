#!/bin/sh
# Start-up check of every container of the stack: refuses to start on an empty, default or
# weak secret, then runs the container's own entrypoint ("$@").
#
#   check-secrets.sh /entrypoint airflow scheduler
#
# The secrets checked are the variables named in CHECK_SECRETS (space-separated; the compose
# file sets it per service). A secret must be at least 16 characters and not one of the
# placeholders this project or its examples ever shipped; AIRFLOW_FERNET_KEY must be a Fernet
# key (44 characters of url-safe base64). The value itself is never printed.
set -eu

weak='change-me change-me-too changeme admin airflow postgres password secret temporal'
failed=0
for name in ${CHECK_SECRETS:-}; do
    eval "value=\${$name:-}"
    reason=''
    if [ -z "$value" ]; then
        reason='is empty or unset'
    else
        for bad in $weak; do
            if [ "$value" = "$bad" ]; then reason='is a default placeholder'; fi
        done
        if [ -z "$reason" ] && [ "$name" = AIRFLOW_FERNET_KEY ]; then
            if ! printf '%s' "$value" | grep -Eq '^[A-Za-z0-9_-]{43}=$'; then
                reason='is not a Fernet key (44 characters of url-safe base64)'
            fi
        elif [ -z "$reason" ] && [ "${#value}" -lt 16 ]; then
            reason='is shorter than 16 characters'
        fi
    fi
    if [ -n "$reason" ]; then
        echo "refusing to start: $name $reason (run docker/generate-env.sh, see docker/README.md)" >&2
        failed=1
    fi
done
if [ "$failed" -ne 0 ]; then
    exit 78
fi
if [ "$#" -eq 0 ]; then
    exit 0
fi
exec "$@"
