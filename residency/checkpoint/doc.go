// Package checkpoint owns a session workspace's checkpoints: the Manifest
// (every directory, file and symlink with its mode, owner and mtime, each
// file as SHA-256-named chunks), taking one into a Store so that only the
// chunks the store lacks travel (Take), restoring one with every chunk
// verified into a staging directory that replaces the workspace only whole
// (Restore), and pruning old ones (Prune). ObjectStore keeps a session's
// chunks and manifests in a NATS object store bucket.
package checkpoint
