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

// hashSecrets checks the configured producers and operator token and keeps
// their hashes only.
func hashSecrets(producers map[string]string, operatorToken string) (map[string]string, string, error) {
	hashed := map[string]string{}
	for name, tok := range producers {
		if !producerName(name) {
			return nil, "", fmt.Errorf("auth callout: producer name %q must be one subject token (no dots, slashes, @, spaces or wildcards) and not %q", name, bus.OperatorUser)
		}
		if len(tok) < 16 {
			return nil, "", fmt.Errorf("auth callout: producer %q: its token is shorter than 16 characters; use `openssl rand -base64 32`", name)
		}
		hashed[name] = schemas.TokenHash(tok)
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
	if subtle.ConstantTimeCompare([]byte(h), []byte(want)) == 1 {
		p := bus.PermsProducer(user)
		return grant{kind: "producer", name: user, perms: &p}, true, nil
	}
	return grant{}, true, &Refusal{User: user, Reason: "not this producer's token (set with `warmfleet serve --producer-tokens-file`)"}
}

// ParseProducerTokens reads `name token` lines (blank lines and lines
// starting with # are skipped), as in the file given to
// `warmfleet serve --producer-tokens-file`.
func ParseProducerTokens(text string) (map[string]string, error) {
	out := map[string]string{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("producer tokens: line %d: want `<name> <token>`", i+1)
		}
		if !producerName(f[0]) {
			return nil, fmt.Errorf("producer tokens: line %d: a producer name must be one subject token (no dots, slashes, @, wildcards or spaces) and not %q", i+1, bus.OperatorUser)
		}
		if _, dup := out[f[0]]; dup {
			return nil, fmt.Errorf("producer tokens: line %d: producer %q is listed twice", i+1, f[0])
		}
		out[f[0]] = f[1]
	}
	return out, nil
}

// ProducerNames lists the configured producers, sorted (for logs).
func ProducerNames(m map[string]string) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
