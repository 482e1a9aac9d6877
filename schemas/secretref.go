package schemas

import (
	"bytes"
	"fmt"
	"path"
	"strconv"
	"strings"
)

// Secret reference and delivery refusal codes (the secret name codes are
// in secret.go).
const (
	// CodeInvalidSecretPath: a secret file path that is not an absolute,
	// clean path inside the container, is "/", lies under /proc, /sys or
	// /dev, or is taken by another mount of the Run.
	CodeInvalidSecretPath Code = "invalid_secret_path"
	// CodeInvalidSecretMode: a secret file mode with bits beyond 0777
	// (setuid, setgid, sticky or file type bits).
	CodeInvalidSecretMode Code = "invalid_secret_mode"
	// CodeSecretUnavailable: a node could not get a Run's secret values at
	// launch (refused or unanswered); the Run fails without its workload.
	CodeSecretUnavailable Code = "secret_unavailable"
)

// Limits on a Run's secret references and on one delivery of their values.
const (
	// MaxSecretRefs bounds secret_env and secret_files together.
	MaxSecretRefs = 32
	// MaxSecretValuesBytes bounds every value of one delivery together:
	// the answer travels in one core NATS message (max_payload 1 MiB).
	MaxSecretValuesBytes = 768 << 10
	// DefaultSecretFileMode is a secret file's mode when the reference
	// names none: readable by the workload's owner only.
	DefaultSecretFileMode = 0o400
)

// SecretEnvRef sets the workload's environment variable Name to the value
// of the tenant's secret Secret, at launch. Only the reference is stored.
type SecretEnvRef struct {
	Name   string `json:"name"`
	Secret string `json:"secret"`
}

// SecretFileRef puts the value of the tenant's secret Secret at Path in the
// container, read-only, with Mode (the permission bits, a number, e.g. 256
// for 0400; DefaultSecretFileMode when 0). Only the reference is stored.
type SecretFileRef struct {
	Secret string `json:"secret"`
	Path   string `json:"path"`
	Mode   uint32 `json:"mode,omitempty"`
}

// FileMode is the file's mode, DefaultSecretFileMode when none was named.
func (f SecretFileRef) FileMode() uint32 {
	if f.Mode == 0 {
		return DefaultSecretFileMode
	}
	return f.Mode
}

// secretPathsForbidden are the container's kernel filesystems: a secret
// mounted there would shadow what the runtime mounts.
var secretPathsForbidden = []string{"/proc", "/sys", "/dev"}

// validateSecretRefs checks a RunRequest's secret references; taken holds
// the paths its caches and artifacts already took.
func (r *RunRequest) validateSecretRefs(taken map[string]bool) error {
	if n := len(r.SecretEnv) + len(r.SecretFiles); n > MaxSecretRefs {
		field := "secret_files"
		if len(r.SecretEnv) > MaxSecretRefs {
			field = "secret_env"
		}
		return refuse(CodeTooManyItems, field, "%d secret references; at most %d in secret_env and secret_files together", n, MaxSecretRefs)
	}
	names := make(map[string]bool, len(r.SecretEnv))
	for i, e := range r.SecretEnv {
		field := "secret_env[" + strconv.Itoa(i) + "]"
		switch {
		case e.Name == "":
			return refuse(CodeMissingField, field+".name", "required; the environment variable the secret is given as")
		case !envNamePattern.MatchString(e.Name) || len(e.Name) > 256:
			return refuse(CodeInvalidEnv, field+".name", "variable names match [A-Za-z_][A-Za-z0-9_]*, at most 256 bytes")
		case strings.HasPrefix(e.Name, "WARMFLEET_"):
			return refuse(CodeInvalidEnv, field+".name", "variables WARMFLEET_* are the node's (the Run's and node's ids); name the variable otherwise")
		case names[e.Name]:
			return refuse(CodeInvalidEnv, field+".name", "variable %s is set by another secret_env entry; set each once", e.Name)
		}
		if _, ok := r.Env[e.Name]; ok {
			return refuse(CodeInvalidEnv, field+".name", "variable %s is also in env; set it in one place", e.Name)
		}
		names[e.Name] = true
		if err := ValidateSecretName(field+".secret", e.Secret); err != nil {
			return err
		}
	}
	paths := make(map[string]bool, len(r.SecretFiles))
	for i, f := range r.SecretFiles {
		field := "secret_files[" + strconv.Itoa(i) + "]"
		if err := ValidateSecretName(field+".secret", f.Secret); err != nil {
			return err
		}
		if err := validateSecretPath(field+".path", f.Path); err != nil {
			return err
		}
		if paths[f.Path] || taken[f.Path] {
			return refuse(CodeInvalidSecretPath, field+".path", "another secret file or mount of this Run is at this path; give each its own")
		}
		paths[f.Path] = true
		if f.Mode&^0o777 != 0 {
			return refuse(CodeInvalidSecretMode, field+".mode", "only permission bits (at most 0777, e.g. 256 for 0400) are allowed; no setuid, setgid or sticky bit")
		}
	}
	return nil
}

// validateSecretPath refuses a secret file path that is not an absolute,
// clean path of a file inside the container.
func validateSecretPath(field, p string) error {
	switch {
	case p == "":
		return refuse(CodeMissingField, field, "required; an absolute path inside the container, e.g. /run/secrets/token")
	case !cleanText(p) || len(p) > 1024:
		return refuse(CodeInvalidSecretPath, field, "valid UTF-8 of at most 1024 bytes with no NUL")
	case !strings.HasPrefix(p, "/") || path.Clean(p) != p || p == "/":
		return refuse(CodeInvalidSecretPath, field, "must be an absolute, clean path of a file inside the container (no .., no trailing /), not /")
	}
	for _, d := range secretPathsForbidden {
		if p == d || strings.HasPrefix(p, d+"/") {
			return refuse(CodeInvalidSecretPath, field, "must not be under %s; put secret files under e.g. /run/secrets", d)
		}
	}
	return nil
}

