package schemas

import (
	"fmt"
	"regexp"
	"time"

	"github.com/warmfleet/warmfleet/bus/codec"
)

// The sealed secret store's wire types: what wf_secrets holds and what the
// per-tenant secret services (wf.tenant.<t>.secret.set|list|rm) and the
// operators' wf.admin.secret.rotate-key take and answer. No reply carries a
// value; only SecretSetRequest does, and its String hides it.

// MaxSecretsPerTenant bounds how many secrets one tenant holds.
const MaxSecretsPerTenant = 1000

// MaxSealedSecretBytes bounds a sealed value: a secretbox of a
// MaxSecretBytes value, its nonce, tag and the context it is bound to.
const MaxSealedSecretBytes = MaxSecretBytes + 512

// CodeTooManySecrets: the tenant already holds MaxSecretsPerTenant secrets.
const CodeTooManySecrets Code = "too_many_secrets"

// keyIDPattern is a key id of the secrets key file: one token of a line.
var keyIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// ValidSecretKeyID reports whether id can name a key of the key file.
func ValidSecretKeyID(id string) bool { return keyIDPattern.MatchString(id) }

// SecretKey is the wf_secrets key of tenant's secret name.
func SecretKey(tenant, name string) string { return tenant + "." + name }

// SealedSecret is one secret at rest in wf_secrets: its value sealed
// (nonce || secretbox) under the key KeyID names, bound to tenant and name.
type SealedSecret struct {
	Tenant    string    `json:"tenant"`
	Name      string    `json:"name"`
	KeyID     string    `json:"key_id"`
	Sealed    []byte    `json:"sealed"`
	Size      int       `json:"size"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Validate checks a stored record's shape (never its seal: that takes the
// key).
func (s *SealedSecret) Validate() error {
	if err := ValidateTenant("tenant", s.Tenant); err != nil {
		return err
	}
	if err := ValidateSecretName("name", s.Name); err != nil {
		return err
	}
	if !ValidSecretKeyID(s.KeyID) {
		return refuse(CodeMalformed, "key_id", "a key id is 1-64 characters of [A-Za-z0-9_.-]")
	}
	if len(s.Sealed) == 0 || len(s.Sealed) > MaxSealedSecretBytes {
		return refuse(CodeMalformed, "sealed", "a sealed value is 1-%d bytes", MaxSealedSecretBytes)
	}
	if s.Size < 1 || s.Size > MaxSecretBytes {
		return refuse(CodeMalformed, "size", "a secret is 1-%d bytes", MaxSecretBytes)
	}
	return nil
}

// MaxSealedRecordBytes bounds a stored record before it is decoded: the
// sealed value in base64 and the rest.
const MaxSealedRecordBytes = MaxSealedSecretBytes*4/3 + 1024

// DecodeSealedSecret reads a wf_secrets value strictly (JSON, no unknown
// field, within MaxSealedRecordBytes) and checks its shape.
func DecodeSealedSecret(data []byte) (SealedSecret, error) {
	var s SealedSecret
	if len(data) > MaxSealedRecordBytes {
		return s, refuse(CodePayloadTooLarge, "", "a stored secret is at most %d bytes; this one is %d", MaxSealedRecordBytes, len(data))
	}
	if err := codec.Decode(codec.JSON, data, &s); err != nil {
		return SealedSecret{}, err
	}
	if err := s.Validate(); err != nil {
		return SealedSecret{}, err
	}
	return s, nil
}

// Info is the record without its sealed value.
func (s *SealedSecret) Info() SecretInfo {
	return SecretInfo{Tenant: s.Tenant, Name: s.Name, KeyID: s.KeyID, Size: s.Size, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt}
}

// SecretInfo describes a stored secret, never its value: what set and rm
// answer and list lists.
type SecretInfo struct {
	Tenant    string    `json:"tenant"`
	Name      string    `json:"name"`
	KeyID     string    `json:"key_id"`
	Size      int       `json:"size"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// SecretSetRequest seals Value as the secret Name of the tenant the
// request's subject names (wf.tenant.<t>.secret.set), replacing any
// value it had. Value is kept byte for byte.
type SecretSetRequest struct {
	Version int    `json:"version,omitempty"`
	Name    string `json:"name"`
	Value   []byte `json:"value"`
}

// Validate checks the name and the value's size, never echoing the value.
func (r *SecretSetRequest) Validate() error {
	if err := validVersion(r.Version); err != nil {
		return err
	}
	if err := ValidateSecretName("name", r.Name); err != nil {
		return err
	}
	if len(r.Value) == 0 {
		return refuse(CodeMissingField, "value", "required; a secret is 1-%d bytes", MaxSecretBytes)
	}
	if len(r.Value) > MaxSecretBytes {
		return refuse(CodeSecretTooLarge, "value", "a secret is at most %d bytes; this one is %d (put a larger file in an artifact)", MaxSecretBytes, len(r.Value))
	}
	return nil
}

// String hides the value: a request is never printed with it.
func (r SecretSetRequest) String() string {
	return fmt.Sprintf("SecretSetRequest{name=%q value=<%d bytes redacted>}", r.Name, len(r.Value))
}

// GoString hides the value under %#v too.
func (r SecretSetRequest) GoString() string { return r.String() }

// SecretListRequest lists the tenant's secrets (an empty body is one).
type SecretListRequest struct {
	Version int `json:"version,omitempty"`
}

// Validate checks the version.
func (r *SecretListRequest) Validate() error { return validVersion(r.Version) }

// SecretListReply is a tenant's secrets by name, never their values.
type SecretListReply struct {
	Tenant  string       `json:"tenant"`
	Secrets []SecretInfo `json:"secrets"`
}

// SecretRemoveRequest removes the tenant's secret Name.
type SecretRemoveRequest struct {
	Version int    `json:"version,omitempty"`
	Name    string `json:"name"`
}

// Validate checks the version and name.
func (r *SecretRemoveRequest) Validate() error {
	if err := validVersion(r.Version); err != nil {
		return err
	}
	return ValidateSecretName("name", r.Name)
}

// RotateKeyRequest asks for every secret to be re-sealed under the key
// file's first key (an empty body is one).
type RotateKeyRequest struct {
	Version int `json:"version,omitempty"`
}

// Validate checks the version.
func (r *RotateKeyRequest) Validate() error { return validVersion(r.Version) }

// MaxRotateFailures bounds the secrets a RotateKeyReply names.
const MaxRotateFailures = 32

// RotateKeyReply counts what a rotation did: Resealed now under KeyID,
// Current already were, Failed could not be opened with any key of the
// file (their keys, by `<tenant>.<name>`, in FailedSecrets, at most
// MaxRotateFailures) and stay as they were.
type RotateKeyReply struct {
	KeyID         string   `json:"key_id"`
	Resealed      int      `json:"resealed"`
	Current       int      `json:"current"`
	Failed        int      `json:"failed"`
	FailedSecrets []string `json:"failed_secrets,omitempty"`
}
