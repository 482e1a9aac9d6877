package residency

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

// FuzzSessionRequestDecode is the control plane's path for an operator's
// wf.admin.session.* request: a body either fails to decode or names a key
// that is one safe token in subjects, KV keys and consumer names.
func FuzzSessionRequestDecode(f *testing.F) {
	f.Add([]byte(`{"tenant":"acme","session":"s-1","mode":"create","actor":"ops"}`))
	f.Add([]byte(`{"tenant":"a.b","session":"*"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var req schemas.SessionRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return
		}
		key := KeyOf(req.Key())
		err := key.Validate()
		if err != nil {
			if !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("refusal %v does not match ErrInvalidRequest", err)
			}
			return
		}
		for _, s := range []string{req.Tenant, req.Session} {
			if s == "" || strings.ContainsAny(s, ". *>\t\r\n/\\") {
				t.Fatalf("valid key part %q is not one subject token", s)
			}
		}
		if got := strings.Count(key.InboxSubject(), "."); got != 4 {
			t.Fatalf("inbox subject %q has %d dots, want 4", key.InboxSubject(), got)
		}
	})
}

// FuzzWireErrorDecode is the agent's path for a reply from the control
// plane's residency service: whatever error a reply carries keeps its code
// across ToWire, and a known code still matches its sentinel.
func FuzzWireErrorDecode(f *testing.F) {
	f.Add([]byte(`{"error":{"code":"stale_epoch","message":"epoch 3 < 4"}}`))
	f.Add([]byte(`{"error":{"code":"attach_failed","step":"launch","unreleased":["lease"]}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var rep struct {
			Error *schemas.SessionError `json:"error"`
		}
		if err := json.Unmarshal(body, &rep); err != nil || rep.Error == nil {
			return
		}
		err := ErrorFromWire(rep.Error)
		if err == nil {
			t.Fatal("a carried error decoded to nil")
		}
		_ = err.Error()
		if s := sentinelOf(rep.Error.Code); s != nil && !errors.Is(err, s) {
			t.Fatalf("code %q does not match its sentinel %v", rep.Error.Code, s)
		}
		if back := ToWire(err); back.Code != rep.Error.Code {
			t.Fatalf("code %q became %q across ToWire", rep.Error.Code, back.Code)
		}
	})
}