// SecretRequest is what an agent asks on wf.node.<id>.credentials.secret
// (core request/reply, never a stream) at the launch of an attempt whose
// Run references secrets. The control plane answers only the node's
// current session (FencingToken), and only for an attempt booked on the
// node now.
type SecretRequest struct {
	Version      int    `json:"version,omitempty"`
	NodeID       string `json:"node_id"`
	FencingToken uint64 `json:"fencing_token"`
	RunID        string `json:"run_id"`
	AttemptID    string `json:"attempt_id"`
}

// Validate checks a SecretRequest.
func (r *SecretRequest) Validate() error {
	if err := validVersion(r.Version); err != nil {
		return err
	}
	if err := ValidateID("node_id", r.NodeID, CodeMissingField); err != nil {
		return err
	}
	if r.FencingToken == 0 {
		return refuse(CodeMissingField, "fencing_token", "the node's current fencing token is required")
	}
	if err := ValidateID("run_id", r.RunID, CodeInvalidRunID); err != nil {
		return err
	}
	if err := ValidateID("attempt_id", r.AttemptID, CodeMalformed); err != nil {
		return err
	}
	return CheckNodeSizes("", r)
}

// SecretValues is the control plane's answer to a SecretRequest (in a
// Reply's OK): the values of the Run's references, in their order. It
// travels only by core request/reply and is held by the agent in memory
// for the workload's life: never written to a stream, KV, journal, event
// or log. Its String and GoString name no value.
type SecretValues struct {
	Env   []SecretEnvValue  `json:"env,omitempty"`
	Files []SecretFileValue `json:"files,omitempty"`
}

// SecretEnvValue is one environment variable's value.
type SecretEnvValue struct {
	Name  string `json:"name"`
	Value []byte `json:"value"`
}

// String names the variable, never its value.
func (e SecretEnvValue) String() string {
	return fmt.Sprintf("secret env %s (%d bytes)", e.Name, len(e.Value))
}

// GoString keeps %#v from printing the value.
func (e SecretEnvValue) GoString() string { return "schemas.SecretEnvValue{" + e.String() + "}" }

// SecretFileValue is one secret file: its path in the container, mode and
// contents.
type SecretFileValue struct {
	Path  string `json:"path"`
	Mode  uint32 `json:"mode"`
	Value []byte `json:"value"`
}

// String names the file, never its contents.
func (f SecretFileValue) String() string {
	return fmt.Sprintf("secret file %s mode %#o (%d bytes)", f.Path, f.Mode, len(f.Value))
}

// GoString keeps %#v from printing the contents.
func (f SecretFileValue) GoString() string { return "schemas.SecretFileValue{" + f.String() + "}" }

// Validate bounds a SecretValues as an agent receives it: at most
// MaxSecretRefs entries, each value at most MaxSecretBytes, all of them
// at most MaxSecretValuesBytes, names, paths and modes as a RunRequest's.
// A refusal names the field, never a value.
func (v *SecretValues) Validate() error {
	if n := len(v.Env) + len(v.Files); n > MaxSecretRefs {
		return refuse(CodeTooManyItems, "", "%d secret values; at most %d", n, MaxSecretRefs)
	}
	for i, e := range v.Env {
		field := "env[" + strconv.Itoa(i) + "]"
		if !envNamePattern.MatchString(e.Name) || len(e.Name) > 256 {
			return refuse(CodeInvalidEnv, field+".name", "variable names match [A-Za-z_][A-Za-z0-9_]*, at most 256 bytes")
		}
		if len(e.Value) > MaxSecretBytes {
			return refuse(CodeSecretTooLarge, field+".value", "%d bytes; the limit is %d", len(e.Value), MaxSecretBytes)
		}
		if bytes.IndexByte(e.Value, 0) >= 0 {
			return refuse(CodeInvalidEnv, field+".value", "an environment variable's value cannot hold a NUL byte; deliver this secret as a file")
		}
	}
	for i, f := range v.Files {
		field := "files[" + strconv.Itoa(i) + "]"
		if err := validateSecretPath(field+".path", f.Path); err != nil {
			return err
		}
		if f.Mode == 0 || f.Mode&^0o777 != 0 {
			return refuse(CodeInvalidSecretMode, field+".mode", "permission bits between 1 and 0777")
		}
		if len(f.Value) > MaxSecretBytes {
			return refuse(CodeSecretTooLarge, field+".value", "%d bytes; the limit is %d", len(f.Value), MaxSecretBytes)
		}
	}
	if total := v.Size(); total > MaxSecretValuesBytes {
		return refuse(CodeSecretTooLarge, "", "the values total %d bytes; one delivery is at most %d", total, MaxSecretValuesBytes)
	}
	return nil
}

// Size is the bytes of every value together.
func (v SecretValues) Size() int {
	n := 0
	for _, e := range v.Env {
		n += len(e.Value)
	}
	for _, f := range v.Files {
		n += len(f.Value)
	}
	return n
}

// String counts the values, never shows one.
func (v SecretValues) String() string {
	return fmt.Sprintf("%d secret env values and %d secret files (%d bytes)", len(v.Env), len(v.Files), v.Size())
}

// GoString keeps %#v from printing values too.
func (v SecretValues) GoString() string { return "schemas.SecretValues{" + v.String() + "}" }
