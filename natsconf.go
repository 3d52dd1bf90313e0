// Package ctxpipe holds what belongs to the repository as a whole rather
// than to one package: the nats-server configuration.
package ctxpipe

import _ "embed"

// NATSConf is the repository's nats.conf, compiled in. `nats-server -c
// nats.conf` reads the file; the service's embedded server (cmd/consumer
// without --nats-url) starts from this copy of it, so both have exactly the
// same accounts, users and permissions. It lives in the root package
// because go:embed reads only files below the embedding package's
// directory, and the file belongs at the root, where operators look for it.
//
//go:embed nats.conf
var NATSConf string
