# couchq: one static binary in an image with nothing else in it.
#
#   docker build -t couchq .        (or: buildah bud -t couchq .)
#   docker run --rm -e COUCHDB_URL=http://couch:5984 -e COUCHDB_USER=couchq \
#     -e COUCHDB_PASSWORD_FILE=/run/secrets/couchq -v ./deploy:/etc/couchq:ro \
#     couchq worker --config /etc/couchq/workers.toml --type email
#
# Configured by environment (COUCHDB_URL, COUCHDB_USER, COUCHDB_PASSWORD_FILE,
# COUCHQ_DB) and the worker config file; see deploy/ and the README.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# CGO off: a static binary that runs on an empty image; -trimpath and no
# symbol table keep it small and free of build paths.
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/usr/local/bin/couchq ./cmd/couchq \
 && mkdir -p /out/etc/ssl/certs \
 && echo 'couchq:x:65532:65532:couchq:/:/sbin/nologin' > /out/etc/passwd \
 && echo 'couchq:x:65532:' > /out/etc/group \
 && cp /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/

# The image: the binary, a user to run it as, and CA certificates for
# https:// CouchDB URLs (--ca-file adds a private CA). Nothing else.
# (deploy/deploy_test.go builds this stage from a "build" context it
# prepares itself, since these machines reach no image registry.)
FROM scratch
COPY --from=build /out/ /
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/couchq"]
CMD ["help"]
