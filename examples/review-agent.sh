#!/bin/sh
# An agent that is not a Go program: it claims "review" jobs as $AGENT over
# the couchq CLI, reviews each (here: a text with "TODO" in it is rejected)
# and completes or fails it, until there is nothing left to review.
#
#   COUCHDB_URL=http://127.0.0.1:5984 AGENT=alice sh examples/review-agent.sh
#
# couchq claim prints one job per line: id, type, lease end, payload
# (tab-separated). A restarted agent gets the jobs it still holds first.
# Exit status 3 from complete/fail means the job is no longer ours (its
# lease ran out and it went back to the queue): skip it.
set -eu
AGENT=${AGENT:-editor}
COUCHQ=${COUCHQ:-couchq}
tab=$(printf '\t')

while :; do
	jobs=$("$COUCHQ" claim --type review --as "$AGENT" --count 5 --lease 10m)
	[ -n "$jobs" ] || break
	printf '%s\n' "$jobs" | while IFS="$tab" read -r id _type _until payload; do
		case "$payload" in
		*TODO*) verdict=fail ;;
		*) verdict=complete ;;
		esac
		status=0
		if [ "$verdict" = fail ]; then
			"$COUCHQ" fail "$id" --as "$AGENT" --error "the text still has TODOs" --no-retry || status=$?
		else
			"$COUCHQ" complete "$id" --as "$AGENT" --result '{"approved":true}' || status=$?
		fi
		case $status in
		0 | 3) ;;
		*) exit "$status" ;;
		esac
	done
done
