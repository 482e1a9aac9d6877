// Package secrets is the sealed secret store: the key file and its keyring
// (keyring.go, keyfile.go: NaCl secretbox, the first key seals, every key
// opens, read again when the file changes), tenants' secrets sealed in
// wf_secrets by CAS (store.go), their re-sealing under a new key
// (rotate.go), and the per-tenant set, list and rm services and the
// operators' rotate-key (service.go). A value is never logged, never in an
// error or a reply, and at rest only sealed.
package secrets
