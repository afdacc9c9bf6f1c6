# couchq: `make demo` runs the demo, `make test` runs every test with -race.
# Tests need a CouchDB-compatible server: COUCHDB_URL, else couchdb:3 in Docker, else PouchDB Server
# from tools/pouchdb-server (Node.js required). See internal/couchtest.

POUCHDB_DIR := tools/pouchdb-server
# Same stamp, same format (sha256 of package-lock.json) as internal/localserver.EnsureInstalled.
POUCHDB_STAMP := $(POUCHDB_DIR)/node_modules/.couchq-lock.sha256
SHA256 := $(shell command -v sha256sum >/dev/null 2>&1 && echo sha256sum || echo 'shasum -a 256')

.PHONY: setup test demo vet

setup:
	@want=$$($(SHA256) < $(POUCHDB_DIR)/package-lock.json | cut -d' ' -f1); \
	if [ -x $(POUCHDB_DIR)/node_modules/.bin/pouchdb-server ] && [ "$$(cat $(POUCHDB_STAMP) 2>/dev/null)" = "$$want" ]; then \
		echo "PouchDB Server is installed"; \
	else \
		echo "Installing PouchDB Server (npm ci in $(POUCHDB_DIR))"; \
		(cd $(POUCHDB_DIR) && npm ci --no-audit --no-fund) && echo "$$want" > $(POUCHDB_STAMP); \
	fi
	go mod download

test: setup
	go test -race -count=1 ./...

demo: setup
	go run ./cmd/couchq demo

vet:
	go vet ./...
