# couchq: `make demo` runs the demo, `make test` runs every test with -race.
# Tests need a CouchDB-compatible server: COUCHDB_URL, else a local Apache CouchDB release
# (COUCHQ_COUCHDB_HOME, else /opt/couchdb: a single node, plus a 3-node cluster for the cluster
# tier), else couchdb:3 in Docker, else PouchDB Server from tools/pouchdb-server (Node.js
# required). The first line of `make test` says which and why. See internal/couchtest.

POUCHDB_DIR := tools/pouchdb-server
# Same stamp, same format (sha256 of package-lock.json) as internal/localserver.EnsureInstalled.
POUCHDB_STAMP := $(POUCHDB_DIR)/node_modules/.couchq-lock.sha256
SHA256 := $(shell command -v sha256sum >/dev/null 2>&1 && echo sha256sum || echo 'shasum -a 256')

.PHONY: setup test test-cluster test-sites demo vet lint chaos bench screenshot

setup:
	@want=$$($(SHA256) < $(POUCHDB_DIR)/package-lock.json | cut -d' ' -f1); \
	if [ -x $(POUCHDB_DIR)/node_modules/.bin/pouchdb-server ] && [ "$$(cat $(POUCHDB_STAMP) 2>/dev/null)" = "$$want" ]; then \
		echo "PouchDB Server is installed"; \
	else \
		echo "Installing PouchDB Server (npm ci in $(POUCHDB_DIR))"; \
		(cd $(POUCHDB_DIR) && npm ci --no-audit --no-fund) && echo "$$want" > $(POUCHDB_STAMP); \
	fi
	go mod download
	@# The dashboard's browser test (opshttp) drives a headless Chromium; it skips, saying
	@# so, without one. Installed here when apt-get can and we are root.
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
		command -v google-chrome >/dev/null 2>&1 || command -v google-chrome-stable >/dev/null 2>&1; then \
		echo "A Chromium is installed (for the dashboard's browser test)"; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "Installing chromium (apt-get) for the dashboard's browser test"; \
		apt-get install -y chromium >/dev/null || (apt-get update >/dev/null && apt-get install -y chromium >/dev/null) || \
			echo "Could not install chromium: the dashboard's browser test will skip"; \
	else \
		echo "No Chromium, and no apt-get as root to install one: the dashboard's browser test will skip"; \
	fi

# The integration tests run on their own after the rest: their timing-sensitive
# tests (rate limits, wake-up) failed when the bench's tests, which start
# servers of their own, ran beside them on a 2-core machine.
test: setup
	@go run ./internal/couchtest/whichserver
	go test -race -count=1 -timeout 30m $$(go list ./... | grep -v '/integration$$')
	go test -race -count=1 -timeout 40m ./integration/

# The cluster tier alone: the tests that run on the 3-node cluster started from the local
# Apache CouchDB release (skipped, with the reason, without one).
test-cluster: setup
	@go run ./internal/couchtest/whichserver
	go test -race -count=1 -timeout 30m -v -run 'Cluster' ./integration/

# The sites tier alone: several sites (single nodes started from the local Apache CouchDB
# release, the 3-node cluster, a PouchDB Server producer) linked by replication into one queue
# (skipped, with the reason, without a release).
test-sites: setup
	@go run ./internal/couchtest/whichserver
	go test -race -count=1 -timeout 30m -v -run 'Sites' ./integration/ ./cmd/couchq/

demo: setup
	go run ./cmd/couchq demo

vet:
	go vet ./...

# gofmt, go vet and staticcheck (pinned as a tool in go.mod).
lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	go vet ./...
	go tool staticcheck ./...

# The chaos test at size: workers killed at random and the server restarted
# while jobs run (CI runs it small inside `make test`).
CHAOS_JOBS ?= 5000
CHAOS_WORKERS ?= 6
CHAOS_DURATION ?= 3m
chaos: setup
	COUCHQ_CHAOS_JOBS=$(CHAOS_JOBS) COUCHQ_CHAOS_WORKERS=$(CHAOS_WORKERS) COUCHQ_CHAOS_DURATION=$(CHAOS_DURATION) \
		go test -count=1 -v -timeout 60m -run 'TestProcesses/Chaos' ./integration/

# The benchmark: one run measuring every local server available in turn (a single Apache
# CouchDB node and a 3-node cluster from the local release, PouchDB Server), one table per
# server, which it then writes into docs/performance.md (and the README's summary). With
# COUCHDB_URL set it refuses to start: a single server's tables are not the docs' (run
# `go run ./cmd/couchq-bench` for that). See docs/performance.md and -h.
bench: setup
	go run ./cmd/couchq-bench --write-docs .

# The README's picture of the dashboard: the browser test, its screenshot kept.
screenshot: setup
	COUCHQ_SCREENSHOT=$(CURDIR)/docs/dashboard.png go test -count=1 -run 'TestDashboardInABrowser' ./opshttp/
