#!/bin/sh
# Watch the engine: slots, KV use and throughput, refreshed every second.
#   examples/monitor.sh
mnt=${MNT:-/mnt/atlas}
exec watch -n 1 "cat $mnt/ctl/slots; echo; cat $mnt/ctl/kv; echo; grep -E '^atlas_(generated|prompt)_tokens_total' $mnt/ctl/metrics"
