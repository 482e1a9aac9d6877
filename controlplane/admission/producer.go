package admission

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// Producer is one configured producer: its token and its tenant.
type Producer struct {
	Token string
	// Tenant is the tenant it acts for; empty is schemas.DefaultTenant.
	Tenant string
}

// TenantOf is the producer's tenant, schemas.DefaultTenant when unset.
func (p Producer) TenantOf() string {
	if p.Tenant == "" {
		return schemas.DefaultTenant
	}
	return p.Tenant
}

// producerLogin is what the callout keeps of a producer: its token's hash
// and its tenant.
type producerLogin struct {
	hash   string
	tenant string
}

// hashSecrets checks the configured producers and operator token and keeps
// their hashes only.
func hashSecrets(producers map[string]Producer, operatorToken string) (map[string]producerLogin, string, error) {
	hashed := map[string]producerLogin{}
	for name, p := range producers {
		if !producerName(name) {
			return nil, "", fmt.Errorf("auth callout: producer name %q must be one subject token (no dots, slashes, @, spaces or wildcards) and not %q", name, bus.OperatorUser)
		}
		if len(p.Token) < 16 {
			return nil, "", fmt.Errorf("auth callout: producer %q: its token is shorter than 16 characters; use `openssl rand -base64 32`", name)
		}
		if err := schemas.ValidateTenant("tenant", p.TenantOf()); err != nil {
			return nil, "", fmt.Errorf("auth callout: producer %q: %w", name, err)
		}
		hashed[name] = producerLogin{hash: schemas.TokenHash(p.Token), tenant: p.TenantOf()}
	}
	var operator string
	if operatorToken != "" {
		if len(operatorToken) < 16 {
			return nil, "", errors.New("auth callout: the operator token is shorter than 16 characters; use `openssl rand -base64 32`")
		}
		operator = schemas.TokenHash(operatorToken)
	}
	return hashed, operator, nil
}

// producerName reports whether name may name a producer: it becomes part
// of the producer's permission subjects, and a slash marks an agent's log
// login, an @ its artifact login.
func producerName(name string) bool {
	return bus.SubjectToken(name) && !bus.IsNodeLogUser(name) && !bus.IsArtifactUser(name) && name != bus.OperatorUser
}

// authorizeOperator admits the operator token, as user "operator" or with
// no user; ok is false when the login is not the operator's to decide.
func (a *Callout) authorizeOperator(user, h string) (g grant, ok bool, err error) {
	if user != bus.OperatorUser && user != "" {
		return grant{}, false, nil
	}
	if a.operator != "" && subtle.ConstantTimeCompare([]byte(h), []byte(a.operator)) == 1 {
		return grant{kind: "operator", name: bus.OperatorUser}, true, nil
	}
	if user == bus.OperatorUser {
		return grant{}, true, &Refusal{User: user, Reason: "not the operator token set with `warmfleet serve --operator-token-file`"}
	}
	return grant{}, false, nil
}

// authorizeProducer admits a configured producer with its token; ok is
// false when user names no producer.
func (a *Callout) authorizeProducer(user, h string) (g grant, ok bool, err error) {
	want, ok := a.producers[user]
	if !ok {
		return grant{}, false, nil
	}
	if subtle.ConstantTimeCompare([]byte(h), []byte(want.hash)) == 1 {
		p := bus.PermsProducer(user, want.tenant)
		return grant{kind: "producer", name: user, perms: &p}, true, nil
	}
	return grant{}, true, &Refusal{User: user, Reason: "not this producer's token (set with `warmfleet serve --producer-tokens-file`)"}
}

// ParseProducerTokens reads `<name> <token> [<tenant>]` lines (blank lines
// and lines starting with # are skipped), as in the file given to
// `warmfleet serve --producer-tokens-file`; a line without a tenant is the
// default tenant's producer. No error echoes a token.
func ParseProducerTokens(text string) (map[string]Producer, error) {
	out := map[string]Producer{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 && len(f) != 3 {
			return nil, fmt.Errorf("producer tokens: line %d: want `<name> <token> [<tenant>]`", i+1)
		}
		if !producerName(f[0]) {
			return nil, fmt.Errorf("producer tokens: line %d: a producer name must be one subject token (no dots, slashes, @, wildcards or spaces) and not %q", i+1, bus.OperatorUser)
		}
		if _, dup := out[f[0]]; dup {
			return nil, fmt.Errorf("producer tokens: line %d: producer %q is listed twice", i+1, f[0])
		}
		p := Producer{Token: f[1], Tenant: schemas.DefaultTenant}
		if len(f) == 3 {
			if err := schemas.ValidateTenant("tenant", f[2]); err != nil {
				return nil, fmt.Errorf("producer tokens: line %d: producer %q: %w", i+1, f[0], err)
			}
			p.Tenant = f[2]
		}
		out[f[0]] = p
	}
	return out, nil
}

// ProducerNames lists the configured producers, sorted (for logs).
func ProducerNames(m map[string]Producer) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ProducerTenants is the set of tenants a control plane serves with these
// producers: schemas.DefaultTenant and every producer's tenant, sorted
// (controlplane.Config.Tenants).
func ProducerTenants(m map[string]Producer) []string {
	seen := map[string]bool{schemas.DefaultTenant: true}
	for _, p := range m {
		seen[p.TenantOf()] = true
	}
	out := make([]string, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}
