package schemas

import "regexp"

// Secret refusal codes.
const (
	// CodeInvalidSecretName: a secret name that is not 1-64 characters of
	// [A-Za-z0-9_-].
	CodeInvalidSecretName Code = "invalid_secret_name"
	// CodeSecretUnknown: the tenant holds no secret of that name (another
	// tenant's is unknown too: names are per tenant).
	CodeSecretUnknown Code = "secret_unknown"
	// CodeSecretTooLarge: a secret value over MaxSecretBytes.
	CodeSecretTooLarge Code = "secret_too_large"
)

// MaxSecretBytes bounds one secret's value.
const MaxSecretBytes = 64 << 10

// secretNamePattern keeps a secret name one KV key token after its
// tenant's (`<tenant>.<name>` in wf_secrets).
var secretNamePattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidSecretName reports whether name can name a secret.
func ValidSecretName(name string) bool { return secretNamePattern.MatchString(name) }

// ValidateSecretName refuses a name that cannot name a secret, naming field.
func ValidateSecretName(field, name string) error {
	if name == "" {
		return refuse(CodeMissingField, field, "required; a secret name is 1-64 characters of [A-Za-z0-9_-]")
	}
	if !ValidSecretName(name) {
		return refuse(CodeInvalidSecretName, field, "must be 1-64 characters of [A-Za-z0-9_-]")
	}
	return nil
}
