package residency

import (
	"fmt"

	"github.com/warmfleet/warmfleet/bus"
)

// Key names one session: tenant id + session id.
type Key struct {
	Tenant  string `json:"tenant"`
	Session string `json:"session"`
}

// String is the session's key in wf_leases and wf_residency.
func (k Key) String() string { return bus.ResidencyKey(k.Tenant, k.Session) }

// InboxSubject is where producers publish the session's work.
func (k Key) InboxSubject() string { return bus.SessionInbox(k.Tenant, k.Session) }

// maxTokenLen bounds an id so subjects, KV keys, consumer names and
// directory names built from it stay short.
const maxTokenLen = 64

// Validate checks that both ids are usable as a subject token, a KV key
// part, a consumer name part and a directory name: 1–64 of [A-Za-z0-9_-].
func (k Key) Validate() error {
	if err := validToken("tenant", k.Tenant); err != nil {
		return err
	}
	return validToken("session", k.Session)
}

func validToken(field, s string) error {
	if s == "" {
		return fmt.Errorf("%w: %s id is empty", ErrInvalidRequest, field)
	}
	if len(s) > maxTokenLen {
		return fmt.Errorf("%w: %s id is longer than %d", ErrInvalidRequest, field, maxTokenLen)
	}
	for _, c := range s {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
		if !ok {
			return fmt.Errorf("%w: %s id %q has %q; allowed are letters, digits, '-' and '_'", ErrInvalidRequest, field, s, c)
		}
	}
	return nil
}
