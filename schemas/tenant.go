package schemas

import "regexp"

// DefaultTenant is the tenant of a fleet configured with none, and of every
// producer listed without one: `make run`'s user never names a tenant.
const DefaultTenant = "default"

// Tenancy refusal codes.
const (
	// CodeInvalidTenant: a tenant name that is not 1-32 characters of
	// [a-z0-9-] starting with a letter or digit.
	CodeInvalidTenant Code = "invalid_tenant"
	// CodeTenantUnknown: a tenant this control plane has not configured.
	CodeTenantUnknown Code = "tenant_unknown"
)

// tenantPattern keeps a tenant name one subject token, one stream-name
// suffix and one KV key token.
var tenantPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// ValidTenant reports whether name can name a tenant.
func ValidTenant(name string) bool { return tenantPattern.MatchString(name) }

// ValidateTenant refuses a tenant name that cannot name a tenant, naming
// field.
func ValidateTenant(field, name string) error {
	if name == "" {
		return refuse(CodeMissingField, field, "required; a tenant is 1-32 characters of [a-z0-9-] (the fleet's own is %q)", DefaultTenant)
	}
	if !ValidTenant(name) {
		return refuse(CodeInvalidTenant, field, "must be 1-32 characters of [a-z0-9-], starting with a letter or digit")
	}
	return nil
}
