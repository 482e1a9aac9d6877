package schemas

import (
	"fmt"
	"strings"
)

// DockerHubRegistry is the registry of a reference whose name has no host
// ("busybox", "library/busybox"), and the canonical name of Docker Hub's
// other spellings (CanonicalRegistry).
const DockerHubRegistry = "docker.io"

// Registry is the registry host of the reference's repository, as the
// reference grammar reads it: the first path component when it looks like
// a host (holds a dot or a port, or is "localhost"), else Docker Hub.
func (r ImageRef) Registry() string {
	first, _, ok := strings.Cut(r.Name, "/")
	if !ok || (!strings.ContainsAny(first, ".:") && first != "localhost") {
		return DockerHubRegistry
	}
	return CanonicalRegistry(first)
}

// CanonicalRegistry folds the spellings of one registry into one host:
// scheme and path dropped ("https://index.docker.io/v1/" is Docker Hub's key
// in a Docker config.json), lower case, and Docker Hub's API and index
// hosts to DockerHubRegistry. Credentials are keyed by it.
func CanonicalRegistry(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.Index(s, "://"); i >= 0 {
		s = s[i+3:]
	}
	if i := strings.IndexByte(s, '/'); i >= 0 {
		s = s[:i]
	}
	s = strings.ToLower(s)
	switch s {
	case "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com":
		return DockerHubRegistry
	}
	return s
}

// RegistryCredentialRequest is what an agent asks on
// wf.node.<id>.credentials.registry (core request/reply, never a stream)
// when its runtime must authenticate to pull Reference. The control plane
// answers only the node's current session (FencingToken) and only for an
// image the node has a live booking or prefetch for.
type RegistryCredentialRequest struct {
	Version      int    `json:"version,omitempty"`
	NodeID       string `json:"node_id"`
	FencingToken uint64 `json:"fencing_token"`
	// Reference is the image being pulled, name@sha256:<hex>; the
	// credential is for its registry (ImageRef.Registry).
	Reference string `json:"reference"`
	// RunID, when the pull is for a Run's attempt, names that Run, so a
	// replica whose cache has not seen the booking yet can read it.
	RunID string `json:"run_id,omitempty"`
}

// Validate checks a RegistryCredentialRequest.
func (r *RegistryCredentialRequest) Validate() error {
	if r.Version < 0 || r.Version > SchemaVersion {
		return refuse(CodeUnsupportedVersion, "version", "version %d is not supported; this control plane speaks %d", r.Version, SchemaVersion)
	}
	if err := ValidateID("node_id", r.NodeID, CodeMissingField); err != nil {
		return err
	}
	if r.FencingToken == 0 {
		return refuse(CodeMissingField, "fencing_token", "the node's current fencing token is required")
	}
	if r.RunID != "" {
		if err := ValidateID("run_id", r.RunID, CodeInvalidRunID); err != nil {
			return err
		}
	}
	if _, err := ParseImageRef("reference", r.Reference); err != nil {
		return err
	}
	return CheckNodeSizes("", r)
}

// RegistryCredential is what the control plane answers a
// RegistryCredentialRequest with (in a Reply's OK). It travels only by core
// request/reply and is held by the agent for one pull: it is never written
// to a stream, KV, journal, event or log. Anonymous says the control plane
// holds nothing for Registry and the pull goes without credentials.
// Otherwise Secret is a password for Username, or, with Username empty, an
// identity (refresh) token exchanged for a registry token.
type RegistryCredential struct {
	Registry  string `json:"registry"`
	Anonymous bool   `json:"anonymous,omitempty"`
	Username  string `json:"username,omitempty"`
	Secret    string `json:"secret,omitempty"`
}

// String names the registry and the kind of credential, never its secret,
// so a credential printed by mistake leaks nothing.
func (c RegistryCredential) String() string {
	switch {
	case c.Anonymous:
		return fmt.Sprintf("anonymous for %s", c.Registry)
	case c.Username == "":
		return fmt.Sprintf("identity token for %s", c.Registry)
	}
	return fmt.Sprintf("password of %s for %s", c.Username, c.Registry)
}

// GoString keeps %#v from printing the secret too.
func (c RegistryCredential) GoString() string {
	return "schemas.RegistryCredential{" + c.String() + "}"
}
