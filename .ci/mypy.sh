#!/usr/bin/env bash
# mypy on the pure cores, with imports resolved as installed (rocketray.<package>).
# setuptools' editable finder is invisible to mypy, so this builds the installed layout from symlinks
# in a temporary directory and checks the modules by their real names. Other modules are followed
# for their types but only the listed ones must be clean. Usage: .ci/mypy.sh  (exit code = mypy's)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/rocketray"
ln -s "$root"/rocketray/*.py "$tree/rocketray/"
for package in actors broker chaos cli client controller ha sim snapshot spark_on_ray verify wire; do
    if [ -d "$root/$package" ]; then ln -s "$root/$package" "$tree/rocketray/$package"; fi
done
MODULES=(
    rocketray.wire.controller_api rocketray.wire.controller_codes rocketray.wire.controller_headers
    rocketray.wire.ha_protocol rocketray.wire.message rocketray.wire.batch rocketray.wire.pull_result
    rocketray.wire.put_result rocketray.wire.delayed rocketray.wire.offset_records
    rocketray.controller.config rocketray.controller.decide
    rocketray.controller.election rocketray.controller.events rocketray.controller.heartbeat
    rocketray.controller.state rocketray.controller.session rocketray.controller.topics rocketray.controller.consumers
    rocketray.controller.limits rocketray.controller.leadership rocketray.controller.notify
    rocketray.controller.raft_wire rocketray.controller.raft_pickle rocketray.controller.raft_admission
    rocketray.ha.session rocketray.ha.truncation rocketray.ha.sync_state
    rocketray.snapshot.format
    rocketray.scram rocketray.scram_keys rocketray.acl rocketray.controller.auth_table rocketray.controller.users
    rocketray.broker.role rocketray.broker.role_io rocketray.broker.offsets
    rocketray.client.core rocketray.client.types rocketray.client.errors rocketray.client.metrics rocketray.client.metrics_series rocketray.client.metrics_export rocketray.client.retry rocketray.client.filters rocketray.broker.tag_filter
    rocketray.broker.schedule rocketray.broker.client_access rocketray.client.outgoing rocketray.client.consumer_commits rocketray.client.committer
    rocketray.ha.ack rocketray.ha.master rocketray.ha.standalone
    rocketray.sim.world rocketray.sim.net rocketray.sim.disk
    rocketray.verify.netfaults rocketray.verify.filefaults rocketray.verify.damage_model rocketray.verify.soak rocketray.broker.queue_check
    rocketray.verify.group_actions rocketray.verify.group_action_rules
    rocketray.ha.put_gate rocketray.ha.promotion_hold rocketray.ha.put_shell rocketray.ha.switch_steps
)
args=()
for m in "${MODULES[@]}"; do args+=(-m "$m"); done
cd "$tree"
python -m mypy --config-file "$root/pyproject.toml" --follow-imports=silent --cache-dir=/dev/null "${args[@]}"
